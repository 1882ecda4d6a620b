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

// TestSmallestKeysIsSortedPrefix: for random key sets full of ties in
// cores, memory and disk, and every n from 0 past the set's size,
// smallestKeys returns exactly the first n keys of the fully sorted set,
// so a profile's top-up picks the same servers in the same order as
// when every candidate was sorted.
func TestSmallestKeysIsSortedPrefix(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		rng := rand.New(rand.NewPCG(seed, 11))
		var keys []candidateKey
		for i := range rng.IntN(200) {
			keys = append(keys, candidateKey{cores: 4 * rng.IntN(3), mem: int64(rng.IntN(3)), disk: int64(rng.IntN(2)), name: fmt.Sprintf("s%03d", i)})
		}
		rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		want := append([]candidateKey(nil), keys...)
		sort.Slice(want, func(i, j int) bool { return compareCandidates(want[i], want[j]) < 0 })
		for n := 0; n <= len(keys)+2; n++ {
			got := smallestKeys(append([]candidateKey(nil), keys...), n)
			w := want[:min(n, len(want))]
			if len(w) == 0 {
				w = nil
			}
			if len(got) == 0 {
				got = nil
			}
			if !reflect.DeepEqual(got, w) {
				t.Fatalf("seed %d: smallestKeys(%d keys, %d) = %v, want %v", seed, len(keys), n, got, w)
			}
		}
	}
}

// TestSortedNamesTrustsOnlyExactNames: a snapshot's Names are used only
// when they are exactly the sorted key set; stale ones (a server added,
// one removed, one replaced, out of order, duplicated) give the keys
// sorted afresh.
func TestSortedNamesTrustsOnlyExactNames(t *testing.T) {
	servers := map[string]state.Server{"a": {}, "b": {}, "c": {}}
	want := []string{"a", "b", "c"}
	for _, names := range [][]string{nil, {"a", "b", "c"}, {"a", "b"}, {"a", "b", "c", "d"}, {"a", "b", "d"}, {"b", "a", "c"}, {"a", "a", "c"}} {
		got := sortedNames(state.Snapshot{Servers: servers, Names: names})
		if !reflect.DeepEqual(got, want) {
			t.Errorf("sortedNames(Names %q) = %q, want %q", names, got, want)
		}
	}
}
