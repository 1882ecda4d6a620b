package gitops

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
	"reflect"
	"slices"
	"strings"
	"time"
)

// fingerprinter computes a SHA-256 over a canonical encoding of a value,
// so that the render cache can tell whether a server's status changed
// since its file was last rendered while keeping 32 bytes per server
// instead of the whole status (at 10,000 servers the kept statuses were
// one full status build, about 25 MB of live heap, which every garbage
// collection scanned).
//
// The encoding walks the value by reflection, so a field added to
// ServerStatus is covered without touching this code: every field of
// every struct in declaration order, strings and slices with their
// length first, a presence byte before what a pointer points to, a map's
// entries in key order (string keys only), and time.Time as its instant
// (seconds and nanoseconds) and its zone's name and offset (what rendering reads; a
// monotonic clock reading does not count). Two values with equal
// encodings render the same file; reflect.DeepEqual-equal values have
// equal encodings. A kind it does not encode (interface, func, chan,
// unsafe pointer, non-string map key) makes sum report false, and the
// caller renders the file again: never a wrong reuse, only a lost one
// (TestFingerprintCoversServerStatus keeps ServerStatus free of them).
//
// The zero value is ready; a fingerprinter reuses its buffer and is not
// safe for concurrent use.
type fingerprinter struct {
	buf  []byte
	keys []reflect.Value
}

var timeType = reflect.TypeFor[time.Time]()

// sum returns the fingerprint of v and true, or false when v holds a kind
// the encoding does not cover.
func (f *fingerprinter) sum(v any) ([sha256.Size]byte, bool) {
	f.buf = f.buf[:0]
	if !f.value(reflect.ValueOf(v)) {
		return [sha256.Size]byte{}, false
	}
	return sha256.Sum256(f.buf), true
}

func (f *fingerprinter) uint(u uint64) { f.buf = binary.LittleEndian.AppendUint64(f.buf, u) }

func (f *fingerprinter) str(s string) {
	f.uint(uint64(len(s)))
	f.buf = append(f.buf, s...)
}

func (f *fingerprinter) value(v reflect.Value) bool {
	if v.Type() == timeType {
		if !v.CanInterface() {
			return false
		}
		t := v.Interface().(time.Time)
		name, off := t.Zone()
		f.uint(uint64(t.Unix())) // not UnixNano: it wraps outside 1678-2262
		f.uint(uint64(t.Nanosecond()))
		f.str(name)
		f.uint(uint64(off))
		return true
	}
	switch v.Kind() {
	case reflect.Bool:
		if v.Bool() {
			f.buf = append(f.buf, 1)
		} else {
			f.buf = append(f.buf, 0)
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		f.uint(uint64(v.Int()))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		f.uint(v.Uint())
	case reflect.Float32, reflect.Float64:
		f.uint(math.Float64bits(v.Float()))
	case reflect.String:
		f.str(v.String())
	case reflect.Struct:
		for i := range v.NumField() {
			if !f.value(v.Field(i)) {
				return false
			}
		}
	case reflect.Slice, reflect.Array:
		return f.list(v)
	case reflect.Pointer:
		if v.IsNil() {
			f.buf = append(f.buf, 0)
			return true
		}
		f.buf = append(f.buf, 1)
		return f.value(v.Elem())
	case reflect.Map:
		return f.mapEntries(v)
	default:
		return false
	}
	return true
}

// list encodes a slice or an array: a nil mark for a nil slice, else
// the length and each element.
func (f *fingerprinter) list(v reflect.Value) bool {
	if v.Kind() == reflect.Slice && v.IsNil() {
		// nil and empty render alike but are not DeepEqual: keep
		// them apart so that equal fingerprints imply DeepEqual.
		f.buf = append(f.buf, 0)
		return true
	}
	f.buf = append(f.buf, 1)
	f.uint(uint64(v.Len()))
	if v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Uint8 {
		f.buf = append(f.buf, v.Bytes()...)
		return true
	}
	for i := range v.Len() {
		if !f.value(v.Index(i)) {
			return false
		}
	}
	return true
}

// mapEntries encodes a map with string keys: a nil mark, else the
// length and each key and value in key order.
func (f *fingerprinter) mapEntries(v reflect.Value) bool {
	if v.Type().Key().Kind() != reflect.String {
		return false
	}
	if v.IsNil() {
		f.buf = append(f.buf, 0)
		return true
	}
	f.buf = append(f.buf, 1)
	f.uint(uint64(v.Len()))
	start := len(f.keys)
	f.keys = append(f.keys, v.MapKeys()...)
	keys := f.keys[start:]
	defer func() {
		clear(keys)
		f.keys = f.keys[:start]
	}()
	slices.SortFunc(keys, func(a, b reflect.Value) int { return strings.Compare(a.String(), b.String()) })
	for _, k := range keys {
		f.str(k.String())
		if !f.value(v.MapIndex(k)) {
			return false
		}
	}
	return true
}
