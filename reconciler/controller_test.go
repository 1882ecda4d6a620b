package reconciler

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/machina-metal/machina/bmc"

	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// TestUnreserveForgetsInflight: a step reserved and then dropped as stale
// must not stay in the in-flight view, or the next pass plans as if it had
// run (an allocation that never happened, then a deploy of a ready server).
func TestUnreserveForgetsInflight(t *testing.T) {
	c := &Controller{cfg: Config{Workers: 4, PerBMC: 1, PerRack: 4}, busy: map[string]bool{}, inflight: map[string]plan.Step{},
		bmcUse: map[string]int{}, rackUse: map[string]int{}}
	step := plan.Step{Server: "s1", Action: plan.ActAllocate, Profile: "p", AllocReason: plan.ReasonCount}
	obs := state.Server{Name: "s1", Rack: "r1", BMC: state.BMCFacts{Address: "https://b1"}}
	if c.tryStart(step, &obs, time.Now()) != started {
		t.Fatal("tryStart refused an idle server")
	}
	c.unreserve(step, &obs)
	if _, ok := c.inflight["s1"]; ok || c.busy["s1"] || c.running != 0 || c.bmcUse["https://b1"] != 0 {
		t.Errorf("after unreserve: inflight %v busy %v running %d bmcUse %d", c.inflight, c.busy, c.running, c.bmcUse["https://b1"])
	}
}

// TestRestBetweenPasses: the rest after a planning pass is twice the pass,
// at least MinRest (default 100 ms), at most Interval. Without the floor
// a fast pass (a few milliseconds at 1,000 servers) rested a few
// milliseconds, so a busy fleet planned about once per store change; the
// floor plans the changes of everything that reported meanwhile together.
func TestRestBetweenPasses(t *testing.T) {
	st := openEnrolStore(t)
	drivers := driverFunc(func(context.Context, state.Server) (bmc.Driver, error) { return nil, errors.New("unused") })
	for _, tc := range []struct {
		minRest, interval, pass, want time.Duration
	}{
		{0, 0, 3 * time.Millisecond, 100 * time.Millisecond}, // the default floor
		{0, 0, 80 * time.Millisecond, 160 * time.Millisecond},
		{0, 0, 4 * time.Second, 5 * time.Second}, // capped at the default Interval
		{-1, 0, 3 * time.Millisecond, 6 * time.Millisecond},
		{time.Second, 500 * time.Millisecond, time.Millisecond, 500 * time.Millisecond},
	} {
		c, err := New(Config{Store: st, Drivers: drivers, MinRest: tc.minRest, Interval: tc.interval})
		if err != nil {
			t.Fatal(err)
		}
		if got := c.restAfter(tc.pass); got != tc.want {
			t.Errorf("MinRest %v, Interval %v: rest after a %v pass = %v, want %v", tc.minRest, tc.interval, tc.pass, got, tc.want)
		}
	}
}

// TestFirstStepsResumesInNameOrder: journal entries to resume come first,
// in name order, each server once (its planned step dropped); a stalled
// server's entry is not resumed; then the plan's steps in the plan's
// order.
func TestFirstStepsResumesInNameOrder(t *testing.T) {
	snap := state.Snapshot{Servers: map[string]*state.Server{}}
	for _, n := range []string{"s09", "s03", "s07", "s01", "s05"} {
		snap.Servers[n] = &state.Server{Name: n, InFlight: &state.InFlight{Action: string(plan.ActCommission), Counter: 2}}
	}
	snap.Servers["s02"] = &state.Server{Name: "s02", InFlight: &state.InFlight{Action: string(plan.ActCommission)}, Stalled: "x"}
	snap.Servers["s04"] = &state.Server{Name: "s04"}
	res := plan.Result{Steps: []plan.Step{{Server: "s02", Action: plan.ActRetire}, {Server: "s03", Action: plan.ActRetire}, {Server: "s04", Action: plan.ActCommission}}}
	steps := firstSteps(res, snap)
	first := map[string]plan.Step{}
	var order []string
	for _, s := range steps {
		if _, dup := first[s.Server]; dup {
			t.Errorf("%s has two first steps", s.Server)
		}
		first[s.Server] = s
		order = append(order, s.Server)
	}
	want := []string{"s01", "s03", "s05", "s07", "s09", "s02", "s04"}
	if d := cmp.Diff(want, order); d != "" {
		t.Errorf("order (-want +got):\n%s", d)
	}
	if got := first["s03"]; got.Action != plan.ActCommission || got.Counter != 2 || got.Why != "resume commission" {
		t.Errorf("s03's first step = %+v, want the resumed commission", got)
	}
	if got := first["s02"]; got.Action != plan.ActRetire {
		t.Errorf("stalled s02's first step = %+v, want the planned retire", got)
	}
}
