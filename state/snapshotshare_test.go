package state_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/machina-metal/machina/state"
)

// TestSnapshotEqualsFreshDecode: on each engine, over random fleets and
// random sequences of writes (creates, updates of hardware, action
// counters, allocations and errors, lifecycle moves, renames that delete
// a record), every Snapshot equals one decoded from the stored bytes
// without the decode cache, Names are the sorted server names, and what
// a caller does to an earlier snapshot (setting fields, replacing
// pointers and maps, adding and deleting keys) reaches neither the store
// nor a later snapshot.
func TestSnapshotEqualsFreshDecode(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		for seed := uint64(1); seed <= 3; seed++ {
			s := openTest(t, state.Options{NoSync: true})
			rng := rand.New(rand.NewPCG(seed, 5))
			var prev state.Snapshot
			for step := range 60 {
				randomWrite(t, s, rng, step)
				if prev.Servers != nil {
					scribble(prev)
				}
				got, err := s.Snapshot()
				if err != nil {
					t.Fatal(err)
				}
				want, err := state.FreshSnapshot(s)
				if err != nil {
					t.Fatal(err)
				}
				if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
					t.Fatalf("seed %d step %d: Snapshot differs from a fresh decode (-fresh +cached):\n%s", seed, step, d)
				}
				if err := s.CheckSharedRecords(); err != nil {
					t.Fatalf("seed %d step %d: %v", seed, step, err)
				}
				prev = got
			}
		}
	})
}

// randomWrite makes one random write to s's fleet of at most 12 servers.
func randomWrite(t *testing.T, s *state.Store, rng *rand.Rand, step int) {
	t.Helper()
	name := fmt.Sprintf("r%02d", rng.IntN(12))
	if _, err := s.Server(name); err != nil {
		mustCreate(t, s, state.Server{Name: name, Lifecycle: state.LifecycleReady, BootMAC: fmt.Sprintf("52:54:02:00:00:%02x", step)})
		return
	}
	var err error
	switch rng.IntN(4) {
	case 0:
		_, err = s.UpdateServer(name, func(srv *state.Server) error {
			srv.Hardware = &state.Hardware{Cores: rng.IntN(64), Disks: []state.Disk{{Name: "sda", SizeBytes: int64(rng.IntN(1 << 20))}}, NICs: []state.NIC{{Name: "eno1", MAC: "52:54:03:00:00:01"}}}
			return nil
		})
	case 1:
		_, err = s.UpdateServer(name, func(srv *state.Server) error {
			if srv.Actions == nil {
				srv.Actions = map[string]int64{}
			}
			srv.Actions["commission"]++
			srv.LastError = fmt.Sprint("e", step)
			srv.Allocation = &state.Allocation{Profile: fmt.Sprint("p", rng.IntN(3)), At: time.Unix(int64(step), 0).UTC()}
			return nil
		})
	case 2:
		_, err = s.Transition(name, state.LifecycleReady, state.LifecycleCommissioning, "test")
		if err != nil { // not ready: any other move is as good a write
			_, err = s.UpdateServer(name, func(srv *state.Server) error { srv.Failures++; return nil })
		}
	default:
		to := fmt.Sprintf("r%02d", 12+rng.IntN(4))
		if _, gerr := s.Server(to); gerr == nil {
			return
		}
		_, err = s.AdoptServer(name, to, "test")
	}
	if err != nil {
		t.Fatalf("write %d to %s: %v", step, name, err)
	}
}

// scribble changes an earlier snapshot the ways its contract allows: a
// record is copied before it is changed, and the map is the caller's.
func scribble(snap state.Snapshot) {
	for name, shared := range snap.Servers {
		srv := *shared
		srv.LastError = "scribbled"
		srv.Hardware = &state.Hardware{Cores: -1}
		srv.Actions = map[string]int64{"commission": -1}
		srv.Allocation = nil
		snap.Servers[name] = &srv
		delete(snap.Servers, name)
		break
	}
	snap.Servers["scribbled"] = &state.Server{Name: "scribbled"}
}

// TestEtcdSnapshotSeesOtherWriters: on etcd, where another controller
// writes the same site, a store's snapshots (its decode cache filled by
// its own earlier reads and writes) equal a fresh decode after every
// write the other store makes, and after its own.
func TestEtcdSnapshotSeesOtherWriters(t *testing.T) {
	t.Run("etcd", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state.db")
		a := openAt(t, path, state.Options{NoSync: true})
		b, err := openEngine(t, path, state.Options{NoSync: true, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		rng := rand.New(rand.NewPCG(9, 9))
		for step := range 80 {
			w := b
			if rng.IntN(3) == 0 {
				w = a
			}
			randomWrite(t, w, rng, step)
			got, err := a.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			want, err := state.FreshSnapshot(a)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
				t.Fatalf("step %d: Snapshot differs from a fresh decode (-fresh +cached):\n%s", step, d)
			}
		}
	})
}

// TestSnapshotSharesRecords: on each engine, two snapshots with no write
// between them hand out the same record (the decode cache's entry, not a
// copy); a write gives the next snapshot a new record and leaves the one
// an earlier snapshot holds as it was (entries are never changed in
// place).
func TestSnapshotSharesRecords(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{NoSync: true})
		mustCreate(t, s, state.Server{Name: "a", Lifecycle: state.LifecycleReady, BootMAC: "52:54:02:00:01:01"})
		mustCreate(t, s, state.Server{Name: "b", Lifecycle: state.LifecycleReady, BootMAC: "52:54:02:00:01:02"})
		first, err := s.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		second, err := s.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"a", "b"} {
			if first.Servers[n] == nil || first.Servers[n] != second.Servers[n] {
				t.Errorf("server %s: snapshots hold %p and %p, want one shared record", n, first.Servers[n], second.Servers[n])
			}
		}
		if _, err := s.UpdateServer("a", func(srv *state.Server) error { srv.LastError = "changed"; return nil }); err != nil {
			t.Fatal(err)
		}
		third, err := s.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if third.Servers["a"] == first.Servers["a"] || third.Servers["a"].LastError != "changed" {
			t.Errorf("after a write: snapshot's a = %p %q, want a new record with the change", third.Servers["a"], third.Servers["a"].LastError)
		}
		if first.Servers["a"].LastError != "" {
			t.Errorf("an earlier snapshot's a changed to %q: cache entries must not change in place", first.Servers["a"].LastError)
		}
		if third.Servers["b"] != first.Servers["b"] {
			t.Error("an unchanged server's record was not shared after another server's write")
		}
	})
}

// TestCheckSharedRecordsCatchesWriteThrough: the debug check finds a
// write through a shared snapshot record (which the contract forbids and
// this test makes on purpose), naming the server.
func TestCheckSharedRecordsCatchesWriteThrough(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{NoSync: true})
		mustCreate(t, s, state.Server{Name: "a", Lifecycle: state.LifecycleReady, BootMAC: "52:54:02:00:02:01"})
		snap, err := s.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if err := s.CheckSharedRecords(); err != nil {
			t.Fatalf("CheckSharedRecords before any write-through = %v, want nil", err)
		}
		snap.Servers["a"].LastError = "written through"
		err = s.CheckSharedRecords()
		if !errors.Is(err, state.ErrSharedRecordChanged) || !strings.Contains(err.Error(), "[a]") {
			t.Fatalf("CheckSharedRecords after a write-through = %v, want ErrSharedRecordChanged naming a", err)
		}
	})
}

// TestSnapshotRecordsConcurrentReaders: on each engine, readers that
// read every field of every record of their snapshots (encoding them)
// while writers change the fleet, which replaces the cache's entries. Run
// with -race, it shows that the store never writes to a record it has
// shared; every encoded record decodes under its own name and the cache
// still equals the stored bytes afterwards.
func TestSnapshotRecordsConcurrentReaders(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{NoSync: true})
		rng := rand.New(rand.NewPCG(1, 5)) // TestSnapshotEqualsFreshDecode's first sequence
		for step := range 12 {
			randomWrite(t, s, rng, step)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 3 {
			wg.Go(func() {
				for range 20 {
					snap, err := s.Snapshot()
					if err != nil {
						errs <- err
						return
					}
					for name, srv := range snap.Servers {
						b, err := json.Marshal(srv)
						var back state.Server
						if err == nil {
							err = json.Unmarshal(b, &back)
						}
						if err != nil || back.Name != name {
							errs <- fmt.Errorf("record %s: %v, encoded name %q", name, err, back.Name)
							return
						}
					}
				}
			})
		}
		for step := 12; step < 60; step++ {
			randomWrite(t, s, rng, step)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if err := s.CheckSharedRecords(); err != nil {
			t.Error(err)
		}
	})
}
