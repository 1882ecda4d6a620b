package state_test

import (
	"fmt"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/machina-metal/machina/state"
)

// firmwareReading is a BIOS reading the size of a real one: attrs
// registry attributes (an iDRAC 9's registry has about 600), each with its
// value in effect, and two storage controllers.
func firmwareReading(attrs int) *state.Firmware {
	b := &state.FirmwareBIOS{Pending: map[string]any{"BootMode": "Uefi"}, RegistryID: "BiosAttributeRegistry.v1_0_0", ApplyTimes: []string{"OnReset"}}
	vals := map[string]any{}
	for i := range attrs {
		name := fmt.Sprintf("Attribute%04d", i)
		b.Registry = append(b.Registry, state.BIOSAttribute{Name: name, Type: "Enumeration", Values: []string{"Enabled", "Disabled"}, ResetRequired: true})
		vals[name] = "Enabled"
	}
	b.Attributes = state.NewBIOSValues(vals)
	return &state.Firmware{BIOS: b, Storage: []state.StorageController{{ID: "RAID.Integrated.1-1", Drives: []state.StorageDrive{{ID: "Disk.Bay.0", CapacityBytes: 960 << 30}}}}}
}

// TestFirmwareCloneSharesBIOSReading checks what Firmware.Clone shares
// and what it copies: the BIOS reading's registry and value maps are
// shared (read-only once stored, replaced whole by the next reading), the
// rest is copied, so a caller editing its copy's storage or apply times
// does not change the stored record.
func TestFirmwareCloneSharesBIOSReading(t *testing.T) {
	f := firmwareReading(3)
	c := f.Clone()
	if c.BIOS == f.BIOS {
		t.Fatal("BIOS struct shared; want a copy")
	}
	if &c.BIOS.Registry[0] != &f.BIOS.Registry[0] {
		t.Error("registry copied; want it shared")
	}
	if shared, n := state.SharedChunks(f.BIOS.Attributes, c.BIOS.Attributes); shared != n ||
		reflect.ValueOf(c.BIOS.Pending).UnsafePointer() != reflect.ValueOf(f.BIOS.Pending).UnsafePointer() {
		t.Errorf("attribute values copied (%d of %d chunks shared); want them shared", shared, n)
	}
	c.BIOS.ApplyTimes[0] = "Immediate"
	c.Storage[0].Drives[0].CapacityBytes = 1
	if f.BIOS.ApplyTimes[0] != "OnReset" || f.Storage[0].Drives[0].CapacityBytes != 960<<30 {
		t.Errorf("editing the copy changed the original: applyTimes %v, drive %d bytes", f.BIOS.ApplyTimes, f.Storage[0].Drives[0].CapacityBytes)
	}
}

// TestSnapshotKeepsFirmwareReading checks that a record's BIOS reading
// reaches a snapshot whole, and that a new reading stored later replaces
// it there without changing an earlier snapshot's copy.
func TestSnapshotKeepsFirmwareReading(t *testing.T) {
	s := openTest(t, state.Options{NoSync: true})
	mustCreate(t, s, state.Server{Name: "fw1", Lifecycle: state.LifecycleReady})
	if _, err := s.UpdateServer("fw1", func(srv *state.Server) error { srv.Firmware = firmwareReading(40); return nil }); err != nil {
		t.Fatal(err)
	}
	before, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateServer("fw1", func(srv *state.Server) error { srv.Firmware = firmwareReading(2); return nil }); err != nil {
		t.Fatal(err)
	}
	after, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if got := len(before.Servers["fw1"].Firmware.BIOS.Registry); got != 40 {
		t.Errorf("earlier snapshot's registry: %d attributes, want 40", got)
	}
	if got := before.Servers["fw1"].Firmware.BIOS.Attributes.Len(); got != 40 {
		t.Errorf("earlier snapshot's attributes: %d, want 40", got)
	}
	if got := len(after.Servers["fw1"].Firmware.BIOS.Registry); got != 2 {
		t.Errorf("new snapshot's registry: %d attributes, want 2", got)
	}
}

// BenchmarkSnapshotFirmware measures a planning pass's snapshot of 1,000
// servers that each carry a BIOS reading of 600 registry attributes (an
// iDRAC 9's size): B/op is what each pass allocates for the records.
func BenchmarkSnapshotFirmware(b *testing.B) {
	s := openTest(b, state.Options{NoSync: true})
	for i := range 1000 {
		name := fmt.Sprintf("fw%04d", i)
		mustCreate(b, s, state.Server{Name: name, Lifecycle: state.LifecycleReady})
		if _, err := s.UpdateServer(name, func(srv *state.Server) error { srv.Firmware = firmwareReading(600); return nil }); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := s.Snapshot(); err != nil { // fill the decode cache
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Snapshot(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDecodeCacheSharesEqualRegistries checks that servers whose BIOS
// readings carry equal attribute registries (one server model) hold one
// copy of it once decoded, through the writer's path and through a cold
// decode (a store opened again), and that a server with another registry
// keeps its own.
func TestDecodeCacheSharesEqualRegistries(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := state.Open(path, state.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, attrs := range []int{50, 50, 49} {
		name := fmt.Sprintf("m%d", i)
		mustCreate(t, s, state.Server{Name: name, Lifecycle: state.LifecycleReady})
		if _, err := s.UpdateServer(name, func(srv *state.Server) error { srv.Firmware = firmwareReading(attrs); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string, s *state.Store) {
		t.Helper()
		snap, err := s.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		reg := func(name string) []state.BIOSAttribute { return snap.Servers[name].Firmware.BIOS.Registry }
		if &reg("m0")[0] != &reg("m1")[0] {
			t.Errorf("%s: m0 and m1 have equal registries but hold two copies", when)
		}
		if len(reg("m2")) != 49 || &reg("m2")[0] == &reg("m0")[0] {
			t.Errorf("%s: m2's registry (49 attributes) shared with m0's (50)", when)
		}
		if got := reg("m1")[49].Name; got != "Attribute0049" {
			t.Errorf("%s: m1's last attribute %q", when, got)
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
