package redfish_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmcsim"
)

// netboot is the driver's part of a netboot as the reconciler runs it
// (reconciler.bmcMachine.Netboot): a one-time PXE override, the power
// read that picks on or reset, then that power action.
func netboot(ctx context.Context, l *lab) error {
	if err := l.drv.SetBootOverride(ctx, bmc.BootOverride{Device: bmc.BootPXE}); err != nil {
		return err
	}
	ps, err := l.drv.PowerState(ctx)
	if err != nil {
		return err
	}
	a := bmc.PowerActionOn
	if ps == bmc.PowerOn {
		a = bmc.PowerActionReset
	}
	return l.drv.Power(ctx, a)
}

// systemReads is the sequence of System GETs (as "R") and writes (as
// "W") the emulator saw, other requests left out.
func systemReads(l *lab, v vendor) []string {
	var out []string
	for _, r := range l.sim.Requests() {
		switch {
		case r.Method == http.MethodGet && r.Path == v.sys:
			out = append(out, "R")
		case r.Method != http.MethodGet && r.Method != http.MethodHead && r.Path != "/redfish/v1/SessionService/Sessions":
			out = append(out, "W "+r.Method+" "+r.Path)
		}
	}
	return out
}

// TestNetbootSharedReads: over every vendor tree, from off and from on, a
// netboot run as one bmc.ShareReads operation sends the same writes, ends
// in the same power and override, and reads the System twice fewer times
// than without: the power read and the power action's first read are
// answered from the override's read-back. Every read that verifies still
// goes to the BMC: one System GET before the PATCH (current override and
// allowed values), one after it (a BMC may ignore or coerce the
// override), none between that read-back and the reset, and at least one
// after the reset (PowerState polled until it moves).
func TestNetbootSharedReads(t *testing.T) {
	for _, v := range vendors {
		for _, on := range []bool{false, true} {
			name := v.tree + "/off"
			if on {
				name = v.tree + "/on"
			}
			t.Run(name, func(t *testing.T) {
				run := func(ctx context.Context) (*lab, error) {
					l := newLab(t, v.tree, labOpts{on: on})
					// Resolve the System first, as a cached driver has.
					if _, err := l.drv.PowerState(context.Background()); err != nil {
						t.Fatal(err)
					}
					l.sim.ClearRequests()
					return l, netboot(ctx, l)
				}
				plain, perr := run(context.Background())
				shared, serr := run(bmc.ShareReads(context.Background()))
				if !errors.Is(serr, unverifiedIf(v, on)) || !errors.Is(perr, unverifiedIf(v, on)) {
					t.Fatalf("netboot: plain %v, shared %v; want %v", perr, serr, unverifiedIf(v, on))
				}
				if diff := cmp.Diff(plain.writes(), shared.writes()); diff != "" {
					t.Errorf("writes differ, plain -, shared +:\n%s", diff)
				}
				if !shared.power.On() {
					t.Error("shared: machine not on after the netboot")
				}
				seq := systemReads(shared, v)
				pr, sr := count(systemReads(plain, v), "R"), count(seq, "R")
				if sr != pr-2 {
					t.Errorf("System GETs: shared %d, plain %d; want 2 fewer (shared %v)", sr, pr, seq)
				}
				// R W(patch) R W(reset) R...
				if len(seq) < 5 || seq[0] != "R" || seq[1][0] != 'W' || seq[2] != "R" || seq[3][0] != 'W' || seq[4] != "R" {
					t.Errorf("shared System reads and writes = %v, want a read before the PATCH, a read-back, the reset, then polls", seq)
				}
				o, err := shared.drv.BootOverride(context.Background())
				if err != nil || o.Device != bmc.BootPXE && o.Device != "" {
					t.Errorf("BootOverride after = %+v, %v", o, err)
				}
			})
		}
	}
}

// unverifiedIf is the error a netboot gives: a reset of a running
// machine on a tree without reset evidence is unverified.
func unverifiedIf(v vendor, on bool) error {
	if on {
		return unverified(v)
	}
	return nil
}

func count(s []string, x string) int {
	n := 0
	for _, e := range s {
		if e == x {
			n++
		}
	}
	return n
}

// TestSharedReadsEndWithTheOperation: what one bmc.ShareReads operation
// read does not answer the next one (the machine was switched on behind
// the driver's back in between: the next operation sees it), nor a read
// after a write within the same operation until the BMC is read again.
func TestSharedReadsEndWithTheOperation(t *testing.T) {
	l := newLab(t, treeDell, labOpts{on: false})
	ctx := bmc.ShareReads(context.Background())
	if ps, err := l.drv.PowerState(ctx); err != nil || ps != bmc.PowerOff {
		t.Fatalf("PowerState = %s, %v; want off", ps, err)
	}
	l.power.Set(true)
	if ps, err := l.drv.PowerState(ctx); err != nil || ps != bmc.PowerOff {
		t.Fatalf("PowerState in the same operation = %s, %v; want the shared off (no request)", ps, err)
	}
	if ps, err := l.drv.PowerState(bmc.ShareReads(context.Background())); err != nil || ps != bmc.PowerOn {
		t.Fatalf("PowerState in a new operation = %s, %v; want on", ps, err)
	}
	if ps, err := l.drv.PowerState(context.Background()); err != nil || ps != bmc.PowerOn {
		t.Fatalf("PowerState outside any operation = %s, %v; want on", ps, err)
	}
	// Within one operation, a write forgets the shared answer (a virtual
	// media insert reads no System after its write).
	ctx = bmc.ShareReads(context.Background())
	if ps, err := l.drv.PowerState(ctx); err != nil || ps != bmc.PowerOn {
		t.Fatalf("PowerState = %s, %v; want on", ps, err)
	}
	if err := l.drv.InsertMedia(ctx, isoURL); err != nil {
		t.Fatal(err)
	}
	l.sim.ClearRequests()
	l.power.Set(false)
	if ps, err := l.drv.PowerState(ctx); err != nil || ps != bmc.PowerOff {
		t.Fatalf("PowerState after a write in the operation = %s, %v; want off, read from the BMC", ps, err)
	}
	if n := len(l.sim.Requests()); n != 1 {
		t.Errorf("requests for the read after the write = %d, want 1", n)
	}
}

// TestSharedReadsKeepOnceChecks: a BMC that ignores or coerces a one-time
// override is still caught under bmc.ShareReads (the read-back after the
// PATCH always asks the BMC), and the persistent override asked next
// starts from what that read-back showed.
func TestSharedReadsKeepOnceChecks(t *testing.T) {
	for _, tc := range []struct {
		name    string
		set     func(*bmcsim.Quirks)
		outcome bmc.OnceOutcome
	}{
		{"coerced", func(q *bmcsim.Quirks) { q.StoreContinuousForOnce = true }, bmc.OnceCoerced},
		{"ignored", func(q *bmcsim.Quirks) { q.IgnoreOnce = true }, bmc.OnceIgnored},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := bmcsim.DefaultQuirks("Dell")
			tc.set(&q)
			l := newLab(t, treeDell, labOpts{on: true, quirks: &q})
			ctx := bmc.ShareReads(context.Background())
			err := l.drv.SetBootOverride(ctx, bmc.BootOverride{Device: bmc.BootPXE})
			var oe *bmc.OnceError
			if !errors.As(err, &oe) || oe.Outcome != tc.outcome {
				t.Fatalf("err = %v, want a *bmc.OnceError %s", err, tc.outcome)
			}
			if err := l.drv.SetBootOverride(ctx, bmc.BootOverride{Device: bmc.BootPXE, Persistent: true}); err != nil {
				t.Fatalf("persistent override after the OnceError: %v", err)
			}
			got, err := l.drv.BootOverride(ctx)
			if want := (bmc.BootOverride{Device: bmc.BootPXE, Persistent: true, Mode: bmc.BootModeUEFI}); err != nil || got != want {
				t.Errorf("BootOverride = %+v, %v; want %+v", got, err, want)
			}
		})
	}
}
