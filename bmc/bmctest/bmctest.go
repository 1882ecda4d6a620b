// Package bmctest is the conformance suite every [bmc.Driver] runs: the
// Redfish driver over each bmcsim vendor tree, the IPMI driver over
// ipmi_sim. It checks the contract's observable promises (idempotent power
// that ends in the right state, boot overrides that read back, media
// insert/eject, Close twice) against the real machine state the harness
// exposes, not against what the driver says.
//
// bmctest imports only bmc and the standard library.
package bmctest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
)

// Target is one BMC under test and the machine behind it.
type Target struct {
	// Driver is the driver under test, connected to a fresh BMC.
	Driver bmc.Driver
	// SetPower puts the machine in a power state behind the BMC's back
	// (the emulator's backend), before the driver acts.
	SetPower func(on bool)
	// PowerOn reports the machine's real power, read from the backend.
	PowerOn func() bool
	// NoVirtualMedia: the BMC has no virtual CD; InsertMedia must be
	// bmc.ErrUnsupported.
	NoVirtualMedia bool
	// NoPersistentBoot: the BMC cannot keep an override (e.g. Lenovo XCC
	// lists only Once); a persistent override must be bmc.ErrUnsupported.
	NoPersistentBoot bool
	// NoResetEvidence: the BMC offers no proof of a reset of a running
	// machine (no LastResetTime, no BootProgress, no task, power never
	// seen off); reset and cycle from on must be bmc.ErrUnverified, and
	// the machine still on.
	NoResetEvidence bool
	// MediaURL is the image URL used for media tests; "" means
	// "http://192.0.2.1/machina.iso".
	MediaURL string
}

// Run runs the suite. newTarget is called once per subtest and must return
// a Target on a fresh BMC; it registers its own cleanup with t.
func Run(t *testing.T, newTarget func(t *testing.T) Target) {
	t.Helper()
	ctx := func(t *testing.T) context.Context {
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		t.Cleanup(cancel)
		return c
	}
	powerCases := []struct {
		from   bool
		action bmc.PowerAction
		want   bool
	}{
		{false, bmc.PowerActionOn, true}, {true, bmc.PowerActionOn, true},
		{true, bmc.PowerActionOff, false}, {false, bmc.PowerActionOff, false},
		{true, bmc.PowerActionSoftOff, false}, {false, bmc.PowerActionSoftOff, false},
		{true, bmc.PowerActionReset, true}, {false, bmc.PowerActionReset, true},
		{true, bmc.PowerActionCycle, true}, {false, bmc.PowerActionCycle, true},
	}
	for _, pc := range powerCases {
		name := "power/" + string(pc.action) + "-from-" + onOff(pc.from)
		t.Run(name, func(t *testing.T) {
			tg := newTarget(t)
			tg.SetPower(pc.from)
			err := tg.Driver.Power(ctx(t), pc.action)
			restart := pc.from && (pc.action == bmc.PowerActionReset || pc.action == bmc.PowerActionCycle)
			if restart && tg.NoResetEvidence {
				if !errors.Is(err, bmc.ErrUnverified) {
					t.Fatalf("Power(%s) from on without evidence: %v, want ErrUnverified", pc.action, err)
				}
				err = nil
			} else if restart && err == nil {
				if r, ok := tg.Driver.(bmc.ResetEvidence); ok && r.LastResetEvidence() == "" {
					t.Errorf("Power(%s) verified, but LastResetEvidence is empty", pc.action)
				}
			}
			if err != nil {
				t.Fatalf("Power(%s) from %s: %v", pc.action, onOff(pc.from), err)
			}
			if got := tg.PowerOn(); got != pc.want {
				t.Errorf("machine after %s from %s is %s, want %s", pc.action, onOff(pc.from), onOff(got), onOff(pc.want))
			}
			ps, err := tg.Driver.PowerState(ctx(t))
			if err != nil || ps != map[bool]bmc.PowerState{true: bmc.PowerOn, false: bmc.PowerOff}[pc.want] {
				t.Errorf("PowerState() = %v, %v; want %s", ps, err, onOff(pc.want))
			}
		})
	}
	for _, o := range []bmc.BootOverride{
		{Device: bmc.BootPXE},
		{Device: bmc.BootDisk, Persistent: true},
		{Device: bmc.BootCD},
		{Device: bmc.BootBIOSSetup},
	} {
		t.Run("boot/"+string(o.Device)+map[bool]string{true: "-persistent", false: "-once"}[o.Persistent], func(t *testing.T) {
			tg := newTarget(t)
			tg.SetPower(true)
			err := tg.Driver.SetBootOverride(ctx(t), o)
			if o.Persistent && tg.NoPersistentBoot {
				if !errors.Is(err, bmc.ErrUnsupported) {
					t.Fatalf("persistent override on a once-only BMC: %v, want ErrUnsupported", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("SetBootOverride(%+v): %v", o, err)
			}
			got, err := tg.Driver.BootOverride(ctx(t))
			if err != nil {
				t.Fatal(err)
			}
			if got.Device != o.Device || got.Persistent != o.Persistent {
				t.Errorf("BootOverride() = %+v, want device %s persistent %v", got, o.Device, o.Persistent)
			}
		})
	}
	t.Run("media/insert-eject", func(t *testing.T) {
		tg := newTarget(t)
		url := tg.MediaURL
		if url == "" {
			url = "http://192.0.2.1/machina.iso"
		}
		err := tg.Driver.InsertMedia(ctx(t), url)
		if tg.NoVirtualMedia {
			if !errors.Is(err, bmc.ErrUnsupported) {
				t.Fatalf("InsertMedia on a BMC without virtual media: %v, want ErrUnsupported", err)
			}
			return
		}
		if err != nil {
			t.Fatalf("InsertMedia: %v", err)
		}
		if err := tg.Driver.InsertMedia(ctx(t), url); err != nil {
			t.Fatalf("InsertMedia again (same image): %v", err)
		}
		if err := tg.Driver.EjectMedia(ctx(t)); err != nil {
			t.Fatalf("EjectMedia: %v", err)
		}
		if err := tg.Driver.EjectMedia(ctx(t)); err != nil {
			t.Fatalf("EjectMedia when empty: %v", err)
		}
	})
	t.Run("info", func(t *testing.T) {
		tg := newTarget(t)
		tg.SetPower(true)
		in, err := tg.Driver.Info(ctx(t))
		if err != nil {
			t.Fatalf("Info: %v", err)
		}
		if in.Power != bmc.PowerOn {
			t.Errorf("Info().Power = %q, want on", in.Power)
		}
	})
	t.Run("close-twice", func(t *testing.T) {
		tg := newTarget(t)
		if _, err := tg.Driver.PowerState(ctx(t)); err != nil {
			t.Fatal(err)
		}
		if err := tg.Driver.Close(ctx(t)); err != nil {
			t.Fatal(err)
		}
		if err := tg.Driver.Close(ctx(t)); err != nil {
			t.Errorf("second Close: %v", err)
		}
	})
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
