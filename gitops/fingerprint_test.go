package gitops

import (
	"math"
	"reflect"
	"testing"
	"time"
)

// TestFingerprintCoversServerStatus: every leaf of a fully populated
// ServerStatus (each string, number, bool and time of every struct,
// slice element, pointer target and map value, found by reflection, so a
// field added later is covered too) changes the fingerprint when it
// changes; a deep copy, a copy whose map was filled in another order and
// a time in another location at the same instant and zone keep it; nil
// and empty slices differ (they are not reflect.DeepEqual). A ServerStatus
// field of a kind the fingerprint does not encode fails here, before the
// render cache would silently stop reusing files.
func TestFingerprintCoversServerStatus(t *testing.T) {
	var fp fingerprinter
	sv := bigSnapshot(1, "deployed").Servers[0]
	fill(t, reflect.ValueOf(&sv).Elem(), "ServerStatus")
	sv.Firmware.ReadAt = time.Now() // with a monotonic clock reading
	base, ok := fp.sum(&sv)
	if !ok {
		t.Fatal("a populated ServerStatus has no fingerprint: it holds a kind the fingerprint does not encode")
	}

	cp := deepCopy(sv)
	if got, _ := fp.sum(&cp); got != base {
		t.Fatal("a deep copy has another fingerprint")
	}
	cp.Hardware.Labels = map[string]string{}
	keys := reflect.ValueOf(sv.Hardware.Labels).MapKeys()
	for i := len(keys) - 1; i >= 0; i-- {
		cp.Hardware.Labels[keys[i].String()] = sv.Hardware.Labels[keys[i].String()]
	}
	if got, _ := fp.sum(&cp); got != base {
		t.Fatal("the same labels inserted in another order give another fingerprint")
	}
	cp = deepCopy(sv)
	cp.Firmware.ReadAt = sv.Firmware.ReadAt.Round(0) // monotonic reading dropped: renders the same
	if got, _ := fp.sum(&cp); got != base {
		t.Fatal("dropping a time's monotonic reading changed the fingerprint")
	}
	cp.Firmware.ReadAt = sv.Firmware.ReadAt.In(time.FixedZone("X", 3600))
	if got, _ := fp.sum(&cp); got == base {
		t.Fatal("the same instant in another zone (rendered differently) kept the fingerprint")
	}
	cp = deepCopy(sv)
	cp.Firmware.ReadAt = time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC) // past UnixNano's range
	far, _ := fp.sum(&cp)
	// 2^64 ns later: the same UnixNano once it wraps, another instant.
	cp.Firmware.ReadAt = cp.Firmware.ReadAt.Add(math.MaxInt64).Add(math.MaxInt64).Add(2)
	if got, _ := fp.sum(&cp); got == far {
		t.Fatal("two times 2^64 ns apart share a fingerprint")
	}
	cp = deepCopy(sv)
	cp.Addresses = nil
	nilSum, _ := fp.sum(&cp)
	cp.Addresses = []AddressStatus{}
	if emptySum, _ := fp.sum(&cp); emptySum == nilSum {
		t.Fatal("a nil and an empty slice share a fingerprint (they are not DeepEqual)")
	}

	leaves := 0
	forEachLeaf(reflect.ValueOf(&sv).Elem(), "ServerStatus", func(path string, set func(bool)) {
		leaves++
		set(true)
		got, ok := fp.sum(&sv)
		set(false)
		if !ok || got == base {
			t.Errorf("changing %s kept the fingerprint (ok %v)", path, ok)
		}
		if back, _ := fp.sum(&sv); back != base {
			t.Fatalf("restoring %s did not restore the fingerprint", path)
		}
	})
	if leaves < 40 {
		t.Fatalf("walked %d leaves of a populated ServerStatus; want its every field (40 or more)", leaves)
	}

	type odd struct{ F func() }
	if _, ok := fp.sum(&odd{}); ok {
		t.Fatal("a value holding a func got a fingerprint")
	}
	type intKeys struct{ M map[int]string }
	if _, ok := fp.sum(&intKeys{M: map[int]string{1: "a"}}); ok {
		t.Fatal("a map with int keys got a fingerprint")
	}
}

// fill makes every nil pointer, empty slice and empty map under v hold
// one element, and every zero leaf a non-zero value, so that no field is
// left out of the leaf walk.
func fill(t *testing.T, v reflect.Value, path string) {
	t.Helper()
	if v.Type() == timeType {
		if v.Interface().(time.Time).IsZero() {
			v.Set(reflect.ValueOf(time.Date(2026, 12, 7, 16, 0, 0, 0, time.UTC)))
		}
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			fill(t, v.Field(i), path+"."+v.Type().Field(i).Name)
		}
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		fill(t, v.Elem(), path)
	case reflect.Slice:
		if v.Len() == 0 {
			v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		}
		for i := range v.Len() {
			fill(t, v.Index(i), path+"[]")
		}
	case reflect.Map:
		if v.Len() == 0 {
			m := reflect.MakeMap(v.Type())
			m.SetMapIndex(reflect.ValueOf("k1").Convert(v.Type().Key()), reflect.ValueOf("v1").Convert(v.Type().Elem()))
			m.SetMapIndex(reflect.ValueOf("k2").Convert(v.Type().Key()), reflect.ValueOf("v2").Convert(v.Type().Elem()))
			v.Set(m)
		}
	case reflect.String:
		if v.String() == "" {
			v.SetString("x")
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if v.Int() == 0 {
			v.SetInt(7)
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if v.Uint() == 0 {
			v.SetUint(7)
		}
	case reflect.Float32, reflect.Float64:
		if v.Float() == 0 {
			v.SetFloat(7.5)
		}
	case reflect.Bool:
		v.SetBool(true)
	default:
		t.Fatalf("%s is a %s: the fingerprint does not encode it", path, v.Kind())
	}
}

// forEachLeaf calls visit for each leaf under v (strings, numbers, bools,
// times, map values) with a set that changes the leaf (true) and puts its
// value back (false).
func forEachLeaf(v reflect.Value, path string, visit func(string, func(bool))) {
	if v.Type() == timeType {
		old := v.Interface().(time.Time)
		visit(path, func(on bool) {
			if on {
				v.Set(reflect.ValueOf(old.Add(time.Nanosecond)))
			} else {
				v.Set(reflect.ValueOf(old))
			}
		})
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			forEachLeaf(v.Field(i), path+"."+v.Type().Field(i).Name, visit)
		}
	case reflect.Pointer:
		forEachLeaf(v.Elem(), path, visit)
	case reflect.Slice:
		for i := range v.Len() {
			forEachLeaf(v.Index(i), path+"[]", visit)
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			old := v.MapIndex(k)
			visit(path+"["+k.String()+"]", func(on bool) {
				if on {
					v.SetMapIndex(k, reflect.ValueOf(old.String()+"!").Convert(old.Type()))
				} else {
					v.SetMapIndex(k, old)
				}
			})
		}
	default:
		old := reflect.New(v.Type()).Elem()
		old.Set(v)
		visit(path, func(on bool) {
			if !on {
				v.Set(old)
				return
			}
			switch v.Kind() {
			case reflect.String:
				v.SetString(old.String() + "!")
			case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
				v.SetInt(old.Int() + 1)
			case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
				v.SetUint(old.Uint() + 1)
			case reflect.Float32, reflect.Float64:
				v.SetFloat(old.Float() + 1)
			case reflect.Bool:
				v.SetBool(!old.Bool())
			}
		})
	}
}

// deepCopy returns a copy of sv that shares no slice, map or pointer
// with it.
func deepCopy(sv ServerStatus) ServerStatus {
	out := reflect.New(reflect.TypeOf(sv)).Elem()
	copyInto(out, reflect.ValueOf(sv))
	return out.Interface().(ServerStatus)
}

func copyInto(dst, src reflect.Value) {
	if src.Type() == timeType {
		dst.Set(src)
		return
	}
	switch src.Kind() {
	case reflect.Struct:
		for i := range src.NumField() {
			copyInto(dst.Field(i), src.Field(i))
		}
	case reflect.Pointer:
		if !src.IsNil() {
			dst.Set(reflect.New(src.Type().Elem()))
			copyInto(dst.Elem(), src.Elem())
		}
	case reflect.Slice:
		if !src.IsNil() {
			dst.Set(reflect.MakeSlice(src.Type(), src.Len(), src.Len()))
			for i := range src.Len() {
				copyInto(dst.Index(i), src.Index(i))
			}
		}
	case reflect.Map:
		if !src.IsNil() {
			dst.Set(reflect.MakeMap(src.Type()))
			for _, k := range src.MapKeys() {
				dst.SetMapIndex(k, src.MapIndex(k))
			}
		}
	default:
		dst.Set(src)
	}
}
