package gitops

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/reconciler/plan/plantest"
	"github.com/machina-metal/machina/state"
)

// TestStatusShowsProfileConditions ("not enough servers: a clear
// status condition"): a profile whose count too few ready servers fit is
// said in the committed status tree, not only in the API's plan: the
// plan's InsufficientCapacity condition reaches status/inventory.yaml
// under conditions: (subject, type, reason, message) and a line of
// status/README.md; the brake's Held condition stays under held: only, and
// server conditions are left to the server files.
func TestStatusShowsProfileConditions(t *testing.T) {
	inv := plantest.Example(t)
	c := plantest.CloneInv(inv)
	c.Profile("hypervisor").Count = 9
	snap := plantest.Observe(c, state.LifecycleReady, plantest.BigHW)
	res := plan.Compute(c, snap, plan.Options{Now: plantest.T0.Add(time.Minute)})
	var capacity *plan.Condition
	for i, pc := range res.Conditions {
		if pc.Subject == "profile/hypervisor" && pc.Type == "InsufficientCapacity" {
			capacity = &res.Conditions[i]
		}
	}
	if capacity == nil {
		t.Fatalf("plan has no InsufficientCapacity condition for hypervisor: %+v", res.Conditions)
	}
	// A hold and a server condition next to it, as a real plan can have.
	res.Brake = "held until approved (machinactl approve 0123456789ab): test"
	res.Conditions = append(res.Conditions,
		plan.Condition{Subject: "inventory", Type: "Held", Reason: "SafetyBrake", Message: res.Brake},
		plan.Condition{Subject: "server/r1-n01", Type: "Orphaned", Reason: "NotInInventory", Message: "not in servers.yaml"})

	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	b := &StatusBuilder{Store: st}
	out, err := b.Build(InventoryStatus{Good: RevisionRef{Commit: "0123456789abcdef0123456789abcdef01234567", Digest: inv.Digest}}, nil, res)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Inventory.Conditions) != 1 || out.Inventory.Conditions[0] != *capacity {
		t.Fatalf("inventory conditions %+v, want only %+v", out.Inventory.Conditions, *capacity)
	}

	files, errs := renderStatus(out, 5, nil)
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

// TestStatusServerRowShowsPlanConditions: a server's plan condition
// (Orphaned after its deletion from servers.yaml) shows in its status/
// README.md row, and its lastTransitionTime is when the builder first saw
// it, not the record's last update (a deletion does not touch the record).
func TestStatusServerRowShowsPlanConditions(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.CreateServer(state.Server{Name: "r2-n04", BootMAC: "52:54:00:02:00:04"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.BMCReadFailed("r2-n04", "bmc: login: HTTP 401"); err != nil {
		t.Fatal(err)
	}
	rec, _ := st.Server("r2-n04")
	seen := rec.UpdatedAt.Add(3 * time.Hour).Truncate(time.Second)
	b := &StatusBuilder{Store: st, Now: func() time.Time { return seen }}
	res := plan.Result{Conditions: []plan.Condition{{Subject: "server/r2-n04", Type: "Orphaned", Reason: "NotInInventory", Message: "server is not in servers.yaml any more; left as it is (new)"}}}
	out, err := b.Build(InventoryStatus{}, nil, res)
	if err != nil {
		t.Fatal(err)
	}
	var orphaned *Condition
	for i, c := range out.Servers[0].Conditions {
		if c.Type == "Orphaned" {
			orphaned = &out.Servers[0].Conditions[i]
		}
	}
	if orphaned == nil || !orphaned.LastTransitionTime.Equal(seen.UTC()) {
		t.Fatalf("Orphaned condition %+v, want lastTransitionTime %s (first seen), not the record's %s", orphaned, seen, rec.UpdatedAt)
	}
	files, errs := renderStatus(out, 5, nil)
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	for _, f := range files {
		if f.path == "status/README.md" && (!strings.Contains(string(f.data), "Orphaned=True (NotInInventory)") || !strings.Contains(string(f.data), "BMCReachable=False (ReadFailed)")) {
			t.Errorf("status/README.md's row for r2-n04 does not show Orphaned:\n%s", f.data)
		}
	}
}

// TestStatusBMCTruthConditions: insecureTLS is a warning
// condition; a persistent netboot override in place, a BMC learned not to
// honour Once, and an unverified reset each show as a condition.
func TestStatusBMCTruthConditions(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, s := range []state.Server{
		{Name: "a", BootMAC: "52:54:00:00:00:0a", BMC: state.BMCFacts{Driver: "redfish", InsecureTLS: true, RestoreDisk: true, OnceNotHonoured: true}},
		{Name: "b", BootMAC: "52:54:00:00:00:0b", BMC: state.BMCFacts{Driver: "redfish", OnceNotHonoured: true, ResetUnverified: "bmc: reset accepted but not verified: no evidence"}},
	} {
		if _, err := st.CreateServer(s); err != nil {
			t.Fatal(err)
		}
	}
	b := &StatusBuilder{Store: st, Now: time.Now}
	out, err := b.Build(InventoryStatus{}, nil, plan.Result{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, s := range out.Servers {
		for _, c := range s.Conditions {
			got[s.Name] = append(got[s.Name], c.Type+"="+c.Status+"/"+c.Reason)
		}
	}
	for name, want := range map[string][]string{
		"a": {"BMCCertificateVerified=False/InsecureTLS", "PersistentNetbootOverride=True/OnceNotHonoured"},
		"b": {"OnceBootHonoured=False/Learned", "ResetVerified=False/NoEvidence"},
	} {
		for _, w := range want {
			if !slices.Contains(got[name], w) {
				t.Errorf("%s: conditions %v lack %s", name, got[name], w)
			}
		}
	}
}
