package api_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
)

// TestListCacheMatchesFreshAndInvalidates: the list, assembled from cached
// per-server JSON, equals each server fetched on its own (fresh encoding),
// before and after changes.
func TestListCacheMatchesFreshAndInvalidates(t *testing.T) {
	f := newFixture(t, state.Options{NoSync: true})
	ctx := context.Background()
	for _, n := range []string{"c1", "c2", "c3"} {
		if _, err := f.store.CreateServer(state.Server{Name: n, Zone: "z"}); err != nil {
			t.Fatal(err)
		}
	}
	compare := func(stage string) {
		t.Helper()
		list, err := f.client.ListServers(ctx, v1.ListServersOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, got := range list.Servers {
			fresh, err := f.client.Server(ctx, got.Name)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(fresh, got); diff != "" {
				t.Errorf("%s: list entry for %s differs from GET (-get +list):\n%s", stage, got.Name, diff)
			}
		}
	}
	compare("initial")
	compare("cached")
	if _, err := f.store.Transition("c2", state.LifecycleNew, state.LifecycleCommissioning, "the reconciler"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.UpdateServer("c3", func(s *state.Server) error {
		s.Hardware = &state.Hardware{Cores: 4}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.SetPower("c1", state.PowerOn, state.PowerSourceBMC); err != nil {
		t.Fatal(err)
	}
	compare("after changes")
	list, _ := f.client.ListServers(ctx, v1.ListServersOptions{})
	if list.Servers[0].Power.State != "powered_on" || list.Servers[1].Lifecycle != "commissioning" || list.Servers[2].Hardware == nil {
		t.Errorf("list after changes is stale: %+v", list.Servers)
	}
}
