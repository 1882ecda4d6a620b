package state_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/machina-metal/machina/state"
)

// TestMachineArchAndConflict: the kernel's arch and the firmware's SMBIOS
// arch agree, or the kernel is the 32-bit member of the firmware's 64-bit
// family (the machine is the 64-bit one, no conflict), or they conflict;
// either one alone is the machine's arch.
func TestMachineArchAndConflict(t *testing.T) {
	cases := []struct {
		kernel, smbios string
		machine        string
		conflict       bool
	}{
		{"", "", "", false},
		{"amd64", "", "amd64", false},
		{"", "arm64", "arm64", false},
		{"amd64", "amd64", "amd64", false},
		{"386", "amd64", "amd64", false},
		{"arm", "arm64", "arm64", false},
		{"arm64", "amd64", "arm64", true},
		{"amd64", "arm64", "amd64", true},
		{"amd64", "386", "amd64", true}, // a 64-bit kernel does not run on a 32-bit processor
		{"arm", "amd64", "arm", true},
		{"386", "arm64", "386", true},
		{"riscv64", "loong64", "riscv64", true},
	}
	for _, c := range cases {
		h := &state.Hardware{Arch: c.kernel, SMBIOSArch: c.smbios}
		if got := h.MachineArch(); got != c.machine {
			t.Errorf("Hardware{Arch: %q, SMBIOSArch: %q}.MachineArch() = %q, want %q", c.kernel, c.smbios, got, c.machine)
		}
		if got := h.ArchConflict(); got != c.conflict {
			t.Errorf("Hardware{Arch: %q, SMBIOSArch: %q}.ArchConflict() = %v, want %v", c.kernel, c.smbios, got, c.conflict)
		}
	}
	var nilHW *state.Hardware
	if nilHW.MachineArch() != "" || nilHW.ArchConflict() {
		t.Errorf("nil Hardware: MachineArch %q, ArchConflict %v; want \"\", false", nilHW.MachineArch(), nilHW.ArchConflict())
	}
}

// TestHardwareSMBIOSArchStored: SMBIOSArch is kept by the store (written
// with UpdateServer, read back with Server) under the JSON key smbiosArch,
// and a record written before the field decodes with it empty.
func TestHardwareSMBIOSArchStored(t *testing.T) {
	s := openTest(t, state.Options{})
	mustCreate(t, s, state.Server{Name: "x1"})
	if _, err := s.UpdateServer("x1", func(srv *state.Server) error {
		srv.Hardware = &state.Hardware{Cores: 8, Arch: "386", SMBIOSArch: "amd64"}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Server("x1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Hardware == nil || got.Hardware.Arch != "386" || got.Hardware.SMBIOSArch != "amd64" || got.Hardware.MachineArch() != "amd64" {
		t.Fatalf("stored hardware = %+v, want arch 386, smbiosArch amd64", got.Hardware)
	}
	b, err := json.Marshal(got.Hardware)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"smbiosArch":"amd64"`) {
		t.Errorf("Hardware JSON %s has no smbiosArch", b)
	}
	var old state.Hardware
	if err := json.Unmarshal([]byte(`{"cores":8,"memoryBytes":0,"observedAt":"0001-01-01T00:00:00Z","arch":"amd64"}`), &old); err != nil {
		t.Fatal(err)
	}
	if old.SMBIOSArch != "" || old.MachineArch() != "amd64" {
		t.Errorf("pre-field record: SMBIOSArch %q, MachineArch %q; want \"\", amd64", old.SMBIOSArch, old.MachineArch())
	}
}
