package plan

import (
	"testing"
	"time"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// TestPlanConfirmOff: a ready or failed server the ramdisk said it powers
// off (state.PowerSourceAgent, or a claim still pending after a BMC sweep
// read it on) gets a confirm-off step once
// ConfirmOffAfter has passed, and none before, none for a power state
// from a command or the BMC, none while it is commissioning, and none in a
// pass that already has another step for it. Before, nothing checked:
// a VM lab guest whose kernel hung after "final action poweroff" stayed on
// while the store said off.
func TestPlanConfirmOff(t *testing.T) {
	inv := exampleInventory(t)
	base := observe(inv, state.LifecycleReady, bigHW)
	// A server the plan has nothing else for.
	busy := map[string]bool{}
	for _, st := range Compute(inv, base, Options{Now: planT0}).Steps {
		busy[st.Server] = true
	}
	// In servers.yaml order, not the snapshot map's, and never a server
	// wanted retired: r3-n03, the example's, is observed retired (so it
	// has no step and looks idle), and once a case sets it ready or
	// failed, retireSteps plans its retire and returns before a
	// confirm-off is considered. A map's order picked it in 2 of 30 runs.
	name, other := "", ""
	for _, ws := range inv.Servers {
		if ws.Want == inventory.WantRetired {
			continue
		}
		if !busy[ws.Name] && name == "" {
			name = ws.Name
		}
		if busy[ws.Name] && other == "" {
			other = ws.Name
		}
	}
	if name == "" || other == "" {
		t.Fatalf("example inventory: no idle ready server and a busy one (busy %v)", busy)
	}
	for _, tc := range []struct {
		name   string
		server string
		lc     state.Lifecycle
		power  state.PowerStatus
		want   bool
	}{
		{"agent off 2m ago", name, state.LifecycleReady, state.PowerStatus{State: state.PowerOff, Source: state.PowerSourceAgent, At: planT0.Add(-2 * time.Minute)}, true},
		{"agent off 30s ago", name, state.LifecycleReady, state.PowerStatus{State: state.PowerOff, Source: state.PowerSourceAgent, At: planT0.Add(-30 * time.Second)}, false},
		{"failed, agent off", name, state.LifecycleFailed, state.PowerStatus{State: state.PowerOff, Source: state.PowerSourceAgent, At: planT0.Add(-2 * time.Minute)}, true},
		{"off by command", name, state.LifecycleReady, state.PowerStatus{State: state.PowerOff, Source: state.PowerSourceCommand, At: planT0.Add(-2 * time.Minute)}, false},
		{"off read from the BMC", name, state.LifecycleReady, state.PowerStatus{State: state.PowerOff, Source: state.PowerSourceBMC, At: planT0.Add(-2 * time.Minute)}, false},
		{"agent off 2m ago, the sweep read on since", name, state.LifecycleReady, state.PowerStatus{State: state.PowerOn, Source: state.PowerSourceBMC, At: planT0.Add(-90 * time.Second), OffClaimedAt: planT0.Add(-2 * time.Minute)}, true},
		{"agent off 30s ago, the sweep read on since", name, state.LifecycleReady, state.PowerStatus{State: state.PowerOn, Source: state.PowerSourceBMC, At: planT0.Add(-20 * time.Second), OffClaimedAt: planT0.Add(-30 * time.Second)}, false},
		{"on read from the BMC, no claim", name, state.LifecycleReady, state.PowerStatus{State: state.PowerOn, Source: state.PowerSourceBMC, At: planT0.Add(-2 * time.Minute)}, false},
		{"commissioning", name, state.LifecycleCommissioning, state.PowerStatus{State: state.PowerOff, Source: state.PowerSourceAgent, At: planT0.Add(-2 * time.Minute)}, false},
		{"another step this pass", other, state.LifecycleReady, state.PowerStatus{State: state.PowerOff, Source: state.PowerSourceAgent, At: planT0.Add(-2 * time.Minute)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := observe(inv, state.LifecycleReady, bigHW)
			s := snap.Servers[tc.server]
			s.Lifecycle, s.LifecycleAt, s.Power = tc.lc, planT0.Add(-time.Minute), tc.power
			snap.Servers[tc.server] = s
			got := false
			for _, st := range Compute(inv, snap, Options{Now: planT0}).Steps {
				if st.Server == tc.server && st.Action == ActConfirmOff {
					got = true
				}
			}
			if got != tc.want {
				t.Errorf("confirm-off step for %s: %v, want %v", tc.server, got, tc.want)
			}
		})
	}
}
