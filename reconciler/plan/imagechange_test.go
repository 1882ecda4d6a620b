package plan

import (
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// TestPlanSaysWhichImageChangeApplies: after a profile's image changed,
// the plan says per allocated server whether the change applies to the
// running deploy (the write has not started) or on the next redeploy.
func TestPlanSaysWhichImageChangeApplies(t *testing.T) {
	inv := &inventory.Inventory{Profiles: []inventory.Profile{{Name: "p", Image: "new", Deploy: inventory.DeployImage, Zone: "z"}}}
	alloc := func(served bool) *state.Allocation {
		a := &state.Allocation{Profile: "p", Image: "old", Deploy: "image"}
		if served {
			a.PlanServedAt = time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
		}
		return a
	}
	have := state.Snapshot{Servers: map[string]*state.Server{
		"a": {Name: "a", Lifecycle: state.LifecycleAllocated, Allocation: alloc(false)},
		"b": {Name: "b", Lifecycle: state.LifecycleDeploying, Allocation: alloc(false)},
		"c": {Name: "c", Lifecycle: state.LifecycleDeploying, Allocation: alloc(true)},
		"d": {Name: "d", Lifecycle: state.LifecycleDeployed, Allocation: alloc(true)},
		"e": {Name: "e", Lifecycle: state.LifecycleDeployed, Allocation: &state.Allocation{Profile: "p", Image: "new", Deploy: "image"}},
	}}
	got := map[string]Condition{}
	for _, c := range imageChanged(inv, have, sortedKeys(have.Servers)) {
		got[strings.TrimPrefix(c.Subject, "server/")] = c
	}
	want := map[string]string{"a": ReasonReplanBeforeWrite, "b": ReasonReplanBeforeWrite, "c": ReasonAppliesOnRedeploy, "d": ReasonAppliesOnRedeploy}
	if len(got) != len(want) {
		t.Fatalf("conditions %+v, want %v", got, want)
	}
	for name, reason := range want {
		if c := got[name]; c.Type != CondImageChanged || c.Reason != reason {
			t.Errorf("%s: %+v, want %s/%s", name, c, CondImageChanged, reason)
		}
	}
	if !strings.Contains(got["d"].Message, "applies on the next redeploy") || !strings.Contains(got["a"].Message, "this deploy writes new") {
		t.Errorf("messages: %q / %q", got["d"].Message, got["a"].Message)
	}
}
