package plan

import (
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/state"
)

// TestPlanFailingAction: an action retried with backoff after
// FailingAfter or more failures in a row shows a Failing condition with
// the action, the count, the next retry time and the last error; a step
// planned for the same server (a release asked for in servers.yaml) says
// it waits for that action. One failure shows neither Failing nor, once
// its retry time passed and nothing is journalled, a wait; a stalled
// server (its own condition) no Failing. Before, the retried finish-deploy
// showed nothing and the release waited silently.
func TestPlanFailingAction(t *testing.T) {
	inv := exampleInventory(t)
	inv = cloneInv(inv)
	inv.Profile("hypervisor").Count = 1
	base := steadyFleet(inv)
	var released string
	for _, s := range Compute(inv, base, Options{Now: planT0}).Steps {
		if s.Action == ActRelease {
			released = s.Server
		}
	}
	if released == "" {
		t.Fatal("no release step planned for the lowered count")
	}
	retry := planT0.Add(90 * time.Second)
	for _, tc := range []struct {
		name        string
		mod         func(*state.Server)
		wantFailing string // "" for no Failing condition
		wantWaiting string // "" for no BehindAction condition
	}{
		{name: "finish-deploy failing 3 times", mod: func(s *state.Server) {
			s.FinishDeploy = true
			s.InFlight = &state.InFlight{Action: string(ActFinishDeploy), Key: "finish-deploy/0", Attempt: 3}
			s.Failures, s.RetryAt = 3, retry
			s.LastError = "finish-deploy: redfish: set boot override Hdd: 500 Internal Server Error"
		}, wantFailing: "finish-deploy failed 3 times in a row; next retry at 2026-11-01T12:01:30Z; last error: finish-deploy: redfish: set boot override Hdd: 500",
			wantWaiting: "release waits for finish-deploy in flight, failing (3 in a row; next retry at 2026-11-01T12:01:30Z)"},
		{name: "one failure: no Failing, the wait said", mod: func(s *state.Server) {
			s.FinishDeploy = true
			s.InFlight = &state.InFlight{Action: string(ActFinishDeploy), Key: "finish-deploy/0", Attempt: 1}
			s.Failures, s.RetryAt = 1, retry
			s.LastError = "finish-deploy: timeout"
		}, wantWaiting: "release waits for finish-deploy in flight, failing (1 in a row"},
		{name: "backoff without a journal", mod: func(s *state.Server) {
			s.Failures, s.RetryAt = 2, retry
			s.LastError = "power-cycle: connection refused"
		}, wantFailing: "power-cycle failed 2 times in a row", wantWaiting: "release waits for the retry time of power-cycle after 2 failures"},
		{name: "retry time passed, nothing journalled", mod: func(s *state.Server) {
			s.Failures, s.RetryAt = 1, planT0.Add(-time.Second)
			s.LastError = "power-cycle: connection refused"
		}},
		{name: "stalled", mod: func(s *state.Server) {
			s.Failures, s.RetryAt, s.Stalled = 4, retry, "release/0"
			s.LastError = "release: unauthorized"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := steadyFleet(inv)
			s := snap.Servers[released]
			tc.mod(s)
			snap.Servers[released] = s
			res := Compute(inv, snap, Options{Now: planT0})
			var failing, waiting string
			for _, c := range res.Conditions {
				if c.Subject != "server/"+released {
					continue
				}
				switch {
				case c.Type == CondFailing && c.Reason == ReasonActionFailing:
					failing = c.Message
				case c.Type == "Waiting" && c.Reason == ReasonBehindAction:
					waiting = c.Message
				}
			}
			if (tc.wantFailing == "") != (failing == "") || !strings.Contains(failing, tc.wantFailing) {
				t.Errorf("Failing condition %q, want one containing %q", failing, tc.wantFailing)
			}
			if (tc.wantWaiting == "") != (waiting == "") || !strings.Contains(waiting, tc.wantWaiting) {
				t.Errorf("Waiting condition %q, want one containing %q", waiting, tc.wantWaiting)
			}
		})
	}
}
