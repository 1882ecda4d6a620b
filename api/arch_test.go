package api

import (
	"testing"

	"github.com/machina-metal/machina/state"
)

// TestHardwareFromSMBIOSArch: the report's cpu.smbiosArch reaches the
// store's hardware record next to the kernel's arch, and the admin API's
// server (toServer) carries it as hardware.smbiosArch; a report without
// it leaves both empty.
func TestHardwareFromSMBIOSArch(t *testing.T) {
	r := schemaTestReport()
	r.Facts.CPU.Arch, r.Facts.CPU.SMBIOSArch = "386", "amd64"
	hw := hardwareFrom(r.Facts)
	if hw.Arch != "386" || hw.SMBIOSArch != "amd64" {
		t.Fatalf("hardwareFrom: Arch %q, SMBIOSArch %q; want 386, amd64", hw.Arch, hw.SMBIOSArch)
	}
	if got := toServer(state.Server{Name: "x1", Hardware: hw}).Hardware; got == nil || got.Arch != "386" || got.SMBIOSArch != "amd64" {
		t.Fatalf("toServer hardware = %+v, want arch 386, smbiosArch amd64", got)
	}
	old := hardwareFrom(schemaTestReport().Facts)
	api := toServer(state.Server{Name: "x1", Hardware: old}).Hardware
	if old.SMBIOSArch != "" || api.SMBIOSArch != "" {
		t.Errorf("report without smbiosArch: store %q, API %q; want both empty", old.SMBIOSArch, api.SMBIOSArch)
	}
}
