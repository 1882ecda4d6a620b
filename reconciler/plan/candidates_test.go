package plan

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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
		snap := state.Snapshot{Servers: map[string]*state.Server{}}
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
			snap.Servers[name] = &state.Server{Name: name, Lifecycle: lifecycles[rng.IntN(len(lifecycles))], Hardware: hw}
		}
		var want []state.Server
		for _, ws := range inv.Servers {
			if obs, ok := snap.Servers[ws.Name]; ok && obs.Lifecycle == state.LifecycleReady && Fits(p.Min, obs.Hardware) {
				want = append(want, *obs)
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
	servers := map[string]*state.Server{"a": {}, "b": {}, "c": {}}
	want := []string{"a", "b", "c"}
	for _, names := range [][]string{nil, {"a", "b", "c"}, {"a", "b"}, {"a", "b", "c", "d"}, {"a", "b", "d"}, {"b", "a", "c"}, {"a", "a", "c"}} {
		got := sortedNames(state.Snapshot{Servers: servers, Names: names})
		if !reflect.DeepEqual(got, want) {
			t.Errorf("sortedNames(Names %q) = %q, want %q", names, got, want)
		}
	}
}

// TestCountTopUpsTakeCandidatesPrefix: over random fleets with three
// zoned profiles, count allocations already held (of every lifecycle)
// and random counts, each profile's count top-up in Compute allocates
// exactly the first "count minus held" of Candidates (with the servers the
// earlier profiles took excluded), in that order of preference: what the
// plan did when it sorted every candidate of every profile. The plan is
// the same with the snapshot's Names given and not.
func TestCountTopUpsTakeCandidatesPrefix(t *testing.T) {
	lifecycles := []state.Lifecycle{state.LifecycleReady, state.LifecycleReady, state.LifecycleReady, state.LifecycleCommissioning, state.LifecycleDeployed, state.LifecycleAllocated, state.LifecycleDeploying}
	zones := []string{"za", "zb", "zc"}
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 13))
		inv := &inventory.Inventory{Digest: "sha256:0123456789abcdef"}
		snap := state.Snapshot{Servers: map[string]*state.Server{}}
		for i := range 400 {
			ws := inventory.Server{Name: fmt.Sprintf("s%03d", i), Zone: zones[rng.IntN(3)], Want: inventory.WantReady, BootMAC: fmt.Sprintf("52:54:00:00:%02x:%02x", i>>8, i&0xff),
				BMC: inventory.BMC{Driver: inventory.DriverIPMI, Address: fmt.Sprintf("bmc-%d", i), Credentials: "c"}}
			inv.Servers = append(inv.Servers, ws)
			if rng.IntN(10) == 0 {
				continue // no record yet
			}
			o := Record(&ws)
			o.Lifecycle = lifecycles[rng.IntN(len(lifecycles))]
			o.Hardware = hwOf(4+4*rng.IntN(3), int64(16<<rng.IntN(3)), int64(50+50*rng.IntN(4)), int64(100+100*rng.IntN(3)))
			switch o.Lifecycle {
			case state.LifecycleDeployed, state.LifecycleAllocated, state.LifecycleDeploying:
				o.Allocation = &state.Allocation{Profile: "p-" + zones[rng.IntN(3)], Reason: ReasonCount, At: time.Unix(int64(i), 0)}
			}
			snap.Servers[ws.Name] = &o
		}
		heldBy := map[string]int{}
		for _, s := range snap.Servers {
			if s.Allocation != nil {
				heldBy[s.Allocation.Profile]++
			}
		}
		for _, z := range zones { // counts around what is held: top-ups, releases, none
			inv.Profiles = append(inv.Profiles, inventory.Profile{Name: "p-" + z, Zone: z, Image: "img", Count: max(0, heldBy["p-"+z]+rng.IntN(40)-8), Min: inventory.Min{Cores: 8, MemoryGiB: 32, DiskGiB: 100}})
		}
		res := Compute(inv, snap, Options{Now: time.Unix(1000, 0)})
		got := map[string][]string{}
		planned := map[string]string{}
		for _, st := range res.Steps {
			if st.Action == ActAllocate && st.AllocReason == ReasonCount {
				got[st.Profile] = append(got[st.Profile], st.Server)
			} else if st.Action == ActAllocate {
				planned[st.Server] = st.Profile
			}
		}
		allocs := 0
		for _, p := range inv.Profiles {
			held := 0
			for _, s := range snap.Servers {
				if a := s.Allocation; a != nil && a.Profile == p.Name && a.Reason == ReasonCount {
					held++
				}
			}
			var want []string
			for _, c := range Candidates(p, inv, snap, planned) {
				if len(want) >= p.Count-held { // none when held reaches the count
					break
				}
				want = append(want, c.Name)
				planned[c.Name] = p.Name
			}
			slices.Sort(want)
			slices.Sort(got[p.Name])
			if !slices.Equal(got[p.Name], want) {
				t.Fatalf("seed %d: profile %s allocates %v, want %v", seed, p.Name, got[p.Name], want)
			}
			allocs += len(want)
		}
		if allocs == 0 {
			t.Fatalf("seed %d: no top-up at all: the fleet tests too little", seed)
		}
		snap.Names = slices.Sorted(maps.Keys(snap.Servers))
		if d := cmp.Diff(res, Compute(inv, snap, Options{Now: time.Unix(1000, 0)})); d != "" {
			t.Fatalf("seed %d: the plan differs with the snapshot's Names given (-without +with):\n%s", seed, d)
		}
	}
}
