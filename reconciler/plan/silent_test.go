package plan

import (
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/state"
)

// TestPlanSilentMachine: a commissioning or deploying server whose machine
// went silent (its controller was killed mid-answer) shows a Waiting
// condition naming the last thing heard, and is re-netbooted after
// SilentAfter, at most MaxRenetboots times, long before its deadline.
// Before the fix it showed nothing and sat until the deadline failed it.
func TestPlanSilentMachine(t *testing.T) {
	inv := exampleInventory(t)
	const name = "r1-n01"
	for _, tc := range []struct {
		name     string
		lc       state.Lifecycle
		mod      func(*state.Server)
		wantStep bool
		wantMsg  string // "" for no condition
	}{
		{name: "deploying, heard recently", lc: state.LifecycleDeploying, mod: func(s *state.Server) {
			s.LastHeard, s.LastHeardAt = "image download", planT0.Add(-time.Minute)
		}},
		{name: "deploying, plan fetched 6m ago", lc: state.LifecycleDeploying, mod: func(s *state.Server) {
			s.LastHeard, s.LastHeardAt = "deploy plan fetched", planT0.Add(-6*time.Minute)
		}, wantStep: true, wantMsg: "last heard: deploy plan fetched at 2026-11-01T11:54:00Z; re-netboot 1 of 3"},
		{name: "commissioning, never heard", lc: state.LifecycleCommissioning, mod: func(*state.Server) {},
			wantStep: true, wantMsg: "last heard: nothing since commissioning began"},
		{name: "silent 3m: condition only", lc: state.LifecycleCommissioning, mod: func(s *state.Server) {
			s.LifecycleAt = planT0.Add(-3 * time.Minute)
		}, wantMsg: "no request from the machine for 3m0s"},
		{name: "re-netboots used up", lc: state.LifecycleDeploying, mod: func(s *state.Server) {
			s.Renetboots, s.RenetbootAt = 3, planT0.Add(-10*time.Minute)
		}, wantMsg: "3 re-netboots done; waiting for the deadline"},
		{name: "deploying, progress keeps coming with no byte advance", lc: state.LifecycleDeploying, mod: func(s *state.Server) {
			s.LastHeard, s.LastHeardAt = "progress: image-write 1048576 of 4194304 bytes", planT0.Add(-6*time.Minute)
			s.Progress = &state.Progress{Step: "image-write", BytesDone: 1 << 20, BytesTotal: 4 << 20, At: planT0.Add(-10 * time.Second), AdvancedAt: planT0.Add(-6 * time.Minute)}
		}, wantStep: true, wantMsg: "progress still reported at 2026-11-01T11:59:50Z but stalled at image-write 1048576 of 4194304 bytes"},
		{name: "deploying, progress advancing", lc: state.LifecycleDeploying, mod: func(s *state.Server) {
			s.LastHeard, s.LastHeardAt = "progress: image-write 3145728 of 4194304 bytes", planT0.Add(-10*time.Second)
			s.Progress = &state.Progress{Step: "image-write", BytesDone: 3 << 20, BytesTotal: 4 << 20, At: planT0.Add(-10 * time.Second), AdvancedAt: planT0.Add(-10 * time.Second)}
		}},
		{name: "just re-netbooted", lc: state.LifecycleDeploying, mod: func(s *state.Server) {
			s.Renetboots, s.RenetbootAt = 1, planT0.Add(-time.Minute)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := observe(inv, state.LifecycleReady, bigHW)
			s := snap.Servers[name]
			s.Lifecycle, s.LifecycleAt = tc.lc, planT0.Add(-20*time.Minute)
			if tc.lc == state.LifecycleDeploying {
				s.Allocation = &state.Allocation{Profile: "hypervisor", Image: "ubuntu-24.04"}
			}
			tc.mod(s)
			snap.Servers[name] = s
			res := Compute(inv, snap, Options{Now: planT0})
			got := false
			for _, st := range res.Steps {
				if st.Server == name && st.Action == ActRenetboot {
					got = true
				}
				if st.Server == name && st.Action == ActTimeout {
					t.Errorf("timeout step at 20 minutes: %+v", st)
				}
			}
			if got != tc.wantStep {
				t.Errorf("renetboot step %v, want %v (steps %+v)", got, tc.wantStep, res.Steps)
			}
			var msg string
			for _, c := range res.Conditions {
				if c.Subject == "server/"+name && c.Reason == "MachineSilent" {
					msg = c.Message
				}
			}
			if tc.wantMsg == "" && msg != "" || !strings.Contains(msg, tc.wantMsg) {
				t.Errorf("condition %q, want one containing %q", msg, tc.wantMsg)
			}
		})
	}
}
