package reconciler

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// noPXEDriver is a BMC whose boot override offers no Pxe target (Redfish
// BootSourceOverrideTarget@Redfish.AllowableValues without "Pxe", as the VM
// lab's Dell tree copy): SetBootOverride(PXE) is ErrUnsupported. It records
// the virtual-media image and the boot overrides it was given.
type noPXEDriver struct {
	recordingDriver
	media     []string
	overrides []bmc.BootOverride
}

func (d *noPXEDriver) SetBootOverride(_ context.Context, o bmc.BootOverride) error {
	if o.Device == bmc.BootPXE {
		return bmc.ErrUnsupported
	}
	d.overrides = append(d.overrides, o)
	return nil
}

func (d *noPXEDriver) InsertMedia(_ context.Context, url string) error {
	d.media = append(d.media, url)
	return nil
}

// TestNetbootISOByBootMode: a server without a PXE boot override boots the
// iPXE ISO of its boot mode from virtual media: the UEFI ISO for a uefi
// server, the BIOS ISO for a bios one. Before this check every server got the
// BIOS ISO, which UEFI-only firmware cannot boot.
func TestNetbootISOByBootMode(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const bios, uefi = "http://ctl/boot/iso/machina-ipxe-bios.iso", "http://ctl/boot/iso/machina-ipxe-uefi.iso"
	c, err := New(Config{Store: st, Drivers: &gatedDrivers{}, ISOURL: bios, UEFIISOURL: uefi})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	for _, tc := range []struct {
		mode bmc.BootMode
		want string
	}{{bmc.BootModeUEFI, uefi}, {bmc.BootModeLegacy, bios}, {bmc.BootModeUnset, bios}} {
		d := &noPXEDriver{}
		if err := c.machine(d, state.Server{Name: "iso-test"}, tc.mode, false, log).Netboot(context.Background()); err != nil {
			t.Fatalf("netboot(%q): %v", tc.mode, err)
		}
		if len(d.media) != 1 || d.media[0] != tc.want {
			t.Errorf("netboot(%q) inserted %q, want [%s]", tc.mode, d.media, tc.want)
		}
		if len(d.overrides) != 1 || d.overrides[0].Device != bmc.BootCD || d.overrides[0].Mode != tc.mode {
			t.Errorf("netboot(%q) overrides %+v, want one CD override in mode %q", tc.mode, d.overrides, tc.mode)
		}
		if a := d.actions(); len(a) != 1 || a[0] != bmc.PowerActionOn {
			t.Errorf("netboot(%q) power %v, want [On]", tc.mode, a)
		}
	}
	// No UEFI ISO configured: a UEFI server is not handed the BIOS ISO.
	c.cfg.UEFIISOURL = ""
	d := &noPXEDriver{}
	if err := c.machine(d, state.Server{Name: "iso-test"}, bmc.BootModeUEFI, false, log).Netboot(context.Background()); err == nil || len(d.media) != 0 {
		t.Errorf("netboot(uefi) without a UEFI ISO: err %v, media %q; want the ErrUnsupported error and no media", err, d.media)
	}
}

// TestNetbootISOSecureBoot: a server whose profile sets firmware.secureBoot:
// true boots the Secure Boot ISO (shim and Debian's signed GRUB) from
// virtual media, in UEFI mode, and never an iPXE ISO: firmware with Secure
// Boot on refuses Debian's unsigned iPXE. Without a Secure Boot ISO
// configured it gets no ISO at all. A profile with secureBoot false or no
// firmware block keeps the iPXE ISO of its boot mode.
func TestNetbootISOSecureBoot(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const bios, uefi, sbISO = "http://ctl/boot/iso/machina-ipxe-bios.iso", "http://ctl/boot/iso/machina-ipxe-uefi.iso", "http://ctl/boot/iso/machina-sb-uefi.iso"
	c, err := New(Config{Store: st, Drivers: &gatedDrivers{}, ISOURL: bios, UEFIISOURL: uefi, SBISOURL: sbISO})
	if err != nil {
		t.Fatal(err)
	}
	on, off := true, false
	desired := &inventory.Inventory{Profiles: []inventory.Profile{
		{Name: "sb", Firmware: &inventory.Firmware{SecureBoot: &on}},
		{Name: "nosb", Firmware: &inventory.Firmware{SecureBoot: &off}},
		{Name: "plain"},
	}}
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	for _, tc := range []struct {
		profile string
		want    string
	}{{"sb", sbISO}, {"nosb", uefi}, {"plain", uefi}, {"missing", uefi}} {
		x := &stepCtx{desired: desired, ws: &inventory.Server{Name: "iso-test", Profile: tc.profile}}
		d := &noPXEDriver{}
		if err := c.machine(d, state.Server{Name: "iso-test"}, bmc.BootModeUEFI, x.secureBoot(), log).Netboot(context.Background()); err != nil {
			t.Fatalf("netboot(profile %q): %v", tc.profile, err)
		}
		if len(d.media) != 1 || d.media[0] != tc.want {
			t.Errorf("netboot(profile %q) inserted %q, want [%s]", tc.profile, d.media, tc.want)
		}
		if len(d.overrides) != 1 || d.overrides[0].Device != bmc.BootCD || d.overrides[0].Mode != bmc.BootModeUEFI {
			t.Errorf("netboot(profile %q) overrides %+v, want one UEFI CD override", tc.profile, d.overrides)
		}
	}
	// A Secure Boot server whose inventory asks for a legacy boot mode
	// still gets no iPXE ISO.
	d := &noPXEDriver{}
	if err := c.machine(d, state.Server{Name: "iso-test"}, bmc.BootModeLegacy, true, log).Netboot(context.Background()); err != nil {
		t.Fatalf("netboot(sb, legacy): %v", err)
	}
	if len(d.media) != 1 || d.media[0] != sbISO {
		t.Errorf("netboot(sb, legacy) inserted %q, want [%s]", d.media, sbISO)
	}
	// No Secure Boot ISO configured: the server is not handed an iPXE one.
	c.cfg.SBISOURL = ""
	d = &noPXEDriver{}
	if err := c.machine(d, state.Server{Name: "iso-test"}, bmc.BootModeUEFI, true, log).Netboot(context.Background()); err == nil || len(d.media) != 0 {
		t.Errorf("netboot(sb) without a Secure Boot ISO: err %v, media %q; want the ErrUnsupported error and no media", err, d.media)
	}
	// A nil desired inventory or server (store-only steps) is not Secure Boot.
	if (&stepCtx{}).secureBoot() {
		t.Error("secureBoot() of an empty step is true")
	}
}
