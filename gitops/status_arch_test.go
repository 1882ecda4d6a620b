package gitops

import (
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/state"
)

// TestStatusHardwareSMBIOSArch: the firmware's SMBIOS arch goes from the
// store's record (state.Hardware.SMBIOSArch) to hardware.smbiosArch of
// status/servers/NAME.yaml, right after the kernel's hardware.arch (a
// numeric-looking GOARCH such as 386 quoted, so it stays a string); a
// record without it renders no smbiosArch line, and a server whose only
// hardware fact is the SMBIOS arch still gets its hardware block.
func TestStatusHardwareSMBIOSArch(t *testing.T) {
	hw := statusHardware(&state.Hardware{Cores: 8, MemoryBytes: 16 << 30, Arch: "386", SMBIOSArch: "amd64"})
	if hw.Arch != "386" || hw.SMBIOSArch != "amd64" {
		t.Fatalf("statusHardware = %+v, want Arch 386, SMBIOSArch amd64", hw)
	}
	got := string(renderServer(ServerStatus{Name: "r1-n01", Lifecycle: "ready", Hardware: hw}, 10))
	if !strings.Contains(got, "\n  arch: \"386\"\n  smbiosArch: amd64\n") {
		t.Errorf("rendered status lacks arch \"386\" then smbiosArch amd64:\n%s", got)
	}
	var v map[string]any
	if err := yamlUnmarshal([]byte(got), &v); err != nil {
		t.Fatalf("rendered status does not parse: %v\n%s", err, got)
	}
	if h := v["hardware"].(map[string]any); h["arch"] != "386" || h["smbiosArch"] != "amd64" {
		t.Errorf("parsed hardware = %v, want arch \"386\" and smbiosArch amd64 as strings", h)
	}

	old := string(renderServer(ServerStatus{Name: "r1-n01", Lifecycle: "ready", Hardware: statusHardware(&state.Hardware{Cores: 8, Arch: "amd64"})}, 10))
	if strings.Contains(old, "smbiosArch") {
		t.Errorf("record without SMBIOSArch rendered a smbiosArch line:\n%s", old)
	}
	only := string(renderServer(ServerStatus{Name: "r1-n01", Lifecycle: "ready", Hardware: Hardware{SMBIOSArch: "arm64"}}, 10))
	if !strings.Contains(only, "hardware:\n  smbiosArch: arm64\n") {
		t.Errorf("hardware with only smbiosArch not rendered:\n%s", only)
	}
}

// TestStatusBMCQuirks: the boot-override quirks learned from a server's
// BMC (state.BMCFacts.Quirks) are in its status file as bmcQuirks, sorted,
// and what its session negotiated as bmcSecurity; none, no key.
func TestStatusBMCQuirks(t *testing.T) {
	b := StatusBuilder{since: map[string]time.Time{}}
	ss := b.serverStatus(&state.Server{Name: "r1-n01", Lifecycle: state.LifecycleDeployed,
		BMC: state.BMCFacts{Driver: "ipmi", Quirks: []string{"bootModeIgnored", "bootFlagsNotPersistent"},
			Security: "cipher suite 3 (RAKP-HMAC-SHA1, HMAC-SHA1-96, AES-CBC-128)"}}, nil, time.Unix(0, 0), map[string]bool{})
	got := string(renderServer(ss, 10))
	for _, want := range []string{"bmcQuirks:\n- bootFlagsNotPersistent\n- bootModeIgnored\n", `bmcSecurity: "cipher suite 3 (RAKP-HMAC-SHA1, HMAC-SHA1-96, AES-CBC-128)"`} {
		if !strings.Contains(got, want) {
			t.Errorf("status lacks %q:\n%s", want, got)
		}
	}
	if got := string(renderServer(ServerStatus{Name: "r1-n02"}, 10)); strings.Contains(got, "bmcQuirks") {
		t.Errorf("no quirks, but:\n%s", got)
	}
}
