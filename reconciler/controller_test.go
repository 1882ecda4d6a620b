package reconciler

import (
	"testing"
	"time"

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
	if !c.tryStart(step, obs, time.Now()) {
		t.Fatal("tryStart refused an idle server")
	}
	c.unreserve(step, obs)
	if _, ok := c.inflight["s1"]; ok || c.busy["s1"] || c.running != 0 || c.bmcUse["https://b1"] != 0 {
		t.Errorf("after unreserve: inflight %v busy %v running %d bmcUse %d", c.inflight, c.busy, c.running, c.bmcUse["https://b1"])
	}
}
