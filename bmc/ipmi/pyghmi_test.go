package ipmi

import (
	"errors"
	"slices"
	"testing"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/internal/pyghmibmc"
)

// TestPowerAgainstPyghmi drives power through the driver against pyghmi's
// Bmc class (Debian python3-pyghmi, what VirtualBMC builds on) and checks
// the power backend saw it.
func TestPowerAgainstPyghmi(t *testing.T) {
	b := pyghmibmc.Start(t, pyghmibmc.Config{})
	d := newDriver(t, b.Addr(), "admin", "password", nil)
	ctx := testCtx(t)
	if ps, err := d.PowerState(ctx); err != nil || ps != bmc.PowerOff {
		t.Fatalf("PowerState = %v, %v; want off", ps, err)
	}
	for _, step := range []struct {
		a    bmc.PowerAction
		want bmc.PowerState
	}{{bmc.PowerActionOn, bmc.PowerOn}, {bmc.PowerActionReset, bmc.PowerOn}, {bmc.PowerActionOff, bmc.PowerOff}} {
		// A hard reset keeps power on: IPMI shows no evidence of it.
		if err := d.Power(ctx, step.a); err != nil && !(step.a == bmc.PowerActionReset && errors.Is(err, bmc.ErrUnverified)) {
			t.Fatalf("Power(%s): %v", step.a, err)
		}
		if ps, err := d.PowerState(ctx); err != nil || ps != step.want {
			t.Fatalf("after %s: PowerState = %v, %v; want %s", step.a, ps, err, step.want)
		}
	}
	boots, err := b.Boots()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"power-on default", "reset default"}; !slices.Equal(boots, want) {
		t.Errorf("boots = %q, want %q", boots, want)
	}
}

// TestBootOverrideAgainstPyghmi: pyghmi keeps only the device selector.
// A persistent UEFI override reads back once and legacy (flags 0x80): the
// driver reports a *bmc.KeptError naming both quirks and what was kept,
// not a mismatch; the device itself is set.
func TestBootOverrideAgainstPyghmi(t *testing.T) {
	b := pyghmibmc.Start(t, pyghmibmc.Config{})
	d := newDriver(t, b.Addr(), "admin", "password", nil)
	ctx := testCtx(t)
	for _, tc := range []struct {
		o      bmc.BootOverride
		quirks []bmc.BootQuirk
	}{
		{bmc.BootOverride{Device: bmc.BootDisk, Persistent: true, Mode: bmc.BootModeUEFI}, []bmc.BootQuirk{bmc.QuirkBootFlagsNotPersistent, bmc.QuirkBootModeIgnored}},
		{bmc.BootOverride{Device: bmc.BootPXE, Persistent: true}, []bmc.BootQuirk{bmc.QuirkBootFlagsNotPersistent}},
		{bmc.BootOverride{Device: bmc.BootCD, Mode: bmc.BootModeUEFI}, []bmc.BootQuirk{bmc.QuirkBootModeIgnored}},
	} {
		err := d.SetBootOverride(ctx, tc.o)
		var ke *bmc.KeptError
		if !errors.As(err, &ke) || !errors.Is(err, bmc.ErrPartlyKept) {
			t.Fatalf("SetBootOverride(%+v) = %v, want a *bmc.KeptError", tc.o, err)
		}
		if !slices.Equal(ke.Quirks, tc.quirks) {
			t.Errorf("SetBootOverride(%+v): quirks %v, want %v", tc.o, ke.Quirks, tc.quirks)
		}
		if want := (bmc.BootOverride{Device: tc.o.Device, Mode: bmc.BootModeLegacy}); ke.Got != want {
			t.Errorf("SetBootOverride(%+v): Got %+v, want %+v", tc.o, ke.Got, want)
		}
		got, err := d.BootOverride(ctx)
		if err != nil || got.Device != tc.o.Device || got.Persistent {
			t.Errorf("BootOverride after %+v = %+v, %v", tc.o, got, err)
		}
	}
	// What pyghmi keeps exactly: a legacy one-time override.
	if err := d.SetBootOverride(ctx, bmc.BootOverride{Device: bmc.BootDisk, Mode: bmc.BootModeLegacy}); err != nil {
		t.Errorf("legacy once: %v", err)
	}
}

// TestBootDeviceAtPowerOnAgainstPyghmi: over libvirt, VirtualBMC reads the
// running domain, so a device set while the machine runs reads back
// stale: reported as bmc.QuirkBootDeviceAtPowerOn while on, applied by a
// power-on from off (not by a reset), and a mismatch while off would be
// an error.
func TestBootDeviceAtPowerOnAgainstPyghmi(t *testing.T) {
	b := pyghmibmc.Start(t, pyghmibmc.Config{ApplyAtPowerOn: true})
	d := newDriver(t, b.Addr(), "admin", "password", nil)
	ctx := testCtx(t)
	if err := d.SetBootOverride(ctx, bmc.BootOverride{Device: bmc.BootPXE, Mode: bmc.BootModeLegacy}); err != nil {
		t.Fatalf("pxe while off: %v", err)
	}
	if err := d.Power(ctx, bmc.PowerActionOn); err != nil {
		t.Fatal(err)
	}
	err := d.SetBootOverride(ctx, bmc.BootOverride{Device: bmc.BootDisk, Mode: bmc.BootModeLegacy})
	var ke *bmc.KeptError
	if !errors.As(err, &ke) || !ke.Has(bmc.QuirkBootDeviceAtPowerOn) || ke.Got.Device != bmc.BootPXE {
		t.Fatalf("disk while on = %v, want a *bmc.KeptError with %s reading pxe", err, bmc.QuirkBootDeviceAtPowerOn)
	}
	if err := d.Power(ctx, bmc.PowerActionReset); err != nil && !errors.Is(err, bmc.ErrUnverified) {
		t.Fatal(err)
	}
	if err := d.Power(ctx, bmc.PowerActionOff); err != nil {
		t.Fatal(err)
	}
	if got, err := d.BootOverride(ctx); err != nil || got.Device != bmc.BootDisk {
		t.Fatalf("BootOverride while off = %+v, %v; want disk", got, err)
	}
	if err := d.Power(ctx, bmc.PowerActionOn); err != nil {
		t.Fatal(err)
	}
	boots, _ := b.Boots()
	if want := []string{"power-on network", "reset network", "power-on hd"}; !slices.Equal(boots, want) {
		t.Errorf("boots = %q, want %q", boots, want)
	}
}
