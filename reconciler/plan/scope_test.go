package plan

import (
	"strings"
	"testing"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// allocations maps the plan's allocated servers to their profiles.
func allocations(res Result) map[string]string {
	out := map[string]string{}
	for _, s := range res.Steps {
		if s.Action == ActAllocate {
			out[s.Server] = s.Profile
		}
	}
	return out
}

// allocatedTo counts the plan's allocations to profile.
func allocatedTo(res Result, profile string) int {
	n := 0
	for _, p := range allocations(res) {
		if p == profile {
			n++
		}
	}
	return n
}

// TestScopePlanFilter: a group of zone-a plans only zone-a's servers and
// the zone-a profile (hypervisor, count 2): the ready fleet allocates two
// zone-a servers and nothing in zone-b or zone-c, the records of other
// zones are not in its view (not even as Orphaned), a record servers.yaml
// no longer names counts by its recorded zone, and a zone-less profile is
// reported, not planned.
func TestScopePlanFilter(t *testing.T) {
	inv := cloneInv(exampleInventory(t))
	inv.Profiles = append(inv.Profiles, inventory.Profile{Name: "anywhere", Image: inv.Profiles[0].Image, Count: 1})
	have := observe(inv, state.LifecycleReady, bigHW)
	have.Servers["gone-b"] = &state.Server{Name: "gone-b", Zone: "zone-b", Lifecycle: state.LifecycleReady}
	have.Servers["gone-a"] = &state.Server{Name: "gone-a", Zone: "zone-a", Lifecycle: state.LifecycleReady}
	sc := Scope{Group: "east", Zones: []string{"zone-a"}}
	want, snap, conds := sc.Apply(map[string][]string{"east": {"zone-a"}, "west": {"zone-b", "zone-c"}}, inv, have)
	for _, s := range want.Servers {
		if s.Zone != "zone-a" {
			t.Errorf("scoped inventory holds %s of %s", s.Name, s.Zone)
		}
	}
	if len(want.Servers) != 5 || len(want.Profiles) != 1 || want.Profiles[0].Name != "hypervisor" || want.Digest != inv.Digest {
		t.Fatalf("scoped inventory: %d servers, profiles %+v, digest %q", len(want.Servers), want.Profiles, want.Digest)
	}
	if _, ok := snap.Servers["gone-b"]; ok {
		t.Error("a zone-b record is in zone-a's view")
	}
	if _, ok := snap.Servers["gone-a"]; !ok {
		t.Error("a zone-a record servers.yaml no longer names is not in zone-a's view")
	}
	if len(conds) != 1 || conds[0].Subject != "profile/anywhere" || conds[0].Type != CondProfileOutOfScope {
		t.Fatalf("conditions = %+v, want one ProfileOutOfScope for profile/anywhere", conds)
	}
	// A claimed zone no server is in: a warning condition.
	sc.Zones = append(sc.Zones, "zone-x")
	if _, _, conds := sc.Apply(nil, inv, have); len(conds) != 2 || conds[0].Type != CondZoneHasNoServers || !strings.Contains(conds[0].Message, "zone-x") {
		t.Fatalf("conditions with zone-x = %+v, want ZoneHasNoServers naming zone-x first", conds)
	}
	sc.Zones = sc.Zones[:1]
	res := Compute(want, snap, Options{Now: planT0})
	got := allocations(res)
	if len(got) != 2 {
		t.Fatalf("allocations = %v, want two hypervisors", got)
	}
	for srv, prof := range got {
		if !strings.HasPrefix(srv, "r1-") || prof != "hypervisor" {
			t.Errorf("allocation %s → %s outside zone-a's scope", srv, prof)
		}
	}
	for _, c := range res.Conditions {
		if c.Subject == "server/gone-b" {
			t.Errorf("zone-b record shows in zone-a's plan: %+v", c)
		}
	}
	// Without a scope the same inputs plan every zone (the single
	// controller, unchanged).
	if all := allocations(Compute(inv, have, Options{Now: planT0})); len(all) != 4 {
		t.Fatalf("unscoped allocations = %v, want hypervisor×2, storage, anywhere", all)
	}
}

// TestScopeOverlapRefused: two groups claiming zone-b: neither plans
// zone-b's servers or its profile, each gets a ZoneClaimConflict
// condition naming both groups, and their other zones plan as usual.
func TestScopeOverlapRefused(t *testing.T) {
	inv := exampleInventory(t)
	have := observe(inv, state.LifecycleReady, bigHW)
	claims := map[string][]string{"east": {"zone-a", "zone-b"}, "west": {"zone-b", "zone-c"}}
	for _, g := range []struct {
		sc    Scope
		other string
		free  string // the group's zone nobody else claims
	}{
		{Scope{Group: "east", Zones: []string{"zone-a", "zone-b"}}, "west", "r1-"},
		{Scope{Group: "west", Zones: []string{"zone-b", "zone-c"}}, "east", "r3-"},
	} {
		want, snap, conds := g.sc.Apply(claims, inv, have)
		for _, s := range want.Servers {
			if s.Zone == "zone-b" {
				t.Errorf("%s: contested server %s planned", g.sc.Group, s.Name)
			}
		}
		for name := range snap.Servers {
			if strings.HasPrefix(name, "r2-") {
				t.Errorf("%s: contested record %s in view", g.sc.Group, name)
			}
		}
		var servers, profiles int
		for _, c := range conds {
			if c.Type != CondZoneClaimConflict {
				continue
			}
			if !strings.Contains(c.Message, g.sc.Group) || !strings.Contains(c.Message, g.other) || !strings.Contains(c.Message, "zone-b") {
				t.Errorf("%s: condition %q does not name both groups and the zone", g.sc.Group, c.Message)
			}
			switch {
			case strings.HasPrefix(c.Subject, "server/r2-"):
				servers++
			case c.Subject == "profile/storage":
				profiles++
			default:
				t.Errorf("%s: conflict on %s", g.sc.Group, c.Subject)
			}
		}
		if servers != 4 || profiles != 1 {
			t.Errorf("%s: %d server and %d profile conflicts, want 4 and 1", g.sc.Group, servers, profiles)
		}
		for srv := range allocations(Compute(want, snap, Options{Now: planT0})) {
			if !strings.HasPrefix(srv, g.free) {
				t.Errorf("%s: allocates %s", g.sc.Group, srv)
			}
		}
	}
}
