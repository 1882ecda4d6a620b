package state_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/machina-metal/machina/state"
)

// openEtcdPair opens two stores on one etcd prefix, each with its own
// client: two controllers of one site.
func openEtcdPair(t *testing.T) (*state.Store, *state.Store) {
	t.Helper()
	c := sharedCluster(t)
	prefix := prefixFor(filepath.Join(t.TempDir(), "pair"))
	var out []*state.Store
	for range 2 {
		s, err := state.OpenEtcd(state.EtcdConfig{Endpoints: c.Endpoints(), Prefix: prefix}, state.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		out = append(out, s)
	}
	return out[0], out[1]
}

// TestEtcdTwoControllersCAS: two stores (two processes' worth: separate
// clients, separate write locks) race 32 compare-and-set moves of one
// server; exactly one wins, the others see ErrStaleTransition, and exactly
// one lifecycle event is written. Then both create 20 servers each at once
// and both list all 40.
func TestEtcdTwoControllersCAS(t *testing.T) {
	a, b := openEtcdPair(t)
	mustCreate(t, a, state.Server{Name: "n1", Lifecycle: state.LifecycleReady})
	var wins, stale atomic.Int32
	var wg sync.WaitGroup
	for i := range 32 {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Transition("n1", state.LifecycleReady, state.LifecycleAllocated, "race")
			switch {
			case err == nil:
				wins.Add(1)
			case errors.Is(err, state.ErrStaleTransition):
				stale.Add(1)
			default:
				t.Errorf("Transition: %v", err)
			}
		}()
	}
	wg.Wait()
	if wins.Load() != 1 || stale.Load() != 31 {
		t.Fatalf("wins %d stale %d, want 1 and 31", wins.Load(), stale.Load())
	}
	evs := allEvents(t, b, state.EventQuery{Server: "n1"})
	moves := 0
	for _, e := range evs {
		if e.To == state.LifecycleAllocated {
			moves++
		}
	}
	if moves != 1 {
		t.Fatalf("%d allocated events, want 1: %+v", moves, evs)
	}

	for i := range 40 {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.CreateServer(state.Server{Name: fmt.Sprintf("m%02d", i)}); err != nil {
				t.Errorf("CreateServer: %v", err)
			}
		}()
	}
	wg.Wait()
	for _, s := range []*state.Store{a, b} {
		snap, err := s.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if len(snap.Servers) != 41 {
			t.Fatalf("snapshot has %d servers, want 41", len(snap.Servers))
		}
	}
	if err := a.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestEtcdFence: with a fence on the leader key of a real
// concurrency.Election, writes commit while the campaign holds; after the
// leader resigns (or another campaign wins), every write fails with
// ErrNotLeader and writes nothing, while reads go on. A bbolt store refuses
// a fence.
func TestEtcdFence(t *testing.T) {
	a, b := openEtcdPair(t)
	cli := sharedClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	election := "/fence-test/" + prefixFor(t.Name())
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	el := concurrency.NewElection(sess, election)
	if err := el.Campaign(ctx, "controller-a"); err != nil {
		t.Fatal(err)
	}
	if err := a.SetFence(&state.Fence{Key: el.Key(), Revision: el.Rev(), Value: "controller-a"}); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, a, state.Server{Name: "n1", Lifecycle: state.LifecycleReady})
	if _, err := a.Transition("n1", state.LifecycleReady, state.LifecycleAllocated, "leader"); err != nil {
		t.Fatalf("fenced write while leading: %v", err)
	}
	if err := el.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	// Another controller campaigns and wins: a new leader key.
	sess2, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer sess2.Close()
	el2 := concurrency.NewElection(sess2, election)
	if err := el2.Campaign(ctx, "controller-b"); err != nil {
		t.Fatal(err)
	}
	before := allEvents(t, b, state.EventQuery{})
	_, err = a.Transition("n1", state.LifecycleAllocated, state.LifecycleDeploying, "deposed")
	if !errors.Is(err, state.ErrNotLeader) {
		t.Fatalf("write after losing leadership = %v, want ErrNotLeader", err)
	}
	if _, err := a.CreateServer(state.Server{Name: "n2"}); !errors.Is(err, state.ErrNotLeader) {
		t.Fatalf("CreateServer after losing leadership = %v, want ErrNotLeader", err)
	}
	if _, _, err := a.IssueToken(state.TokenSpec{Purpose: state.PurposeBoot, Server: "n1"}); !errors.Is(err, state.ErrNotLeader) {
		t.Fatalf("IssueToken after losing leadership = %v, want ErrNotLeader", err)
	}
	srv, err := a.Server("n1")
	if err != nil || srv.Lifecycle != state.LifecycleAllocated {
		t.Fatalf("deposed read = %v %v, want allocated", srv.Lifecycle, err)
	}
	if _, err := b.Server("n2"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("n2 written by the deposed leader: %v", err)
	}
	if after := allEvents(t, b, state.EventQuery{}); len(after) != len(before) {
		t.Fatalf("events %d → %d: the deposed leader wrote events", len(before), len(after))
	}
	// The new leader's fence admits its writes.
	if err := b.SetFence(&state.Fence{Key: el2.Key(), Revision: el2.Rev()}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Transition("n1", state.LifecycleAllocated, state.LifecycleDeploying, "new leader"); err != nil {
		t.Fatalf("new leader's write: %v", err)
	}
	// The election key gone (lease lapsed): fenced writes stop too.
	if _, err := cli.Revoke(ctx, sess2.Lease()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Transition("n1", state.LifecycleDeploying, state.LifecycleDeployed, "lapsed"); !errors.Is(err, state.ErrNotLeader) {
		t.Fatalf("write after the lease lapsed = %v, want ErrNotLeader", err)
	}
	if err := b.SetFence(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Transition("n1", state.LifecycleDeploying, state.LifecycleDeployed, "unfenced"); err != nil {
		t.Fatalf("unfenced write: %v", err)
	}

	bs := openTest(t, state.Options{})
	if err := bs.SetFence(&state.Fence{Key: "k", Revision: 1}); !errors.Is(err, state.ErrFenceUnsupported) {
		t.Fatalf("bbolt SetFence = %v, want ErrFenceUnsupported", err)
	}
}

// TestEtcdMustExist: MustExist refuses an empty prefix (a mistyped prefix
// must not start a new, empty site) and opens an existing one.
func TestEtcdMustExist(t *testing.T) {
	c := sharedCluster(t)
	prefix := prefixFor(filepath.Join(t.TempDir(), "mustexist"))
	cfg := state.EtcdConfig{Endpoints: c.Endpoints(), Prefix: prefix}
	if _, err := state.OpenEtcd(cfg, state.Options{MustExist: true}); !errors.Is(err, state.ErrNoStateFile) {
		t.Fatalf("OpenEtcd(MustExist) on an empty prefix = %v, want ErrNoStateFile", err)
	}
	resp, err := sharedClient(t).Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("MustExist wrote %d keys (%v)", resp.Count, err)
	}
	s, err := state.OpenEtcd(cfg, state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = state.OpenEtcd(cfg, state.Options{MustExist: true})
	if err != nil {
		t.Fatalf("OpenEtcd(MustExist) on a site: %v", err)
	}
	if s.Engine() != "etcd" {
		t.Fatalf("Engine = %s", s.Engine())
	}
	s.Close()
	if _, err := s.Server("x"); !errors.Is(err, state.ErrClosed) {
		t.Fatalf("read after Close = %v, want ErrClosed", err)
	}
}

// TestEtcdEventKeysBounded: on etcd the retention rule bounds the keys the
// event log holds, not only what Events returns: with MaxEvents 20 and
// MaxPerServer 5, after 10 servers × 30 events the prefix holds 20 event
// records, at most 20 per-server index records (at most 5 per server), and
// one index bucket per server that still has events; Prune by age then
// empties both, in batches (etcd's --max-txn-ops).
func TestEtcdEventKeysBounded(t *testing.T) {
	c := newClock()
	path := filepath.Join(t.TempDir(), "retention")
	s, err := openEngine(&etcdNamed{t}, path, state.Options{Now: c.Now,
		Retention: state.Retention{MaxEvents: 20, MaxPerServer: 5, MaxAge: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 10 {
		mustCreate(t, s, state.Server{Name: fmt.Sprintf("s%d", i)})
	}
	for range 30 {
		for i := range 10 {
			if _, err := s.AppendEvent(state.Event{Server: fmt.Sprintf("s%d", i), Message: "tick"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	count := func(sub string) int64 {
		resp, err := sharedClient(t).Get(context.Background(), prefixFor(path)+sub, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	if n := count("k/events="); n != 20 {
		t.Errorf("%d event records in etcd, want 20", n)
	}
	if n := count("k/server_events/"); n > 20 {
		t.Errorf("%d per-server index records, want at most 20", n)
	}
	for i := range 10 {
		if n := count(fmt.Sprintf("k/server_events/s%d=", i)); n > 5 {
			t.Errorf("s%d: %d index records, want at most 5", i, n)
		}
	}
	if n := count("m/server_events/"); n > 10 {
		t.Errorf("%d index buckets, want at most 10", n)
	}
	c.Advance(2 * time.Hour)
	res, err := s.Prune()
	if err != nil || res.Events != 20 {
		t.Fatalf("Prune = %+v, %v; want 20 events", res, err)
	}
	if n := count("k/events=") + count("k/server_events/") + count("m/server_events/"); n != 0 {
		t.Errorf("%d event keys after the age prune, want 0", n)
	}
}

// etcdNamed makes openEngine pick etcd outside an eachEngine subtest.
type etcdNamed struct{ *testing.T }

func (e *etcdNamed) Name() string { return e.T.Name() + "/etcd" }

// TestEtcdNotifyAcrossControllers: Notify and SecretsChanged of one store
// fire for another store's commits on the same site (a standby's event
// stream and BMC sweep see the leader's writes).
func TestEtcdNotifyAcrossControllers(t *testing.T) {
	a, b := openEtcdPair(t)
	ch, stop := b.Notify()
	defer stop()
	secrets := b.SecretsChanged()
	time.Sleep(200 * time.Millisecond) // let the watches start
	if _, err := a.AppendEvent(state.Event{Message: "from a"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("b's Notify did not fire for a's event")
	}
	if _, err := a.PutSecret("bmc-x", state.Credential{Username: "u", Password: "p"}, "ops"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-secrets:
	case <-time.After(10 * time.Second):
		t.Fatal("b's SecretsChanged did not fire for a's PutSecret")
	}
}
