package plan

import (
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/state"
)

// TestPlanBootStalled: a commissioning server whose machine fetched its
// kernel and was not heard from since (a Secure Boot firmware, shim or
// GRUB refused an unsigned kernel) shows BootStalled instead of
// MachineSilent, naming the file, the protocol and the time, with the
// Secure Boot hint only for a Secure Boot chain; it is re-netbooted on
// the same bounded schedule as any silent machine (the re-netboot's and
// the timeout's reasons name the stall); a machine heard after the fetch,
// or a fetch from before the last re-netboot, is not a boot stall.
func TestPlanBootStalled(t *testing.T) {
	inv := exampleInventory(t)
	const name = "r1-n01"
	kernel := func(ago time.Duration, secure bool) func(*state.Server) {
		return func(s *state.Server) {
			at := planT0.Add(-ago)
			s.LastHeard, s.LastHeardAt = state.HeardBootFile("machina/ramdisk/vmlinuz", "tftp"), at
			s.BootFetch = &state.BootFetch{File: "machina/ramdisk/vmlinuz", Via: "tftp", SecureBoot: secure, At: at}
		}
	}
	for _, tc := range []struct {
		name       string
		mod        func(*state.Server)
		sinceBegan time.Duration // 0: 20 minutes
		wantReason string        // "" for no condition
		wantMsg    []string
		notMsg     string
		wantStep   Action // "" for none
		wantWhy    string
	}{
		{name: "secure boot kernel fetched 3m ago", mod: kernel(3*time.Minute, true), wantReason: CondBootStalled,
			wantMsg: []string{"commissioning: boot stalled: the machine fetched machina/ramdisk/vmlinuz by tftp at 2026-11-01T11:57:00Z",
				"has not called the controller in the 3m0s since", "Secure Boot: the firmware, shim or GRUB may have refused an unsigned or untrusted image", "re-netboot 1 of 3 after 5m0s"}},
		{name: "kernel fetched without secure boot", mod: kernel(3*time.Minute, false), wantReason: CondBootStalled,
			wantMsg: []string{"fetched machina/ramdisk/vmlinuz by tftp"}, notMsg: "Secure Boot"},
		{name: "kernel fetched 6m ago: re-netboot", mod: kernel(6*time.Minute, true), wantReason: CondBootStalled,
			wantMsg: []string{"in the 6m0s since"}, wantStep: ActRenetboot, wantWhy: "boot file fetched: machina/ramdisk/vmlinuz by tftp at 2026-11-01T11:54:00Z, nothing from the ramdisk since (Secure Boot"},
		{name: "re-netboots used up", mod: func(s *state.Server) {
			kernel(3*time.Minute, true)(s)
			s.Renetboots, s.RenetbootAt = 3, planT0.Add(-8*time.Minute)
		}, wantReason: CondBootStalled, wantMsg: []string{"3 re-netboots done; waiting for the deadline"}},
		{name: "deadline passed: the timeout says why", mod: kernel(3*time.Minute, true), sinceBegan: 31 * time.Minute,
			wantStep: ActTimeout, wantWhy: "no commissioning report within 30m0s; boot stalled: the machine fetched machina/ramdisk/vmlinuz by tftp"},
		{name: "ramdisk heard after the fetch", mod: func(s *state.Server) {
			kernel(4*time.Minute, true)(s)
			s.LastHeard, s.LastHeardAt = "attestation challenge", planT0.Add(-3*time.Minute)
		}, wantReason: "MachineSilent", wantMsg: []string{"last heard: attestation challenge"}, notMsg: "boot stalled"},
		{name: "fetch before the last re-netboot", mod: func(s *state.Server) {
			kernel(4*time.Minute, true)(s)
			s.Renetboots, s.RenetbootAt = 1, planT0.Add(-3*time.Minute)
		}, wantReason: "MachineSilent", notMsg: "boot stalled"},
		{name: "fetch heard 1m ago: nothing yet", mod: kernel(time.Minute, true)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := observe(inv, state.LifecycleReady, bigHW)
			s := snap.Servers[name]
			began := tc.sinceBegan
			if began == 0 {
				began = 20 * time.Minute
			}
			s.Lifecycle, s.LifecycleAt = state.LifecycleCommissioning, planT0.Add(-began)
			tc.mod(s)
			snap.Servers[name] = s
			step, got := stepAndCondition(Compute(inv, snap, Options{Now: planT0}), name, func(c Condition) bool {
				return c.Reason == CondBootStalled || c.Reason == "MachineSilent"
			})
			if step.Action != tc.wantStep || !strings.Contains(step.Why, tc.wantWhy) {
				t.Errorf("step %q (%q), want %q containing %q", step.Action, step.Why, tc.wantStep, tc.wantWhy)
			}
			switch {
			case tc.wantReason == "" && got != nil:
				t.Fatalf("condition %+v, want none", *got)
			case tc.wantReason == "":
				return
			case got == nil || got.Reason != tc.wantReason || got.Type != "Waiting":
				t.Fatalf("condition %+v, want Waiting/%s", got, tc.wantReason)
			}
			for _, w := range tc.wantMsg {
				if !strings.Contains(got.Message, w) {
					t.Errorf("message %q lacks %q", got.Message, w)
				}
			}
			if tc.notMsg != "" && strings.Contains(got.Message, tc.notMsg) {
				t.Errorf("message %q has %q", got.Message, tc.notMsg)
			}
		})
	}
}

// TestPlanWipeBootStalled: a release wipe whose machine fetched the
// ramdisk's kernel and never called (a Secure Boot machine refusing an
// unsigned kernel) shows Waiting/BootStalled instead of WipePending from
// half of SilentAfter after the fetch, naming the file, the Secure Boot
// hint and the wipe's deadline; a retry shows it too; a fetch from before
// the wipe started, or a machine heard after it, is not a stall; the
// wipe's timeout says why the report never came.
func TestPlanWipeBootStalled(t *testing.T) {
	inv := exampleInventory(t)
	const name = "r1-n01"
	fetched := func(ago time.Duration) func(*state.Server) {
		return func(s *state.Server) {
			at := planT0.Add(-ago)
			s.LastHeard, s.LastHeardAt = state.HeardBootFile("machina/ramdisk/vmlinuz", "tftp"), at
			s.BootFetch = &state.BootFetch{File: "machina/ramdisk/vmlinuz", Via: "tftp", SecureBoot: true, At: at}
		}
	}
	for _, tc := range []struct {
		name       string
		started    time.Duration // wipe started this long ago
		mod        func(*state.Server)
		wantReason string
		wantMsg    []string
		wantStep   Action
		wantWhy    string
	}{
		{name: "kernel fetched 3m ago", started: 4 * time.Minute, mod: fetched(3 * time.Minute), wantReason: CondBootStalled,
			wantMsg: []string{"release wipe running since 2026-11-01T11:56:00Z: boot stalled: the machine fetched machina/ramdisk/vmlinuz by tftp at 2026-11-01T11:57:00Z",
				"Secure Boot: the firmware, shim or GRUB may have refused", "the wipe times out at 2026-11-01T12:26:00Z", "not allocatable until wiped"}},
		{name: "retry after a failure", started: 4 * time.Minute, mod: func(s *state.Server) {
			fetched(3 * time.Minute)(s)
			s.WipeFailures, s.WipeFailedAt = 1, planT0.Add(-10*time.Minute)
		}, wantReason: CondBootStalled, wantMsg: []string{"boot stalled"}},
		{name: "fetched 1m ago: not yet", started: 2 * time.Minute, mod: fetched(time.Minute), wantReason: "WipePending"},
		{name: "fetch before the wipe", started: 4 * time.Minute, mod: fetched(5 * time.Minute), wantReason: "WipePending"},
		{name: "ramdisk heard after the fetch", started: 4 * time.Minute, mod: func(s *state.Server) {
			fetched(3 * time.Minute)(s)
			s.LastHeard, s.LastHeardAt = "wipe plan", planT0.Add(-2*time.Minute)
		}, wantReason: "WipePending"},
		{name: "deadline passed: the timeout says why", started: 31 * time.Minute, mod: fetched(30 * time.Minute), wantReason: CondBootStalled,
			wantStep: ActTimeout, wantWhy: "release wipe did not report within 30m0s; boot stalled: the machine fetched machina/ramdisk/vmlinuz by tftp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := observe(inv, state.LifecycleReady, bigHW)
			s := snap.Servers[name]
			s.NeedsWipe, s.WipeStartedAt = true, planT0.Add(-tc.started)
			tc.mod(s)
			snap.Servers[name] = s
			step, got := stepAndCondition(Compute(inv, snap, Options{Now: planT0}), name, func(c Condition) bool {
				return c.Reason == CondBootStalled || c.Type == "WipePending" || c.Type == "WipeFailed"
			})
			if step.Action != tc.wantStep || !strings.Contains(step.Why, tc.wantWhy) {
				t.Errorf("step %q (%q), want %q containing %q", step.Action, step.Why, tc.wantStep, tc.wantWhy)
			}
			if got == nil || (got.Reason != tc.wantReason && got.Type != tc.wantReason) {
				t.Fatalf("condition %+v, want %s", got, tc.wantReason)
			}
			for _, w := range tc.wantMsg {
				if !strings.Contains(got.Message, w) {
					t.Errorf("message %q lacks %q", got.Message, w)
				}
			}
		})
	}
}

// stepAndCondition returns res's step for server name (zero if none) and
// its last condition that match accepts (nil if none).
func stepAndCondition(res Result, name string, match func(Condition) bool) (Step, *Condition) {
	var step Step
	for _, st := range res.Steps {
		if st.Server == name {
			step = st
		}
	}
	var got *Condition
	for i, c := range res.Conditions {
		if c.Subject == "server/"+name && match(c) {
			got = &res.Conditions[i]
		}
	}
	return step, got
}
