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

	"github.com/machina-metal/machina/internal/etcdtest"
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
// server, 10 rounds; each round exactly one wins, the others see
// ErrStaleTransition, and one lifecycle event is written per round. Then both create 20 servers each at once
// and both list all 40.
func TestEtcdTwoControllersCAS(t *testing.T) {
	a, b := openEtcdPair(t)
	mustCreate(t, a, state.Server{Name: "n1", Lifecycle: state.LifecycleReady})
	var wg sync.WaitGroup
	cur, next := state.LifecycleReady, state.LifecycleAllocated
	const rounds = 10
	for range rounds {
		var wins, stale atomic.Int32
		start := make(chan struct{})
		for i := range 32 {
			s := a
			if i%2 == 1 {
				s = b
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, err := s.Transition("n1", cur, next, "race")
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
		close(start)
		wg.Wait()
		if wins.Load() != 1 || stale.Load() != 31 {
			t.Fatalf("%s→%s: wins %d stale %d, want 1 and 31", cur, next, wins.Load(), stale.Load())
		}
		cur, next = next, cur
	}
	evs := allEvents(t, b, state.EventQuery{Server: "n1"})
	moves := 0
	for _, e := range evs {
		if e.Kind == state.EventTransition {
			moves++
		}
	}
	if moves != rounds {
		t.Fatalf("%d lifecycle events, want %d", moves, rounds)
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

// TestEtcdSurvivesMemberLoss: a store on a 3-member cluster goes on when
// the etcd leader member is SIGKILLed mid-run: moves fail at most for the
// re-election (the caller retries, as the reconciler does) and then commit
// again; no move is lost or doubled: the server's revision and its
// lifecycle events match the moves that returned success.
func TestEtcdSurvivesMemberLoss(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{Members: 3})
	s, err := state.OpenEtcd(state.EtcdConfig{Endpoints: c.Endpoints(), Prefix: "/loss/", RequestTimeout: 3 * time.Second}, state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mustCreate(t, s, state.Server{Name: "n1", Lifecycle: state.LifecycleReady})
	cli := c.Client(t)
	leader := func() *etcdtest.Member {
		for _, m := range c.Members() {
			if !m.Running() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			st, err := cli.Status(ctx, m.ClientURL)
			cancel()
			if err == nil && st.Leader == st.Header.MemberId {
				return m
			}
		}
		return nil
	}
	cur, next := state.LifecycleReady, state.LifecycleAllocated
	ok, failed := 0, 0
	move := func() {
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := s.Transition("n1", cur, next, "loss")
			if err == nil {
				ok++
				cur, next = next, cur
				return
			}
			if errors.Is(err, state.ErrStaleTransition) {
				// An earlier attempt committed though its answer was lost:
				// the server is already where we wanted it.
				srv, rerr := s.Server("n1")
				if rerr == nil && srv.Lifecycle == next {
					ok++
					cur, next = next, cur
					return
				}
			}
			failed++
			if time.Now().After(deadline) {
				t.Fatalf("no successful move for 30 s: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for range 10 {
		move()
	}
	m := leader()
	if m == nil {
		t.Fatal("no etcd leader found")
	}
	m.Kill()
	for range 20 {
		move()
	}
	srv, err := s.Server("n1")
	if err != nil {
		t.Fatal(err)
	}
	moves := 0
	for _, e := range allEvents(t, s, state.EventQuery{Server: "n1"}) {
		if e.Kind == state.EventTransition {
			moves++
		}
	}
	t.Logf("killed leader %s; %d moves, %d failed attempts; revision %d, %d transition events", m.Name, ok, failed, srv.Revision, moves)
	if ok != 30 || moves != 30 || srv.Lifecycle != cur {
		t.Fatalf("moves %d, events %d, lifecycle %s (want 30, 30, %s)", ok, moves, srv.Lifecycle, cur)
	}
	m.Restart()
	move()
}

// TestEtcdTwoControllersTokenOnce: a single-use machine token presented
// 32 times at once to two controllers of one site is honoured exactly
// once; the other 31 see ErrTokenUsed.
func TestEtcdTwoControllersTokenOnce(t *testing.T) {
	a, b := openEtcdPair(t)
	value, _, err := a.IssueToken(state.TokenSpec{Purpose: state.PurposeReport, Server: "r1-n01", MAC: "52:54:00:00:01:01"})
	if err != nil {
		t.Fatal(err)
	}
	const n = 32
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = s.ConsumeToken(value, state.TokenClaim{Purpose: state.PurposeReport, Server: "r1-n01", MAC: "52:54:00:00:01:01"})
		}()
	}
	close(start)
	wg.Wait()
	wins := 0
	for i, err := range errs {
		switch {
		case err == nil:
			wins++
		case !errors.Is(err, state.ErrTokenUsed):
			t.Errorf("consumer %d: %v, want ErrTokenUsed", i, err)
		}
	}
	if wins != 1 {
		t.Fatalf("%d consumers succeeded, want exactly 1", wins)
	}
}

// TestEtcdOpenExistingWritesNothing: opening an existing etcd site (a
// standby controller starting, sealed secrets present) changes no key, so
// it works under a fence it does not hold.
func TestEtcdOpenExistingWritesNothing(t *testing.T) {
	c := sharedCluster(t)
	cfg := state.EtcdConfig{Endpoints: c.Endpoints(), Prefix: prefixFor(filepath.Join(t.TempDir(), "standby"))}
	key := []byte("0123456789abcdef-standby-master-key")
	s, err := state.OpenEtcd(cfg, state.Options{MasterKey: key})
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, s, state.Server{Name: "n1"})
	if _, err := s.PutSecret("bmc", state.Credential{Username: "u", Password: "p"}, "ops"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	ctx := context.Background()
	before, err := sharedClient(t).Get(ctx, cfg.Prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Fence = &state.Fence{Key: "/no-such-election/key", Revision: 1}
	s2, err := state.OpenEtcd(cfg, state.Options{MasterKey: key})
	if err != nil {
		t.Fatalf("fenced open of an existing site: %v", err)
	}
	defer s2.Close()
	after, err := sharedClient(t).Get(ctx, cfg.Prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if after.Header.Revision != before.Header.Revision {
		t.Fatalf("open wrote: revision %d → %d", before.Header.Revision, after.Header.Revision)
	}
	if _, err := s2.CreateServer(state.Server{Name: "n2"}); !errors.Is(err, state.ErrNotLeader) {
		t.Fatalf("fenced write without leadership = %v, want ErrNotLeader", err)
	}
}

// TestEtcdWriteCacheStale: a controller's write cache (records it read or
// wrote, served without a round trip) never decides on a stale record:
// after another controller moved the server, a move from the old
// lifecycle is refused as stale and one from the new lifecycle commits;
// the same for a token the other controller consumed (checked, which
// writes nothing, and consumed).
func TestEtcdWriteCacheStale(t *testing.T) {
	a, b := openEtcdPair(t)
	mustCreate(t, a, state.Server{Name: "n1", Lifecycle: state.LifecycleReady})
	// a's cache now holds n1 (ready); b moves it.
	if _, err := b.Transition("n1", state.LifecycleReady, state.LifecycleAllocated, "b"); err != nil {
		t.Fatal(err)
	}
	// a's cache says ready: a move from allocated must not be refused on it.
	if _, err := a.Transition("n1", state.LifecycleAllocated, state.LifecycleDeploying, "a fresh"); err != nil {
		t.Fatalf("move from the current lifecycle: %v", err)
	}
	// b's cache says allocated: a move from there must be refused as stale.
	if _, err := b.Transition("n1", state.LifecycleAllocated, state.LifecycleDeploying, "b stale"); !errors.Is(err, state.ErrStaleTransition) {
		t.Fatalf("b's move from the stale lifecycle = %v, want ErrStaleTransition", err)
	}
	value, _, err := a.IssueToken(state.TokenSpec{Purpose: state.PurposeReport, Server: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ConsumeToken(value, state.TokenClaim{Purpose: state.PurposeReport, Server: "n1"}); err != nil {
		t.Fatal(err)
	}
	// a's cache holds the token as a minted it (unused): a check, which
	// writes nothing, must not answer from it either.
	if _, err := a.CheckToken(value, state.TokenClaim{Purpose: state.PurposeReport, Server: "n1"}); !errors.Is(err, state.ErrTokenUsed) {
		t.Fatalf("a's check of a token b consumed = %v, want ErrTokenUsed", err)
	}
	if _, err := a.ConsumeToken(value, state.TokenClaim{Purpose: state.PurposeReport, Server: "n1"}); !errors.Is(err, state.ErrTokenUsed) {
		t.Fatalf("a's consume of a token b consumed = %v, want ErrTokenUsed", err)
	}
	srv, err := a.Server("n1")
	if err != nil || srv.Lifecycle != state.LifecycleDeploying {
		t.Fatalf("n1 = %s, %v", srv.Lifecycle, err)
	}
}
