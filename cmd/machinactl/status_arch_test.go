package main

import "testing"

// TestParseStatusServerSMBIOSArch: the strict status decoder reads
// hardware.smbiosArch from the status file the controller's writer renders
// (gitops' golden r1-n01.yaml, which carries arch and smbiosArch amd64) and
// from one whose quoted "386" kernel arch sits on amd64 firmware: the
// observed record then has the machine arch the plan uses (amd64, no
// conflict). A non-string smbiosArch is refused.
func TestParseStatusServerSMBIOSArch(t *testing.T) {
	s := parseStatusGolden(t)
	if s.Hardware == nil || s.Hardware.Arch != "amd64" || s.Hardware.SMBIOSArch != "amd64" {
		t.Errorf("golden r1-n01 hardware = %+v, want arch and smbiosArch amd64", s.Hardware)
	}

	s, err := parseStatusServer([]byte("name: a\nlifecycle: ready\nhardware:\n  arch: \"386\"\n  smbiosArch: amd64\n  cores: 4\n"), fixedNow)
	if err != nil {
		t.Fatal(err)
	}
	if h := s.Hardware; h.Arch != "386" || h.SMBIOSArch != "amd64" || h.MachineArch() != "amd64" || h.ArchConflict() {
		t.Errorf("hardware = %+v (machine %q, conflict %v), want arch 386 on smbiosArch amd64: machine amd64, no conflict", h, h.MachineArch(), h.ArchConflict())
	}

	if _, err := parseStatusServer([]byte("name: a\nlifecycle: ready\nhardware:\n  smbiosArch: [amd64]\n"), fixedNow); err == nil {
		t.Error("smbiosArch as a list parsed without error")
	}
}
