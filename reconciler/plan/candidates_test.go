package plan

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"sort"
	"testing"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// TestCandidatesMatchRecordSort: over random fleets with many ties in
// cores, memory and disk, some records missing, not ready or never
// commissioned, Candidates returns the same records in the same order as
// filtering the ready, fitting records in servers.yaml order and sorting
// the records themselves stably by cores, memory, smallest fitting disk
// and name (what it did before it sorted keys instead of records).
func TestCandidatesMatchRecordSort(t *testing.T) {
	lifecycles := []state.Lifecycle{state.LifecycleReady, state.LifecycleReady, state.LifecycleReady, state.LifecycleCommissioning, state.LifecycleDeployed}
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		inv := &inventory.Inventory{}
		snap := state.Snapshot{Servers: map[string]state.Server{}}
		p := inventory.Profile{Name: "p", Min: inventory.Min{Cores: 8, MemoryGiB: 32, DiskGiB: 100}}
		for i := range 300 {
			name := fmt.Sprintf("s%03d", rng.IntN(1000)) // out of order, with repeats
			if _, dup := snap.Servers[name]; dup {
				continue
			}
			inv.Servers = append(inv.Servers, inventory.Server{Name: name, Want: inventory.WantReady,
				BMC: inventory.BMC{Driver: inventory.DriverIPMI, Address: fmt.Sprintf("bmc-%d", i), Credentials: "c"}})
			if rng.IntN(10) == 0 {
				continue // no record yet
			}
			var hw *state.Hardware
			if rng.IntN(8) != 0 {
				hw = hwOf(4+4*rng.IntN(3), int64(16<<rng.IntN(3)), int64(50+50*rng.IntN(4)), int64(100+100*rng.IntN(3)))
			}
			snap.Servers[name] = state.Server{Name: name, Lifecycle: lifecycles[rng.IntN(len(lifecycles))], Hardware: hw}
		}
		var want []state.Server
		for _, ws := range inv.Servers {
			if obs, ok := snap.Servers[ws.Name]; ok && obs.Lifecycle == state.LifecycleReady && Fits(p.Min, obs.Hardware) {
				want = append(want, obs)
			}
		}
		sort.SliceStable(want, func(i, j int) bool {
			a, b := want[i].Hardware, want[j].Hardware
			if a.Cores != b.Cores {
				return a.Cores < b.Cores
			}
			if a.MemoryBytes != b.MemoryBytes {
				return a.MemoryBytes < b.MemoryBytes
			}
			da, db := smallestFittingDisk(a, p.Min.DiskGiB), smallestFittingDisk(b, p.Min.DiskGiB)
			if da != db {
				return da < db
			}
			return want[i].Name < want[j].Name
		})
		got := Candidates(p, inv, snap, map[string]string{})
		if len(want) < 20 {
			t.Fatalf("seed %d: only %d candidates: the fleet tests too little", seed, len(want))
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("seed %d: Candidates differs from the record sort:\ngot  %v\nwant %v", seed, names(got), names(want))
		}
	}
}

func names(ss []state.Server) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.Name
	}
	return out
}
