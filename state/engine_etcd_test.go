package state

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/machina-metal/machina/internal/etcdtest"
)

// testEtcdEngine is an etcd engine on the binary's shared cluster under a
// fresh prefix.
func testEtcdEngine(t *testing.T) *etcdEngine {
	t.Helper()
	c := etcdtest.Shared(t, etcdtest.Options{Members: 3})
	cli := c.Client(t)
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	e, err := newEtcdEngine(EtcdConfig{Client: cli, Prefix: "/enginetest/" + hex.EncodeToString(b)})
	if err != nil {
		t.Fatal(err)
	}
	e.startReplica()
	t.Cleanup(func() { e.close() })
	waitReplica(t, e)
	return e
}

// waitReplica waits until e's read replica is loaded and watching.
func waitReplica(t testing.TB, e *etcdEngine) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		e.rep.mu.RLock()
		ok := e.rep.synced
		e.rep.mu.RUnlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the read replica did not load in 10 s")
		}
	}
}

// kvModel is a random key from a small alphabet with ordering edge cases
// (a prefix of another key, 0x00 and 0xff bytes).
var modelKeys = [][]byte{[]byte("a"), []byte("ab"), []byte("a\x00"), []byte("b"), []byte("\xff"), []byte("\x00"),
	[]byte("zz"), {0, 0, 0, 0, 0, 0, 0, 1}, {0, 0, 0, 0, 0, 0, 1, 0}, []byte("m/x"), []byte("m=x")}

// TestEngineModel applies the same random transactions to the bbolt and the
// etcd engine and requires the same answers from every read: Get (nil-ness
// included), full cursor walks, Seek+Next, ForEach, sequences, nested
// buckets made, deleted and made again, and rolled-back transactions.
func TestEngineModel(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "model.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	be := &boltEngine{db: db}
	ee := testEtcdEngine(t)
	rng := mrand.New(mrand.NewPCG(1, 2))
	for _, e := range []engine{be, ee} {
		if err := e.update(func(tx kvTx) error {
			_, err := tx.CreateBucketIfNotExists([]byte("b"))
			if err == nil {
				_, err = tx.CreateBucketIfNotExists([]byte("p"))
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	errRollback := errors.New("rollback")
	for round := 0; round < 60; round++ {
		seed := rng.Uint64()
		var logs [2][]string
		for i, e := range []engine{be, ee} {
			r := mrand.New(mrand.NewPCG(seed, 7))
			err := e.update(func(tx kvTx) error {
				logs[i] = nil
				r = mrand.New(mrand.NewPCG(seed, 7))
				return modelTx(tx, r, &logs[i], errRollback)
			})
			if err != nil && !errors.Is(err, errRollback) {
				t.Fatalf("round %d engine %d: %v", round, i, err)
			}
			if err := e.view(func(tx kvTx) error { return modelScan(tx, &logs[i]) }); err != nil {
				t.Fatalf("round %d engine %d view: %v", round, i, err)
			}
		}
		if len(logs[0]) != len(logs[1]) {
			t.Fatalf("round %d: %d observations on bbolt, %d on etcd", round, len(logs[0]), len(logs[1]))
		}
		for j := range logs[0] {
			if logs[0][j] != logs[1][j] {
				t.Fatalf("round %d observation %d:\nbbolt %s\netcd  %s", round, j, logs[0][j], logs[1][j])
			}
		}
	}
}

func modelKey(r *mrand.Rand) []byte { return modelKeys[r.IntN(len(modelKeys))] }

func modelTx(tx kvTx, r *mrand.Rand, log *[]string, errRollback error) error {
	obs := func(f string, a ...any) { *log = append(*log, fmt.Sprintf(f, a...)) }
	b := tx.Bucket([]byte("b"))
	p := tx.Bucket([]byte("p"))
	for i := 0; i < 12; i++ {
		target := b
		name := []byte(fmt.Sprintf("n%d", r.IntN(3)))
		if r.IntN(3) == 0 {
			if nb := p.Bucket(name); nb != nil {
				target = nb
			} else {
				obs("nested %s absent", name)
			}
		}
		switch op := r.IntN(10); op {
		case 0, 1:
			v := []byte(fmt.Sprintf("v%d", r.IntN(100)))
			if r.IntN(8) == 0 {
				v = nil
			}
			if err := target.Put(modelKey(r), v); err != nil {
				return err
			}
		case 2:
			if err := target.Delete(modelKey(r)); err != nil {
				return err
			}
		case 3:
			k := modelKey(r)
			v := target.Get(k)
			obs("get %q = %q nil=%v", k, v, v == nil)
		case 4:
			c := target.Cursor()
			k, v := c.Seek(modelKey(r))
			for j := 0; j < 3 && k != nil; j++ {
				obs("seek %q=%q", k, v)
				k, v = c.Next()
			}
			obs("seek end %v", k == nil)
		case 5:
			n, err := target.NextSequence()
			if err != nil {
				return err
			}
			obs("seq %d", n)
		case 6:
			if _, err := p.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		case 7:
			if p.Bucket(name) != nil {
				if err := p.DeleteBucket(name); err != nil {
					return err
				}
			}
		case 8:
			walk(target, obs)
		case 9:
			obs("sequence %d", target.Sequence())
		}
	}
	if r.IntN(6) == 0 {
		return errRollback
	}
	return nil
}

func walk(b kvBucket, obs func(string, ...any)) {
	c := b.Cursor()
	var keys [][]byte
	for k, v := c.First(); k != nil; k, v = c.Next() {
		obs("walk %q=%q", k, v)
		keys = append(keys, k)
	}
	n := 0
	_ = b.ForEach(func(k, _ []byte) error {
		if n >= len(keys) || !bytes.Equal(keys[n], k) {
			obs("foreach differs at %d: %q", n, k)
		}
		n++
		return nil
	})
	obs("walk end %d %d", len(keys), n)
}

func modelScan(tx kvTx, log *[]string) error {
	obs := func(f string, a ...any) { *log = append(*log, fmt.Sprintf(f, a...)) }
	walk(tx.Bucket([]byte("b")), obs)
	obs("b seq %d", tx.Bucket([]byte("b")).Sequence())
	p := tx.Bucket([]byte("p"))
	for i := 0; i < 3; i++ {
		name := []byte(fmt.Sprintf("n%d", i))
		nb := p.Bucket(name)
		if nb == nil {
			obs("n%d absent", i)
			continue
		}
		walk(nb, obs)
		obs("n%d seq %d", i, nb.Sequence())
	}
	return nil
}

// TestEtcdCommitGuards: a transaction that read a record by key, walked a
// bucket, or read a sequence does not commit when another engine (another
// controller) wrote what it read since its snapshot: an update, an insert
// into the walked range (a phantom), a deletion, a sequence bump. Writes
// to what it did not read do not stop it.
func TestEtcdCommitGuards(t *testing.T) {
	e1 := testEtcdEngine(t)
	e2, err := newEtcdEngine(EtcdConfig{Client: e1.cli, Prefix: e1.prefix})
	if err != nil {
		t.Fatal(err)
	}
	seed := func() {
		if err := e1.update(func(tx kvTx) error {
			for _, name := range []string{"b", "other"} {
				b, err := tx.CreateBucketIfNotExists([]byte(name))
				if err != nil {
					return err
				}
				for _, k := range []string{"k1", "k3"} {
					if err := b.Put([]byte(k), []byte("v")); err != nil {
						return err
					}
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	seed()
	cases := []struct {
		name  string
		read  func(b kvBucket)
		other func(tx kvTx) error
		want  bool // commits
	}{
		{"get, then that record updated", func(b kvBucket) { b.Get([]byte("k1")) },
			func(tx kvTx) error { return tx.Bucket([]byte("b")).Put([]byte("k1"), []byte("w")) }, false},
		{"get of an absent key, then it is made", func(b kvBucket) { b.Get([]byte("k2")) },
			func(tx kvTx) error { return tx.Bucket([]byte("b")).Put([]byte("k2"), []byte("w")) }, false},
		{"get, then another record updated", func(b kvBucket) { b.Get([]byte("k1")) },
			func(tx kvTx) error { return tx.Bucket([]byte("b")).Put([]byte("k3"), []byte("w")) }, true},
		{"walk, then an insert in the range", func(b kvBucket) { _ = b.ForEach(func(_, _ []byte) error { return nil }) },
			func(tx kvTx) error { return tx.Bucket([]byte("b")).Put([]byte("k2"), []byte("w")) }, false},
		{"walk, then a deletion in the range", func(b kvBucket) { b.Cursor().First() },
			func(tx kvTx) error { return tx.Bucket([]byte("b")).Delete([]byte("k3")) }, false},
		{"walk, then a write to another bucket", func(b kvBucket) { b.Cursor().First() },
			func(tx kvTx) error { return tx.Bucket([]byte("other")).Put([]byte("k2"), []byte("w")) }, true},
		{"sequence, then bumped", func(b kvBucket) { b.Sequence() },
			func(tx kvTx) error { _, err := tx.Bucket([]byte("b")).NextSequence(); return err }, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			seed()
			tx := e1.newTx(true)
			b := tx.Bucket([]byte("b"))
			c.read(b)
			if err := b.Put([]byte("mine"), []byte("x")); err != nil {
				t.Fatal(err)
			}
			if err := e2.update(c.other); err != nil {
				t.Fatal(err)
			}
			ok, err := tx.commit()
			if err != nil || tx.err != nil {
				t.Fatalf("commit: %v %v", err, tx.err)
			}
			if ok != c.want {
				t.Fatalf("commit succeeded = %v, want %v", ok, c.want)
			}
		})
	}
}

// TestEtcdTransitionRoundTrips counts the etcd reads of one lifecycle move
// with its event (a regression guard on round trips: each is a network
// round trip to the cluster before the commit). The only writer of its site
// reads everything a move needs from its write cache: 0 reads, one Txn.
func TestEtcdTransitionRoundTrips(t *testing.T) {
	e := testEtcdEngine(t)
	s := newStore(e, e.describe(), Options{Logger: slog.New(slog.DiscardHandler), Now: time.Now})
	s.sweep, s.pruneBatch = etcdSweep, etcdSweep
	if err := s.init(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateServer(Server{Name: "n1", Lifecycle: LifecycleReady}); err != nil {
		t.Fatal(err)
	}
	cur, next := LifecycleReady, LifecycleAllocated
	for i := range 5 {
		before := e.reads.Load()
		st0, _ := s.EtcdStats()
		if _, err := s.Transition("n1", cur, next, "count"); err != nil {
			t.Fatal(err)
		}
		n := e.reads.Load() - before
		t.Logf("move %d: %d etcd reads before the commit", i, n)
		if n > 0 {
			t.Errorf("move %d took %d etcd reads, want 0 (the write cache)", i, n)
		}
		// The engine's counters (the /metrics machina_state_etcd_*) see
		// the same: one commit carrying one call, reads from the cache.
		st, ok := s.EtcdStats()
		if !ok {
			t.Fatal("EtcdStats on an etcd store: not ok")
		}
		if d := st.Commits - st0.Commits; d != 1 {
			t.Errorf("move %d: %d commits counted, want 1", i, d)
		}
		if du, dc := st.Updates-st0.Updates, st.Calls-st0.Calls; du != 1 || dc != 1 {
			t.Errorf("move %d: %d updates carrying %d calls counted, want 1 and 1", i, du, dc)
		}
		if d := st.UpdateReads - st0.UpdateReads; d != 0 {
			t.Errorf("move %d: %d update reads counted, want 0", i, d)
		}
		if st.CacheHits == st0.CacheHits || st.CacheMisses != st0.CacheMisses {
			t.Errorf("move %d: cache hits %d→%d, misses %d→%d, want hits only", i, st0.CacheHits, st.CacheHits, st0.CacheMisses, st.CacheMisses)
		}
		cur, next = next, cur
	}
	bs, err := Open(filepath.Join(t.TempDir(), "state.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Close()
	if _, ok := bs.EtcdStats(); ok {
		t.Error("EtcdStats on a bbolt store: ok, want false")
	}
}

// TestEtcdCommitErrors: a transaction past etcd's --max-txn-ops (128) is
// refused and reported as not applied; a commit that cannot reach etcd
// (every member stopped) wraps ErrCommitUncertain.
func TestEtcdCommitErrors(t *testing.T) {
	e := testEtcdEngine(t)
	err := e.update(func(tx kvTx) error {
		b, err := tx.CreateBucketIfNotExists([]byte("big"))
		if err != nil {
			return err
		}
		for i := range 200 {
			if err := b.Put([]byte(fmt.Sprintf("k%03d", i)), []byte("v")); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil || errors.Is(err, ErrCommitUncertain) || !strings.Contains(err.Error(), "too many operations") {
		t.Fatalf("oversized commit = %v, want a refusal that is not uncertain", err)
	}

	c := etcdtest.Start(t, etcdtest.Options{})
	e2, err := newEtcdEngine(EtcdConfig{Endpoints: c.Endpoints(), Prefix: "/down/", RequestTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e2.close()
	c.Member(0).Stop()
	err = e2.update(func(tx kvTx) error {
		b, err := tx.CreateBucketIfNotExists([]byte("b"))
		if err != nil {
			return err
		}
		return b.Put([]byte("k"), []byte("v"))
	})
	// The first read already fails (no snapshot revision without etcd);
	// a blind write goes straight to the commit.
	if err == nil {
		t.Fatal("write with etcd down succeeded")
	}
	tx := e2.newTx(true)
	tx.rev = 1
	b := &etcdBucket{tx: tx, id: "x", dataPfx: "/down/k/x=", metaKey: "/down/m/x", genKey: "/down/g/x", exists: true,
		writes: map[string]etcdWrite{}, base: map[string][]byte{}, points: map[string][]byte{}}
	tx.buckets["x"] = b
	_ = b.Put([]byte("k"), []byte("v"))
	if _, err := tx.commit(); !errors.Is(err, ErrCommitUncertain) {
		t.Fatalf("commit with etcd down = %v, want ErrCommitUncertain", err)
	}
}

// TestEtcdViewsReadReplica: views on etcd read the watch-fed replica: a
// Snapshot and a lookup by boot MAC make no etcd read, see this process's
// commits at once (read your writes), and see another process's commits
// once the watch delivers them; a bucket deleted by this process is gone
// from the replica in the same way.
func TestEtcdViewsReadReplica(t *testing.T) {
	e := testEtcdEngine(t)
	s := newStore(e, e.describe(), Options{Logger: slog.New(slog.DiscardHandler), Now: time.Now})
	s.sweep, s.pruneBatch = etcdSweep, etcdSweep
	if err := s.init(nil); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		if _, err := s.CreateServer(Server{Name: fmt.Sprintf("n%02d", i), Lifecycle: LifecycleReady,
			BootMAC: fmt.Sprintf("52:54:00:00:00:%02x", i)}); err != nil {
			t.Fatal(err)
		}
	}
	before := e.reads.Load()
	snap, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Servers) != 40 {
		t.Fatalf("Snapshot right after the creates has %d servers, want 40", len(snap.Servers))
	}
	if srv, err := s.ServerByBootMAC("52:54:00:00:00:27"); err != nil || srv.Name != "n39" {
		t.Fatalf("ServerByBootMAC = %v, %v; want n39", srv.Name, err)
	}
	if n := e.reads.Load() - before; n != 0 {
		t.Errorf("Snapshot and ServerByBootMAC made %d etcd reads, want 0 (the replica)", n)
	}

	// A write outside the prefix (another site) moves etcd's revision past
	// anything the watch shows. Progress reports are not trusted (etcd
	// before 3.4.25/3.5.8 can send one ahead of undelivered events,
	// etcd-io/etcd#15220), so the view falls back to reading etcd after
	// repMaxLag: correct, bounded, not free.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := e.cli.Put(ctx, strings.TrimSuffix(e.prefix, "/")+"-elsewhere/x", "y"); err != nil {
		t.Fatal(err)
	}
	before = e.reads.Load()
	t0 := time.Now()
	if _, err := s.CountServers(); err != nil {
		t.Fatal(err)
	}
	if n, d := e.reads.Load()-before, time.Since(t0); n == 0 || d >= repMaxLag+5*time.Second {
		t.Errorf("view after a write outside the prefix: %d etcd reads in %v, want a direct read after about %v", n, d, repMaxLag)
	}

	// Another controller on the same prefix writes; this one's views see it
	// once the watch delivers it.
	other, err := newEtcdEngine(EtcdConfig{Client: e.cli, Prefix: e.prefix})
	if err != nil {
		t.Fatal(err)
	}
	s2 := newStore(other, other.describe(), Options{Logger: slog.New(slog.DiscardHandler), Now: time.Now})
	s2.sweep, s2.pruneBatch = etcdSweep, etcdSweep
	if err := s2.init(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Transition("n05", LifecycleReady, LifecycleAllocated, "other"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		srv, err := s.Server("n05")
		if err != nil {
			t.Fatal(err)
		}
		if srv.Lifecycle == LifecycleAllocated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n05 is %s on this controller 5 s after the other moved it", srv.Lifecycle)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// This process's next commit follows the other's: its view shows both.
	if _, err := s.Transition("n06", LifecycleReady, LifecycleAllocated, "this"); err != nil {
		t.Fatal(err)
	}
	counts, err := s.CountServers()
	if err != nil {
		t.Fatal(err)
	}
	if counts[LifecycleAllocated] != 2 || counts[LifecycleReady] != 38 {
		t.Fatalf("counts after both moves = %v, want 2 allocated, 38 ready", counts)
	}
}

// TestEtcdUpdatesShareTransactions: concurrent updates of one process on
// etcd share transactions (fewer Txns than moves), every move lands with
// its event, and a move that fails in a shared transaction gets its own
// error while the others commit.
func TestEtcdUpdatesShareTransactions(t *testing.T) {
	e := testEtcdEngine(t)
	s := newStore(e, e.describe(), Options{Logger: slog.New(slog.DiscardHandler), Now: time.Now})
	s.sweep, s.pruneBatch = etcdSweep, etcdSweep
	if err := s.init(nil); err != nil {
		t.Fatal(err)
	}
	const n = 64
	for i := range n {
		if _, err := s.CreateServer(Server{Name: fmt.Sprintf("n%02d", i), Lifecycle: LifecycleReady}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.CreateServer(Server{Name: "other", Lifecycle: LifecycleReady}); err != nil {
		t.Fatal(err)
	}
	before := e.txns.Load()
	errs := make([]error, n+1)
	start := make(chan struct{})
	done := make(chan struct{})
	for i := range n + 1 {
		go func() {
			defer func() { done <- struct{}{} }()
			<-start
			if i == n { // a stale move: other is not allocated
				_, errs[i] = s.Transition("other", LifecycleAllocated, LifecycleDeploying, "stale")
				return
			}
			_, errs[i] = s.Transition(fmt.Sprintf("n%02d", i), LifecycleReady, LifecycleAllocated, "shared")
		}()
	}
	close(start)
	for range n + 1 {
		<-done
	}
	txns := e.txns.Load() - before
	t.Logf("%d moves (and one stale) in %d etcd transactions", n, txns)
	for i := range n {
		if errs[i] != nil {
			t.Errorf("move %d: %v", i, errs[i])
		}
	}
	if !errors.Is(errs[n], ErrStaleTransition) {
		t.Errorf("stale move = %v, want ErrStaleTransition", errs[n])
	}
	if txns >= n {
		t.Errorf("%d moves took %d transactions, want fewer (shared)", n, txns)
	}
	counts, err := s.CountServers()
	if err != nil {
		t.Fatal(err)
	}
	if counts[LifecycleAllocated] != n {
		t.Fatalf("allocated = %d, want %d", counts[LifecycleAllocated], n)
	}
	evs, err := s.Events(EventQuery{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	moves := 0
	for _, ev := range evs {
		if ev.Message != "" && strings.Contains(ev.Message, "shared") {
			moves++
		}
	}
	if moves != n {
		t.Errorf("%d events of the shared moves, want %d", moves, n)
	}
}

// TestEtcdSharedTransactionTooBig: calls that together pass etcd's
// --max-txn-ops are not sent together but each alone, and all commit
// (60 and 70 puts: the first leaves the transaction under half the limit,
// so it takes the second too, and the two are past it).
func TestEtcdSharedTransactionTooBig(t *testing.T) {
	e := testEtcdEngine(t)
	if err := e.update(func(tx kvTx) error { _, err := tx.CreateBucketIfNotExists([]byte("b")); return err }); err != nil {
		t.Fatal(err)
	}
	var calls []*batchCall
	sizes := []int{60, 70, 60, 70}
	for i := range 4 {
		calls = append(calls, &batchCall{done: make(chan error, 1), fn: func(tx kvTx) error {
			b := tx.Bucket([]byte("b"))
			for j := range sizes[i] {
				if err := b.Put([]byte(fmt.Sprintf("c%d-%02d", i, j)), []byte("v")); err != nil {
					return err
				}
			}
			return nil
		}})
	}
	e.mu.Lock()
	e.runBatch(calls)
	e.mu.Unlock()
	for i, c := range calls {
		if err := <-c.done; err != errTrySolo {
			t.Fatalf("call %d of an oversized shared transaction = %v, want errTrySolo", i, err)
		}
		if err := e.solo(c.fn); err != nil {
			t.Fatalf("call %d alone: %v", i, err)
		}
	}
	n := 0
	if err := e.view(func(tx kvTx) error { n = tx.Bucket([]byte("b")).KeyN(); return nil }); err != nil {
		t.Fatal(err)
	}
	if n != 260 {
		t.Fatalf("%d records after the calls ran alone, want 260", n)
	}
}

// TestEtcdSharedTransactionStopsTakingCalls: a shared transaction takes
// calls until its operations pass half of etcd's --max-txn-ops and leaves
// the rest to the next one (in the same turn at the writer lock): four
// calls of 40 puts commit in two transactions of two, none alone.
func TestEtcdSharedTransactionStopsTakingCalls(t *testing.T) {
	e := testEtcdEngine(t)
	if err := e.update(func(tx kvTx) error { _, err := tx.CreateBucketIfNotExists([]byte("b")); return err }); err != nil {
		t.Fatal(err)
	}
	var calls []*batchCall
	for i := range 4 {
		calls = append(calls, &batchCall{done: make(chan error, 1), fn: func(tx kvTx) error {
			b := tx.Bucket([]byte("b"))
			for j := range 40 {
				if err := b.Put([]byte(fmt.Sprintf("c%d-%02d", i, j)), []byte("v")); err != nil {
					return err
				}
			}
			return nil
		}})
	}
	before := e.txns.Load()
	e.mu.Lock()
	e.runBatch(calls)
	e.mu.Unlock()
	for i, c := range calls {
		if err := <-c.done; err != nil {
			t.Fatalf("call %d = %v, want nil (committed shared)", i, err)
		}
	}
	if d := e.txns.Load() - before; d != 2 {
		t.Errorf("%d etcd transactions for 4 calls of 40 puts, want 2", d)
	}
	n := 0
	if err := e.view(func(tx kvTx) error { n = tx.Bucket([]byte("b")).KeyN(); return nil }); err != nil {
		t.Fatal(err)
	}
	if n != 160 {
		t.Fatalf("%d records, want 160", n)
	}
}

// TestEtcdSharedCallPanicsInItsCaller: a function that panics in a shared
// transaction panics in its own caller; the other calls of the transaction
// commit and the writer lock is free again.
func TestEtcdSharedCallPanicsInItsCaller(t *testing.T) {
	e := testEtcdEngine(t)
	if err := e.update(func(tx kvTx) error { _, err := tx.CreateBucketIfNotExists([]byte("b")); return err }); err != nil {
		t.Fatal(err)
	}
	put := func(k string) func(tx kvTx) error {
		return func(tx kvTx) error { return tx.Bucket([]byte("b")).Put([]byte(k), []byte("v")) }
	}
	ok := &batchCall{fn: put("ok"), done: make(chan error, 1)}
	bad := &batchCall{fn: func(kvTx) error { panic("boom") }, done: make(chan error, 1)}
	e.mu.Lock()
	e.runBatch([]*batchCall{ok, bad})
	e.mu.Unlock()
	if err := <-ok.done; err != nil {
		t.Fatalf("the other call of the shared transaction: %v", err)
	}
	if err := <-bad.done; err != errTrySolo {
		t.Fatalf("the panicking call got %v, want errTrySolo (rerun in its own caller)", err)
	}
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Fatalf("recovered %v in the caller, want boom", v)
			}
		}()
		_ = e.update(func(kvTx) error { panic("boom") })
	}()
	if err := e.update(put("after")); err != nil {
		t.Fatalf("update after the panic: %v", err)
	}
	var got []string
	if err := e.view(func(tx kvTx) error {
		return tx.Bucket([]byte("b")).ForEach(func(k, _ []byte) error { got = append(got, string(k)); return nil })
	}); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "after,ok" {
		t.Fatalf("records %v, want after,ok", got)
	}
}

// TestEtcdChecksShareTransactions: token checks (update transactions that
// end with errRollback, writing nothing) running alongside lifecycle moves
// share the moves' etcd transactions and answer from the write cache, the
// commit's compares proving the cached token current: no etcd read under
// the writer lock, no rerun from a snapshot, and each check answers as
// alone (a used token refused, an unused one accepted).
func TestEtcdChecksShareTransactions(t *testing.T) {
	e := testEtcdEngine(t)
	s := newStore(e, e.describe(), Options{Logger: slog.New(slog.DiscardHandler), Now: time.Now})
	s.sweep, s.pruneBatch = etcdSweep, etcdSweep
	if err := s.init(nil); err != nil {
		t.Fatal(err)
	}
	const n = 32
	values := make([]string, n)
	for i := range n {
		name := fmt.Sprintf("n%02d", i)
		if _, err := s.CreateServer(Server{Name: name, Lifecycle: LifecycleReady}); err != nil {
			t.Fatal(err)
		}
		v, _, err := s.IssueToken(TokenSpec{Purpose: PurposeReport, Server: name})
		if err != nil {
			t.Fatal(err)
		}
		values[i] = v
	}
	// Every fourth token used: its checks must refuse it.
	for i := 0; i < n; i += 4 {
		if _, err := s.ConsumeToken(values[i], TokenClaim{Purpose: PurposeReport, Server: fmt.Sprintf("n%02d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	waitReplica(t, e)
	st0, _ := s.EtcdStats()
	checks := make([]error, n)
	moves := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		name := fmt.Sprintf("n%02d", i)
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			_, checks[i] = s.CheckToken(values[i], TokenClaim{Purpose: PurposeReport, Server: name})
		}()
		go func() {
			defer wg.Done()
			<-start
			_, moves[i] = s.Transition(name, LifecycleReady, LifecycleAllocated, "with checks")
		}()
	}
	close(start)
	wg.Wait()
	for i := range n {
		if moves[i] != nil {
			t.Errorf("move %d: %v", i, moves[i])
		}
		switch {
		case i%4 == 0 && !errors.Is(checks[i], ErrTokenUsed):
			t.Errorf("check of used token %d = %v, want ErrTokenUsed", i, checks[i])
		case i%4 != 0 && checks[i] != nil:
			t.Errorf("check of unused token %d = %v, want nil", i, checks[i])
		}
	}
	st, _ := s.EtcdStats()
	t.Logf("%d checks and %d moves: %d commits, %d update reads, %d cache reruns, %d updates carrying %d calls",
		n, n, st.Commits-st0.Commits, st.UpdateReads-st0.UpdateReads, st.CacheReruns-st0.CacheReruns,
		st.Updates-st0.Updates, st.Calls-st0.Calls)
	if d := st.UpdateReads - st0.UpdateReads; d != 0 {
		t.Errorf("%d etcd reads in write transactions, want 0 (the write cache, proven by the compares)", d)
	}
	if d := st.CacheReruns - st0.CacheReruns; d != 0 {
		t.Errorf("%d reruns from a snapshot, want 0", d)
	}
	counts, err := s.CountServers()
	if err != nil {
		t.Fatal(err)
	}
	if counts[LifecycleAllocated] != n {
		t.Fatalf("allocated = %d, want %d", counts[LifecycleAllocated], n)
	}
}

// TestEtcdCachedReadsComparedPastTheGuard: a transaction reading more than
// maxPointReads records of one bucket guards the bucket by its generation
// key, read at the snapshot; a record served by the write cache is older
// than that snapshot, so it is compared by its own key all the same. Here
// another process (engine b) changed the last of 16 records a holds in its
// cache; a's sum of all 16 must see the change (its commit's compare on
// that record fails and it reruns from etcd), not commit a sum of stale
// records.
func TestEtcdCachedReadsComparedPastTheGuard(t *testing.T) {
	a := testEtcdEngine(t)
	b, err := newEtcdEngine(EtcdConfig{Client: a.cli, Prefix: a.prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.close() })
	const n = 2 * maxPointReads
	key := func(i int) []byte { return []byte(fmt.Sprintf("r%02d", i)) }
	bucket := []byte("sums")
	if err := a.update(func(tx kvTx) error {
		bk, err := tx.CreateBucketIfNotExists(bucket)
		if err != nil {
			return err
		}
		for i := range n {
			if err := bk.Put(key(i), []byte("0")); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := b.update(func(tx kvTx) error { return tx.Bucket(bucket).Put(key(n-1), []byte("1")) }); err != nil {
		t.Fatal(err)
	}
	hits := a.stats.cacheHits.Load()
	if err := a.update(func(tx kvTx) error {
		bk := tx.Bucket(bucket)
		sum := 0
		for i := range n {
			if string(bk.Get(key(i))) == "1" {
				sum++
			}
		}
		return bk.Put([]byte("sum"), []byte(fmt.Sprint(sum)))
	}); err != nil {
		t.Fatal(err)
	}
	if a.stats.cacheHits.Load() == hits {
		t.Fatal("a read no record from its write cache: the test shows nothing")
	}
	var got []byte
	if err := b.view(func(tx kvTx) error {
		got = append([]byte{}, tx.Bucket(bucket).Get([]byte("sum"))...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if string(got) != "1" {
		t.Fatalf("sum = %q, want 1 (a decided on a stale cached record)", got)
	}
}
