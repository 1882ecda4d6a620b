package state_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/state"
	bolt "go.etcd.io/bbolt"
)

// TestIssueTokenGroupCommit: concurrent token mints share commits (one
// fsync for many: a boot storm (bench/bootstorm.sh) mints 1,000 tokens with one
// commit each), and every minted token is valid exactly once. Fails with
// IssueToken on a plain update: one commit per token.
func TestIssueTokenGroupCommit(t *testing.T) {
	s := openTest(t, state.Options{}) // fsync on, as in production
	const n = 64
	for i := range n {
		mustCreate(t, s, state.Server{Name: fmt.Sprintf("r1-n%02d", i), BootMAC: fmt.Sprintf("52:54:00:00:02:%02x", i)})
	}
	before := state.LastTxID(s)
	values := make([]string, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			values[i], _, errs[i] = s.IssueToken(state.TokenSpec{Purpose: state.PurposeReport, Server: fmt.Sprintf("r1-n%02d", i),
				MAC: fmt.Sprintf("52:54:00:00:02:%02x", i), Heard: "boot script fetched"})
		})
	}
	close(start)
	wg.Wait()
	commits := state.LastTxID(s) - before
	if err := s.FlushHeard(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("issue %d: %v", i, errs[i])
		}
		claim := state.TokenClaim{Purpose: state.PurposeReport, Server: fmt.Sprintf("r1-n%02d", i)}
		if _, err := s.ConsumeToken(values[i], claim); err != nil {
			t.Fatalf("token %d: %v", i, err)
		}
		if _, err := s.ConsumeToken(values[i], claim); !errors.Is(err, state.ErrTokenUsed) {
			t.Fatalf("token %d consumed twice: %v", i, err)
		}
		srv, err := s.Server(fmt.Sprintf("r1-n%02d", i))
		if err != nil || srv.LastHeard != "boot script fetched" {
			t.Fatalf("server %d: last heard %q, %v", i, srv.LastHeard, err)
		}
	}
	if commits >= n {
		t.Fatalf("%d concurrent mints took %d commits: not grouped", n, commits)
	}
	t.Logf("%d concurrent mints in %d commits", n, commits)
}

// TestGroupCommitFailureIsolated: functions queued behind a running
// commit are committed together in one transaction; one of them failing
// gets its own error and leaves nothing written, and the others are
// committed without it.
func TestGroupCommitFailureIsolated(t *testing.T) {
	s := openTest(t, state.Options{NoSync: true})
	bucket := []byte("grouptest")
	if err := state.Grouped(s, func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists(bucket); return err }); err != nil {
		t.Fatal(err)
	}
	// The first caller holds its commit open until the others have queued.
	release := make(chan struct{})
	entered := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- state.Grouped(s, func(tx *bolt.Tx) error {
			close(entered)
			<-release
			return tx.Bucket(bucket).Put([]byte("first"), []byte("1"))
		})
	}()
	<-entered
	const n = 8
	boom := errors.New("boom")
	var mu sync.Mutex
	txOf := map[int]int{}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			errs[i] = state.Grouped(s, func(tx *bolt.Tx) error {
				mu.Lock()
				txOf[i] = tx.ID()
				mu.Unlock()
				if err := tx.Bucket(bucket).Put(fmt.Appendf(nil, "k%d", i), []byte("v")); err != nil {
					return err
				}
				if i == 3 {
					return boom
				}
				return nil
			})
		})
	}
	// Let the n callers queue behind the held commit.
	time.Sleep(200 * time.Millisecond)
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, err := range errs {
		if want := i == 3; (err != nil) != want || (want && !errors.Is(err, boom)) {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	ids := map[int]bool{}
	for i, id := range txOf {
		if i != 3 {
			ids[id] = true
		}
	}
	if len(ids) != 1 {
		t.Fatalf("the %d queued calls ran in %d transactions, want 1: %v", n-1, len(ids), txOf)
	}
	err := state.View(s, func(tx *bolt.Tx) error {
		for i := range n {
			v := tx.Bucket(bucket).Get(fmt.Appendf(nil, "k%d", i))
			if (v == nil) != (i == 3) {
				t.Errorf("key k%d = %q after the group", i, v)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestGroupCommitPanicIsCallers: a function that panics inside a shared
// commit panics in its own caller (with its value), the other callers'
// functions are committed, and the committer goes on serving. Without the
// recover the panic ran in whichever caller led the commit and left the
// committer busy for good.
func TestGroupCommitPanicIsCallers(t *testing.T) {
	s := openTest(t, state.Options{NoSync: true})
	bucket := []byte("grouptest")
	if err := state.Grouped(s, func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists(bucket); return err }); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	entered := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- state.Grouped(s, func(tx *bolt.Tx) error {
			close(entered)
			<-release
			return nil
		})
	}()
	<-entered
	const n = 4
	errs := make([]error, n)
	recovered := make([]any, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			defer func() { recovered[i] = recover() }()
			errs[i] = state.Grouped(s, func(tx *bolt.Tx) error {
				if i == 1 {
					panic("boom")
				}
				return tx.Bucket(bucket).Put(fmt.Appendf(nil, "k%d", i), []byte("v"))
			})
		})
	}
	time.Sleep(200 * time.Millisecond) // the n callers queue behind the held commit
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(10 * time.Second):
		t.Fatal("callers still waiting 10 s after the commit: the committer is stuck")
	}
	for i := range n {
		if want := i == 1; (recovered[i] == "boom") != want || (!want && (recovered[i] != nil || errs[i] != nil)) {
			t.Fatalf("caller %d: recovered %v, err %v", i, recovered[i], errs[i])
		}
	}
	done := make(chan error, 1)
	go func() {
		done <- state.Grouped(s, func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put([]byte("after"), []byte("v")) })
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the committer no longer commits after a panic")
	}
	err := state.View(s, func(tx *bolt.Tx) error {
		for _, k := range []string{"k0", "k2", "k3", "after"} {
			if tx.Bucket(bucket).Get([]byte(k)) == nil {
				t.Errorf("%s not committed", k)
			}
		}
		if tx.Bucket(bucket).Get([]byte("k1")) != nil {
			t.Error("the panicking caller's write was committed")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentWritesShareCommits: every write of the store shares
// commits on bbolt, not only token mints: the reconciler's workers
// journalling actions (UpdateServer), recording power (SetPower) and
// moving lifecycles, concurrently, take fewer commits than calls, and
// each call's change is stored whole. Fails with Store.update on the
// engine's plain update: one commit (and two fdatasync) per call.
func TestConcurrentWritesShareCommits(t *testing.T) {
	s := openTest(t, state.Options{}) // fsync on, as in production
	const n = 64
	for i := range n {
		mustCreate(t, s, state.Server{Name: fmt.Sprintf("r1-n%02d", i), BootMAC: fmt.Sprintf("52:54:00:00:03:%02x", i)})
	}
	before := state.LastTxID(s)
	errs := make([]error, 2*n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		name := fmt.Sprintf("r1-n%02d", i)
		wg.Go(func() {
			<-start
			_, errs[i] = s.UpdateServer(name, func(srv *state.Server) error {
				srv.BMCError = "journal " + name
				return nil
			})
		})
		wg.Go(func() {
			<-start
			_, errs[n+i] = s.SetPower(name, state.PowerOn, state.PowerSourceCommand)
		})
	}
	close(start)
	wg.Wait()
	commits := state.LastTxID(s) - before
	for i, err := range errs {
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	for i := range n {
		name := fmt.Sprintf("r1-n%02d", i)
		srv, err := s.Server(name)
		if err != nil {
			t.Fatal(err)
		}
		if srv.BMCError != "journal "+name || srv.Power.State != state.PowerOn || srv.Revision != 3 {
			t.Fatalf("%s: BMCError %q, power %s, revision %d; want both writes, each once", name, srv.BMCError, srv.Power.State, srv.Revision)
		}
	}
	if commits >= 2*n {
		t.Fatalf("%d concurrent writes took %d commits: not shared", 2*n, commits)
	}
	t.Logf("%d concurrent writes in %d commits", 2*n, commits)
}

// TestGroupCommitLoneFailureRunsOnce: a function that fails when it ran
// first in its transaction (alone, or first of a group) saw what it would
// see alone; its error is returned without running it again. Before, every
// failing function ran a second time alone: a lone refusal or a replayed
// token use cost two transactions.
func TestGroupCommitLoneFailureRunsOnce(t *testing.T) {
	s := openTest(t, state.Options{NoSync: true})
	boom := errors.New("boom")
	runs := 0
	err := state.Grouped(s, func(tx *bolt.Tx) error {
		runs++
		return boom
	})
	if !errors.Is(err, boom) || runs != 1 {
		t.Fatalf("lone failing call: err %v, ran %d times; want boom, once", err, runs)
	}
}
