package dhcp

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/machina-metal/machina/boot"
)

// secureBootClients are the DHCP clients a server may run: firmware PXE
// for every architecture, UEFI HTTP boot, iPXE (either user-class form),
// and the ramdisk's plain client.
var secureBootClients = []struct {
	name string
	mods []dhcpv4.Modifier
	shim bool // the only clients that get a boot file: x64 UEFI PXE
}{
	{"plain client", nil, false},
	{"bios pxe", []dhcpv4.Modifier{withClass("PXEClient:Arch:00000:UNDI:002001"), withArch(0)}, false},
	{"pxe without option 93", []dhcpv4.Modifier{withClass("PXEClient")}, false},
	{"uefi arch 7 (OVMF)", []dhcpv4.Modifier{withClass("PXEClient:Arch:00007:UNDI:003000"), withArch(7)}, true},
	{"uefi arch 9", []dhcpv4.Modifier{withClass("PXEClient:Arch:00009:UNDI:003016"), withArch(9)}, true},
	{"arm64 uefi", []dhcpv4.Modifier{withClass("PXEClient:Arch:00011:UNDI:003000"), withArch(11)}, false},
	{"http boot x64", []dhcpv4.Modifier{withClass("HTTPClient:Arch:00016:UNDI:003000"), withArch(16)}, false},
	{"ipxe uefi", []dhcpv4.Modifier{withClass("PXEClient:Arch:00007:UNDI:003000"), withArch(7), withIPXE()}, false},
	{"ipxe rfc3004 form", []dhcpv4.Modifier{withArch(7), dhcpv4.WithUserClass("iPXE", true)}, false},
}

// isIPXEAnswer reports whether a boot file names an iPXE binary or script.
func isIPXEAnswer(file string) bool {
	for _, s := range []string{"ipxe", ".kpxe", "snponly", "/boot/"} {
		if strings.Contains(strings.ToLower(file), s) {
			return true
		}
	}
	return false
}

func TestSelectSecureBoot(t *testing.T) {
	mac := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}
	for _, c := range secureBootClients {
		t.Run(c.name, func(t *testing.T) {
			got, err := SelectSecureBoot(pxeDiscover(t, mac, c.mods...), testFiles)
			switch {
			case c.shim:
				if err != nil || got != (Boot{File: boot.ShimImageX64}) {
					t.Fatalf("SelectSecureBoot = %+v, %v; want shimx64.efi", got, err)
				}
			case c.name == "plain client":
				if err != nil || got != (Boot{}) {
					t.Fatalf("SelectSecureBoot = %+v, %v; want no boot file", got, err)
				}
			default:
				if !errors.Is(err, ErrSecureBoot) || !errors.Is(err, ErrNoBoot) || got != (Boot{}) {
					t.Fatalf("SelectSecureBoot = %+v, %v; want ErrSecureBoot and no boot file", got, err)
				}
			}
		})
	}
}

// TestSecureBootServerNeverGetsIPXE runs every kind of client of a Secure
// Boot server through the full and the proxy DHCP server: the only boot
// file it is ever offered is the signed shim, and an iPXE binary or
// script URL never, while a server without Secure Boot still gets iPXE.
func TestSecureBootServerNeverGetsIPXE(t *testing.T) {
	sbMAC := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x51}
	plainMAC := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x52}
	var look boot.MemLookup
	_ = look.Set(boot.Assignment{MAC: sbMAC, Name: "sb", Lifecycle: boot.LifecycleCommissioning, Mode: boot.ModeUEFI, SecureBoot: true})
	_ = look.Set(boot.Assignment{MAC: plainMAC, Name: "plain", Lifecycle: boot.LifecycleCommissioning, Mode: boot.ModeUEFI})
	for _, mode := range []Mode{ModeFull, ModeProxy} {
		s := newUnitServer(t, mode, &look, false)
		for _, c := range secureBootClients {
			r, _ := exchange(t, s, pxeDiscover(t, sbMAC, c.mods...))
			var file string
			if r != nil {
				file = r.BootFileName
				if f := r.Options.Get(dhcpv4.OptionBootfileName); f != nil {
					file += " " + string(f)
				}
			}
			if isIPXEAnswer(file) {
				t.Errorf("mode %v, %s: secure boot server offered %q", mode, c.name, file)
			}
			if c.shim && (r == nil || r.BootFileName != boot.ShimImageX64) {
				t.Errorf("mode %v, %s: reply %v, want boot file %s", mode, c.name, r, boot.ShimImageX64)
			}
			if !c.shim && strings.TrimSpace(file) != "" {
				t.Errorf("mode %v, %s: boot file %q, want none", mode, c.name, file)
			}
		}
		// The same client of a server without Secure Boot gets iPXE.
		r, _ := exchange(t, s, pxeDiscover(t, plainMAC, withClass("PXEClient:Arch:00007:UNDI:003000"), withArch(7)))
		if r == nil || r.BootFileName != "snponly.efi" {
			t.Errorf("mode %v: plain UEFI server got %v, want snponly.efi", mode, r)
		}
	}
}
