package state_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/machina-metal/machina/state"
)

// legacyBIOS is FirmwareBIOS as it was stored before BIOSValues: the
// values a plain map.
type legacyBIOS struct {
	Attributes map[string]any        `json:"attributes,omitempty"`
	Pending    map[string]any        `json:"pending,omitempty"`
	RegistryID string                `json:"registryID,omitempty"`
	Registry   []state.BIOSAttribute `json:"registry,omitempty"`
	ApplyTimes []string              `json:"applyTimes,omitempty"`
}

// valueMaps are BIOS readings with every kind of value and the strings
// JSON escapes: HTML characters, U+2028, control bytes, invalid UTF-8.
func valueMaps() map[string]map[string]any {
	big := map[string]any{}
	for i := range 700 {
		big[fmt.Sprintf("Attr%03d", i)] = []any{"Enabled", int64(i), float64(i) + 0.5, i%2 == 0, nil}[i%5]
	}
	return map[string]map[string]any{
		"empty": {},
		"one":   {"BootMode": "Uefi"},
		"kinds": {"s": "Disabled", "i": int64(120), "f": 1.5, "whole float": float64(120), "b": true, "nil": nil,
			"neg zero": math.Copysign(0, -1), "huge": 1e300, "tiny": 1e-9, "max exact": float64(1<<53 - 1)},
		"escapes": {"<html>&": "a<b>&c", "line\u2028sep": "x\u2029y", "ctl": "tab\there\x01", "bad utf8": "\xff\xfe", "": "empty name", "é": "ü"},
		"700":     big,
	}
}

// TestBIOSValuesJSONAsMap checks that a reading's JSON is, byte for byte,
// what the map it was made from encoded to (so stored records, their
// digests and exports do not change), with encoding/json's HTML escaping
// on and off, and that decoding gives equal values back.
func TestBIOSValuesJSONAsMap(t *testing.T) {
	for name, m := range valueMaps() {
		t.Run(name, func(t *testing.T) {
			old := legacyBIOS{Attributes: m, RegistryID: "R"}
			cur := state.FirmwareBIOS{Attributes: state.NewBIOSValues(m), RegistryID: "R"}
			want, err := json.Marshal(old)
			if err != nil {
				t.Fatal(err)
			}
			got, err := json.Marshal(cur)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("json.Marshal = %s, want %s", got, want)
			}
			var back state.FirmwareBIOS
			if err := json.Unmarshal(got, &back); err != nil {
				t.Fatal(err)
			}
			// Decoded (and encoded again) as the map was: invalid UTF-8
			// became U+FFFD, numbers float64 (int64 when integral here).
			var oldBack legacyBIOS
			if err := json.Unmarshal(want, &oldBack); err != nil {
				t.Fatal(err)
			}
			if !back.Attributes.Equal(state.NewBIOSValues(oldBack.Attributes)) || back.Attributes.Len() != len(m) {
				t.Errorf("decoded %v, want %v", back.Attributes.Map(), oldBack.Attributes)
			}
			again, _ := json.Marshal(back)
			wantAgain, _ := json.Marshal(oldBack)
			if !bytes.Equal(again, wantAgain) {
				t.Errorf("encoded again = %s, want %s", again, wantAgain)
			}
		})
	}
}

// TestBIOSValuesUnescapedAsMap checks the encoding with HTML escaping off
// (json.Encoder.SetEscapeHTML(false)) against the map's.
func TestBIOSValuesUnescapedAsMap(t *testing.T) {
	for name, m := range valueMaps() {
		enc := func(v any) string {
			var buf bytes.Buffer
			e := json.NewEncoder(&buf)
			e.SetEscapeHTML(false)
			if err := e.Encode(v); err != nil {
				t.Fatal(err)
			}
			return buf.String()
		}
		if got, want := enc(state.FirmwareBIOS{Attributes: state.NewBIOSValues(m)}), enc(legacyBIOS{Attributes: m}); got != want {
			t.Errorf("%s: encoded %s, want %s", name, got, want)
		}
	}
}

// TestBIOSValuesLookups checks Get, Value, Len, All (sorted) and Map
// against the map a reading was made from, with every integral number an
// int64, and names absent before, between and after the present ones.
func TestBIOSValuesLookups(t *testing.T) {
	for name, m := range valueMaps() {
		v := state.NewBIOSValues(m)
		if v.Len() != len(m) || v.IsZero() != (len(m) == 0) {
			t.Errorf("%s: Len %d IsZero %v, want %d", name, v.Len(), v.IsZero(), len(m))
		}
		var names []string
		for n, val := range v.All() {
			if !sameAny(val, v.Value(n)) {
				t.Errorf("%s: All yields %q = %#v, Value %#v", name, n, val, v.Value(n))
			}
			names = append(names, n)
			want := m[n]
			if f, ok := want.(float64); ok && f == math.Trunc(f) && math.Abs(f) < 1<<53 && !math.Signbit(f) {
				want = int64(f)
			}
			got, ok := v.Get(n)
			if !ok || got != want || v.Value(n) != want {
				t.Errorf("%s: Get(%q) = %#v, %v; want %#v", name, n, got, ok, want)
			}
		}
		if !slices.IsSorted(names) || len(names) != len(m) {
			t.Errorf("%s: All yields %d names, sorted %v; want %d sorted", name, len(names), slices.IsSorted(names), len(m))
		}
		for _, absent := range []string{"\x00", "Attr0005x", "zzzz", "BootModf"} {
			if _, ok := m[absent]; ok {
				continue
			}
			if got, ok := v.Get(absent); ok || got != nil {
				t.Errorf("%s: Get(%q) = %v, %v; want absent", name, absent, got, ok)
			}
		}
		if diff := cmp.Diff(len(m), len(v.Map())); diff != "" {
			t.Errorf("%s: Map: %s", name, diff)
		}
	}
	with := state.NewBIOSValues(map[string]any{"A": "x"}).With("B", "y")
	if with.Len() != 2 || with.Value("B") != "y" {
		t.Errorf("With: %v", with.Map())
	}
}

// fleetReading is server i's BIOS reading among servers of one model: 455
// attributes (an iDRAC 9's), all equal across the fleet except the
// service tag, and the model's firmware inventory of 30 components.
func fleetReading(i int) *state.Firmware {
	vals := map[string]any{"SystemServiceTag": fmt.Sprintf("TAG%05d", i)}
	for a := range 454 {
		vals[fmt.Sprintf("Attr%03d", a)] = []any{"Enabled", int64(a), true}[a%3]
	}
	fw := &state.Firmware{BIOS: &state.FirmwareBIOS{Attributes: state.NewBIOSValues(vals), RegistryID: "BiosAttributeRegistry.v1_0_0"}}
	for c := range 30 {
		fw.Components = append(fw.Components, state.FirmwareComponent{ID: fmt.Sprintf("Installed-%d-1.8.2", c), Name: fmt.Sprintf("Component %d", c), Version: "1.8.2", Updateable: true})
	}
	return fw
}

// TestDecodeCacheSharesEqualValues checks that the store keeps one copy of
// the attribute values servers of one model share, each server holding
// only the part where its reading differs (its service tag), and one copy
// of their equal firmware inventories, through the writer's path and a
// cold decode; and that every server's values, JSON and inventory are its
// own reading's.
func TestDecodeCacheSharesEqualValues(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := state.Open(path, state.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	for i := range n {
		name := fmt.Sprintf("m%02d", i)
		mustCreate(t, s, state.Server{Name: name, Lifecycle: state.LifecycleReady})
		if _, err := s.UpdateServer(name, func(srv *state.Server) error { srv.Firmware = fleetReading(i); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string, s *state.Store) {
		t.Helper()
		snap, err := s.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		first := snap.Servers["m00"].Firmware
		for i := range n {
			fw := snap.Servers[fmt.Sprintf("m%02d", i)].Firmware
			want := fleetReading(i)
			wantJSON, _ := json.Marshal(want)
			gotJSON, _ := json.Marshal(fw)
			if !bytes.Equal(gotJSON, wantJSON) {
				t.Errorf("%s: m%02d's firmware JSON differs from its reading's", when, i)
			}
			if got := fw.BIOS.Attributes.Value("SystemServiceTag"); got != fmt.Sprintf("TAG%05d", i) {
				t.Errorf("%s: m%02d's service tag %v", when, i, got)
			}
			if i == 0 {
				continue
			}
			if shared, chunks := state.SharedChunks(first.BIOS.Attributes, fw.BIOS.Attributes); shared != chunks-1 {
				t.Errorf("%s: m%02d shares %d of its %d value chunks with m00; want all but the one with its tag", when, i, shared, chunks)
			}
			if &fw.Components[0] != &first.Components[0] {
				t.Errorf("%s: m%02d holds its own copy of an equal firmware inventory", when, i)
			}
		}
	}
	check("after the writes", s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = state.Open(path, state.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	check("decoded after reopening", s)
}

// heapInUse is the live heap after a full collection, in bytes.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkBIOSValuesHeld measures the memory 1,000 servers of one model
// keep for their BIOS values once stored (fleetReading: 455 attributes,
// one differing per server): the live heap the records add over the same
// records without firmware, per server.
func BenchmarkBIOSValuesHeld(b *testing.B) {
	for b.Loop() {
		held := func(fw func(int) *state.Firmware) float64 {
			before := heapInUse()
			s := openTest(b, state.Options{NoSync: true})
			for i := range 1000 {
				name := fmt.Sprintf("m%04d", i)
				mustCreate(b, s, state.Server{Name: name, Lifecycle: state.LifecycleReady, Firmware: fw(i)})
			}
			if _, err := s.Snapshot(); err != nil {
				b.Fatal(err)
			}
			after := heapInUse()
			runtime.KeepAlive(s)
			return float64(after) - float64(before)
		}
		none := held(func(int) *state.Firmware { return nil })
		with := held(fleetReading)
		b.ReportMetric((with-none)/1000, "B/server")
	}
}

// sameAny is == for the values a reading holds.
func sameAny(a, b any) bool { return a == b }

// BenchmarkMarshalFirmwareRecord measures encoding a server record that
// carries a BIOS reading (fleetReading), as every write of the record
// does.
func BenchmarkMarshalFirmwareRecord(b *testing.B) {
	srv := state.Server{Name: "m0001", Lifecycle: state.LifecycleReady, Firmware: fleetReading(1)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := json.Marshal(&srv); err != nil {
			b.Fatal(err)
		}
	}
}
