package plan

import (
	"github.com/machina-metal/machina/inventory"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/machina-metal/machina/state"
)

// TestPlanReleaseWipe: a released server (ready, NeedsWipe) is wiped
// before anything else: it is never allocated while its wipe is pending,
// running or failed; a running wipe waits for its report until the wipe
// deadline; a failed one is retried after a doubling delay, and status
// shows why (WipePending, WipeFailed).
func TestPlanReleaseWipe(t *testing.T) {
	inv := exampleInventory(t)
	const name = "r1-n01" // the smallest zone-a server: hypervisor's first pick
	tests := []struct {
		name     string
		mod      func(*state.Server)
		wantStep Action // the step for name, "" for none
		wantCond string
		wantMsg  string
	}{
		{name: "pending wipe starts", mod: func(s *state.Server) {}, wantStep: ActWipe, wantCond: "WipePending", wantMsg: "not started"},
		{name: "running wipe waits", mod: func(s *state.Server) { s.WipeStartedAt = planT0.Add(-10 * time.Minute) }, wantCond: "WipePending", wantMsg: "running since"},
		{name: "wipe past deadline fails", mod: func(s *state.Server) { s.WipeStartedAt = planT0.Add(-31 * time.Minute) }, wantStep: ActTimeout, wantCond: "WipePending"},
		{name: "failed wipe waits for backoff", mod: func(s *state.Server) {
			s.WipeFailures, s.WipeFailedAt, s.LastError = 3, planT0.Add(-3*time.Minute), "release wipe failed: sda: EIO"
		}, wantCond: "WipeFailed", wantMsg: "failed 3 times (last: release wipe failed: sda: EIO); next try after 2026-11-01T12:01:00Z"},
		{name: "failed wipe retried after backoff", mod: func(s *state.Server) {
			s.WipeFailures, s.WipeFailedAt = 3, planT0.Add(-4*time.Minute)
		}, wantStep: ActWipe, wantCond: "WipeFailed"},
		{name: "retry running says so", mod: func(s *state.Server) {
			// The retry's netboot step succeeded and cleared LastError.
			s.WipeFailures, s.WipeFailedAt, s.WipeStartedAt = 2, planT0.Add(-10*time.Minute), planT0.Add(-time.Minute)
		}, wantCond: "WipeFailed", wantMsg: "failed 2 times; retry running since 2026-11-01T11:59:00Z"},
		{name: "erase making progress is not timed out", mod: func(s *state.Server) {
			s.WipeStartedAt = planT0.Add(-3 * time.Hour)
			s.Progress = &state.Progress{Step: "erase", BytesDone: 5 << 40, BytesTotal: 8 << 40, At: planT0.Add(-time.Minute), AdvancedAt: planT0.Add(-time.Minute)}
		}, wantCond: "WipePending", wantMsg: "running since"},
		{name: "erase stuck is timed out", mod: func(s *state.Server) {
			s.WipeStartedAt = planT0.Add(-3 * time.Hour)
			s.Progress = &state.Progress{Step: "erase", BytesDone: 5 << 40, BytesTotal: 8 << 40, At: planT0.Add(-time.Minute), AdvancedAt: planT0.Add(-31 * time.Minute)}
		}, wantStep: ActTimeout, wantCond: "WipePending"},
		{name: "erase unsupported", mod: func(s *state.Server) {
			s.WipeFailures, s.WipeFailedAt, s.WipeUnsupported = 1, planT0.Add(-30*time.Second), true
			s.LastError = "release wipe failed: EraseUnsupported: sda (pci-0000:00:1f.2-ata-1): erase secure unsupported on sda: ATA security is frozen"
		}, wantCond: "EraseUnsupported", wantMsg: "sda (pci-0000:00:1f.2-ata-1): erase secure unsupported on sda: ATA security is frozen; no weaker erase is run; next try after"},
		{name: "backoff capped", mod: func(s *state.Server) {
			s.WipeFailures, s.WipeFailedAt = 30, planT0.Add(-61*time.Minute)
		}, wantStep: ActWipe, wantCond: "WipeFailed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			snap := observe(inv, state.LifecycleReady, bigHW)
			s := snap.Servers[name]
			s.NeedsWipe = true
			tc.mod(s)
			snap.Servers[name] = s
			res := Compute(inv, snap, Options{Now: planT0})
			var got []Action
			for _, st := range res.Steps {
				if st.Server == name {
					got = append(got, st.Action)
				}
				if st.Action == ActAllocate && st.Server == name {
					t.Errorf("allocated %s while its release wipe is not done: %v", name, st)
				}
			}
			var want []Action
			if tc.wantStep != "" {
				want = []Action{tc.wantStep}
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("steps for %s (-want +got):\n%s", name, d)
			}
			var cond *Condition
			for i, c := range res.Conditions {
				if c.Subject == "server/"+name {
					cond = &res.Conditions[i]
				}
			}
			if cond == nil || cond.Type != tc.wantCond || !strings.Contains(cond.Message, tc.wantMsg) {
				t.Errorf("condition = %+v, want %s containing %q", cond, tc.wantCond, tc.wantMsg)
			}
			// The profile count is still met, by the next smallest server.
			if n := allocatedTo(res, "hypervisor"); n != 2 {
				t.Errorf("hypervisor allocations = %d, want 2 (from other servers)", n)
			}
		})
	}
	t.Run("wiped server is allocatable", func(t *testing.T) {
		snap := observe(inv, state.LifecycleReady, bigHW)
		res := Compute(inv, snap, Options{Now: planT0})
		if !hasStep(res.Steps, name, ActAllocate) {
			t.Errorf("%s not allocated once wiped: %v", name, res.Steps)
		}
	})
	t.Run("pinned deploy waits for the wipe", func(t *testing.T) {
		inv := cloneInv(inv)
		for i := range inv.Servers {
			if inv.Servers[i].Name == name {
				inv.Servers[i].Want, inv.Servers[i].Profile = "deployed", "hypervisor"
			}
		}
		snap := observe(inv, state.LifecycleReady, bigHW)
		s := snap.Servers[name]
		s.NeedsWipe = true
		snap.Servers[name] = s
		res := Compute(inv, snap, Options{Now: planT0})
		if hasStep(res.Steps, name, ActAllocate) || !hasStep(res.Steps, name, ActWipe) {
			t.Errorf("pinned %s with a pending wipe: steps %v, want a wipe and no allocation", name, res.Steps)
		}
	})
}

func hasStep(steps []Step, server string, a Action) bool {
	for _, s := range steps {
		if s.Server == server && s.Action == a {
			return true
		}
	}
	return false
}

// TestPlanAdoptsRenamedServer: a server renamed in servers.yaml (same boot
// MAC) is adopted under its new name (its record, lifecycle and history),
// not registered as a second server with the same MAC while the old one is
// an orphan; while it commissions the adoption waits.
func TestPlanAdoptsRenamedServer(t *testing.T) {
	inv := exampleInventory(t)
	snap := observe(inv, state.LifecycleReady, bigHW)
	for i := range inv.Servers {
		if inv.Servers[i].Name == "r1-n05" {
			inv.Servers[i].Name = "r1-n55"
		}
	}
	res := Compute(inv, snap, Options{Now: planT0})
	var got []Step
	for _, s := range res.Steps {
		if s.Server == "r1-n55" || s.Server == "r1-n05" {
			got = append(got, s)
		}
	}
	if len(got) != 1 || got[0].Action != ActAdopt || got[0].Server != "r1-n55" || got[0].From != "r1-n05" || !strings.Contains(got[0].Why, "renamed from r1-n05") {
		t.Errorf("steps for the renamed server: %+v, want one adopt of r1-n05 as r1-n55", got)
	}
	for _, c := range res.Conditions {
		if c.Subject == "server/r1-n05" && c.Type == "Orphaned" {
			t.Errorf("the renamed server's record is called orphaned: %+v", c)
		}
	}

	s := snap.Servers["r1-n05"]
	s.Lifecycle = state.LifecycleCommissioning
	snap.Servers["r1-n05"] = s
	res = Compute(inv, snap, Options{Now: planT0})
	for _, st := range res.Steps {
		if st.Server == "r1-n55" {
			t.Errorf("step for r1-n55 while its record commissions: %+v", st)
		}
	}
	waits := false
	for _, c := range res.Conditions {
		waits = waits || c.Subject == "server/r1-n55" && c.Reason == "AdoptionWaits"
	}
	if !waits {
		t.Errorf("no AdoptionWaits condition: %+v", res.Conditions)
	}
}

// TestPlanRefusesSwappedNames: two names swapped in one commit (each now
// has the other's boot MAC and BMC) are not applied: the records would
// point at the wrong machines (a deployed record at an empty one), so
// both get a BootMACConflict condition and no step at all, not even a
// commission counter or a profile's allocation; other servers plan as
// before.
func TestPlanRefusesSwappedNames(t *testing.T) {
	inv := exampleInventory(t)
	snap := observe(inv, state.LifecycleReady, bigHW)
	setLC(snap, "r2-n01", state.LifecycleDeployed, &state.Allocation{Profile: "storage"})
	var a, b *inventory.Server
	for i := range inv.Servers {
		switch inv.Servers[i].Name {
		case "r2-n01":
			a = &inv.Servers[i]
		case "r2-n04":
			b = &inv.Servers[i]
		}
	}
	a.Name, b.Name = "r2-n04", "r2-n01"
	a.Actions.Commission, b.Actions.Commission = 5, 5
	res := Compute(inv, snap, Options{Now: planT0})
	for _, s := range append(res.Steps, res.Held...) {
		if s.Server == "r2-n01" || s.Server == "r2-n04" {
			t.Errorf("step for a swapped name: %+v", s)
		}
	}
	got := map[string]string{}
	for _, c := range res.Conditions {
		if c.Type == "BootMACConflict" {
			got[c.Subject] = c.Message
		}
	}
	if len(got) != 2 || !strings.Contains(got["server/r2-n01"], "recorded as r2-n04") || !strings.Contains(got["server/r2-n04"], "recorded as r2-n01 (deployed)") {
		t.Errorf("BootMACConflict conditions %q, want both names, each naming the other record", got)
	}
	// Control: without the swap, the same counter is planned.
	inv = exampleInventory(t)
	for i := range inv.Servers {
		if inv.Servers[i].Name == "r2-n04" {
			inv.Servers[i].Actions.Commission = 5
		}
	}
	res = Compute(inv, snap, Options{Now: planT0})
	if !slices.ContainsFunc(res.Steps, func(s Step) bool { return s.Server == "r2-n04" && s.Action == ActCommission }) {
		t.Errorf("control: no commission step for r2-n04: %v", res.Steps)
	}
}
