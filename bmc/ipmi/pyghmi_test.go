package ipmi

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
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

// TestCipherSuiteNegotiatedAgainstPyghmi: pyghmi's RMCP+ server answers a
// request for cipher suite 17 with suite 3's algorithms. The driver names
// what the BMC answered (Security and the log line), not what it asked
// for; with a minimum of 17 the session is refused naming both.
func TestCipherSuiteNegotiatedAgainstPyghmi(t *testing.T) {
	b := pyghmibmc.Start(t, pyghmibmc.Config{})
	var logs bytes.Buffer
	d := newDriver(t, b.Addr(), "admin", "password", func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(&logs, t.Output()), nil))
	})
	ctx := testCtx(t)
	if _, err := d.PowerState(ctx); err != nil {
		t.Fatal(err)
	}
	want := Security{Requested: 17, Suite: 3, Authentication: "RAKP-HMAC-SHA1", Integrity: "HMAC-SHA1-96", Confidentiality: "AES-CBC-128"}
	if got := d.Security(); got != want {
		t.Errorf("Security() = %+v, want %+v", got, want)
	}
	for _, w := range []string{"requestedCipherSuite=17 cipherSuite=3 authentication=RAKP-HMAC-SHA1 integrity=HMAC-SHA1-96 confidentiality=AES-CBC-128"} {
		if !strings.Contains(logs.String(), w) {
			t.Errorf("log lacks %q:\n%s", w, logs.String())
		}
	}
	if strings.Contains(logs.String(), "strongest") {
		t.Errorf("log claims the strongest suite:\n%s", logs.String())
	}

	strict := newDriver(t, b.Addr(), "admin", "password", func(c *Config) { c.MinCipherSuite = CipherSuite17 })
	_, err := strict.PowerState(ctx)
	if !errors.Is(err, bmc.ErrUnsupported) {
		t.Fatalf("minimum 17: PowerState = %v, want bmc.ErrUnsupported", err)
	}
	for _, w := range []string{"minimum cipher suite 17", "asked cipher suite 17, the BMC answered with cipher suite 3 (RAKP-HMAC-SHA1, HMAC-SHA1-96, AES-CBC-128)"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
}

// TestMinCipherSuiteValidated: the minimum is 3 or 17; suites 0-2 (and
// the MD5 and RC4 ones) are never accepted, as a minimum or as a suite to
// try.
func TestMinCipherSuiteValidated(t *testing.T) {
	for _, m := range []uint8{1, 2, 8, 12} {
		if _, err := New(Config{Address: "127.0.0.1", Username: "u", MinCipherSuite: m}); err == nil || !strings.Contains(err.Error(), "want 3 or 17") {
			t.Errorf("MinCipherSuite %d: New = %v, want an error", m, err)
		}
	}
	if _, err := New(Config{Address: "127.0.0.1", Username: "u", CipherSuites: []uint8{0, 1, 2}}); err == nil || !strings.Contains(err.Error(), "none at or above the minimum cipher suite 3") {
		t.Errorf("CipherSuites 0-2: New = %v, want an error", err)
	}
	d, err := New(Config{Address: "127.0.0.1", Username: "u", MinCipherSuite: 17})
	if err != nil || !slices.Equal(d.cfg.CipherSuites, []uint8{17}) {
		t.Errorf("minimum 17: suites %v, %v; want [17]", d.cfg.CipherSuites, err)
	}
}
