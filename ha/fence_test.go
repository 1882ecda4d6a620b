package ha

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/machina-metal/machina/internal/etcdtest"
	"github.com/machina-metal/machina/state"
)

// fencedCand is a candidate that, like the controller, fences its state
// store with each term it wins (state.Store.SetFence with the term's key,
// revision and value).
type fencedCand struct {
	*cand
	store *state.Store
}

func startFenced(t *testing.T, name string, c *clientv3.Client) *fencedCand {
	t.Helper()
	st, err := state.OpenEtcd(state.EtcdConfig{Client: c, Prefix: "/site/", RequestTimeout: 3 * time.Second},
		state.Options{Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	// A standby writes nothing: a fence no key can match (create
	// revisions start at 1).
	if err := st.SetFence(&state.Fence{Key: "/test/leader/standby", Revision: -1}); err != nil {
		t.Fatal(err)
	}
	f := &fencedCand{store: st}
	f.cand = startCandWith(t, name, c, func(tm Term) {
		if err := st.SetFence(&state.Fence{Key: tm.Key, Revision: tm.Rev, Value: tm.Value}); err != nil {
			t.Errorf("SetFence: %v", err)
		}
	})
	return f
}

func (f *fencedCand) write(msg string) error {
	_, err := f.store.AppendEvent(state.Event{At: time.Now(), Kind: state.EventKind("test"), Actor: f.name, Message: msg})
	return err
}

// TestDeposedLeaderWriteFails: the leader's state writes commit while it
// leads; cut off etcd it steps down, the other candidate takes over, and
// once the partition heals the old leader's write, still fenced with its
// old term, returns state.ErrNotLeader and changes nothing. A standby's
// write (fenced with no term) fails the same way.
func TestDeposedLeaderWriteFails(t *testing.T) {
	cl := etcdtest.Start(t, etcdtest.Options{Members: 3})
	px := etcdtest.NewProxy(t, cl.Member(0).ClientURL)
	cfg := cl.Config()
	cfg.Endpoints = []string{px.URL()}
	ca, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ca.Close() })

	a := startFenced(t, "a", ca)
	a.waitElected(t, 10*time.Second)
	if err := a.write("a leads"); err != nil {
		t.Fatalf("leader's write: %v", err)
	}
	b := startFenced(t, "b", cl.Client(t))
	waitLeader(t, b.cand, "a")
	if err := b.write("b is a standby"); !errors.Is(err, state.ErrNotLeader) {
		t.Fatalf("standby's write = %v, want ErrNotLeader", err)
	}

	px.Partition()
	if _, reason := a.waitDeposed(t, 2*testTTL); !errors.Is(reason, ErrUnreachable) && !errors.Is(reason, ErrLeaseLost) {
		t.Fatalf("a deposed for %v, want ErrUnreachable or ErrLeaseLost", reason)
	}
	b.waitElected(t, testTTL+5*time.Second)
	if err := b.write("b leads"); err != nil {
		t.Fatalf("new leader's write: %v", err)
	}
	px.Heal()
	before, err := b.store.LastEventSeq()
	if err != nil {
		t.Fatal(err)
	}
	err = a.write("a after it was deposed")
	if !errors.Is(err, state.ErrNotLeader) {
		t.Fatalf("deposed leader's write = %v, want state.ErrNotLeader", err)
	}
	after, err := b.store.LastEventSeq()
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("event log moved from %d to %d on the refused write", before, after)
	}
	evs, err := b.store.Events(state.EventQuery{})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for _, e := range evs {
		if e.Kind == "test" {
			msgs = append(msgs, e.Message)
		}
	}
	if len(msgs) != 2 || msgs[0] != "a leads" || msgs[1] != "b leads" {
		t.Fatalf("test events %q, want [a leads, b leads]", msgs)
	}
}
