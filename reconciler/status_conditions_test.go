package reconciler

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/state"
)

// TestStatusShowsProfileConditions (issue 10, "not enough servers: a clear
// status condition"): a profile whose count too few ready servers fit is
// said in the committed status tree, not only in the API's plan: the
// plan's InsufficientCapacity condition reaches status/inventory.yaml
// under conditions: (subject, type, reason, message) and a line of
// status/README.md; the brake's Held condition stays under held: only, and
// server conditions are left to the server files.
func TestStatusShowsProfileConditions(t *testing.T) {
	inv := exampleInventory(t)
	c := cloneInv(inv)
	c.Profile("hypervisor").Count = 9
	snap := observe(c, state.LifecycleReady, bigHW)
	plan := Plan(c, snap, PlanOptions{Now: planT0.Add(time.Minute)})
	var capacity *PlanCondition
	for i, pc := range plan.Conditions {
		if pc.Subject == "profile/hypervisor" && pc.Type == "InsufficientCapacity" {
			capacity = &plan.Conditions[i]
		}
	}
	if capacity == nil {
		t.Fatalf("plan has no InsufficientCapacity condition for hypervisor: %+v", plan.Conditions)
	}
	// A hold and a server condition next to it, as a real plan can have.
	plan.Brake = "held until approved (machinactl approve 0123456789ab): test"
	plan.Conditions = append(plan.Conditions,
		PlanCondition{Subject: "inventory", Type: "Held", Reason: "SafetyBrake", Message: plan.Brake},
		PlanCondition{Subject: "server/r1-n01", Type: "Orphaned", Reason: "NotInInventory", Message: "not in servers.yaml"})

	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	b := &StatusBuilder{Store: st}
	out, err := b.Build(InventoryStatus{Good: RevisionRef{Commit: "0123456789abcdef0123456789abcdef01234567", Digest: inv.Digest}}, nil, plan)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Inventory.Conditions) != 1 || out.Inventory.Conditions[0] != *capacity {
		t.Fatalf("inventory conditions %+v, want only %+v", out.Inventory.Conditions, *capacity)
	}

	files, errs := renderStatus(out, 5)
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	got := map[string]string{}
	for _, f := range files {
		got[f.path] = string(f.data)
	}
	var doc struct {
		Valid      bool `yaml:"valid"`
		Held       struct{ Reason string }
		Conditions []struct{ Subject, Type, Reason, Message string }
	}
	if err := yamlUnmarshal([]byte(got["status/inventory.yaml"]), &doc); err != nil {
		t.Fatalf("status/inventory.yaml does not parse: %v\n%s", err, got["status/inventory.yaml"])
	}
	if len(doc.Conditions) != 1 {
		t.Fatalf("status/inventory.yaml conditions %+v:\n%s", doc.Conditions, got["status/inventory.yaml"])
	}
	if d := doc.Conditions[0]; d.Subject != "profile/hypervisor" || d.Type != "InsufficientCapacity" || d.Reason != "NotEnoughReadyServers" ||
		!strings.Contains(d.Message, "count 9 wants 9 more servers; 5 ready servers fit (zone zone-a") {
		t.Errorf("status/inventory.yaml condition %+v", d)
	}
	if !strings.Contains(doc.Held.Reason, "machinactl approve 0123456789ab") {
		t.Errorf("held: %+v", doc.Held)
	}
	readme := got["status/README.md"]
	if !strings.Contains(readme, "**profile/hypervisor InsufficientCapacity** (NotEnoughReadyServers): count 9 wants 9 more servers; 5 ready servers fit") {
		t.Errorf("status/README.md does not say the profile lacks servers:\n%s", readme)
	}
	if strings.Contains(readme, "Orphaned** (") || strings.Contains(readme, "Held** (") {
		t.Errorf("status/README.md lists a server condition or the hold as a profile condition:\n%s", readme)
	}
}
