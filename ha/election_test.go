package ha

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/machina-metal/machina/internal/etcdtest"
)

const testTTL = 2 * time.Second // etcdtest's members raise shorter TTLs to 2 s

// span is one term as a candidate saw it.
type span struct {
	from, to time.Time
	reason   error
	term     Term
}

// cand is one candidate under test: OnElected records the term and blocks
// until its context ends (or resign is closed), OnDeposed records why.
type cand struct {
	name    string
	el      *Elector
	metrics *Metrics
	reg     *prometheus.Registry
	cancel  context.CancelFunc
	done    chan error
	elected chan Term
	deposed chan error
	resign  chan error // OnElected returns what it receives

	mu    sync.Mutex
	spans []span
}

func startCand(t *testing.T, name string, c *clientv3.Client) *cand {
	t.Helper()
	return startCandWith(t, name, c, nil)
}

// startCandWith is startCand with a hook run first in each OnElected.
func startCandWith(t *testing.T, name string, c *clientv3.Client, hook func(Term)) *cand {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	el, err := NewElector(ElectorConfig{Client: c, Prefix: "/test/leader", TTL: testTTL, Metrics: m,
		Self:   Candidate{ID: name, AdminURL: "https://" + name + ".example:8443"},
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil)).With("cand", name)})
	if err != nil {
		t.Fatal(err)
	}
	k := &cand{name: name, el: el, metrics: m, reg: reg, done: make(chan error, 1), elected: make(chan Term, 8), deposed: make(chan error, 8), resign: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	k.cancel = cancel
	go func() {
		k.done <- el.Run(ctx, Handlers{
			OnElected: func(ctx context.Context, tm Term) error {
				if hook != nil {
					hook(tm)
				}
				k.mu.Lock()
				k.spans = append(k.spans, span{from: time.Now(), term: tm})
				k.mu.Unlock()
				k.elected <- tm
				select {
				case <-ctx.Done():
					return nil
				case err := <-k.resign:
					return err
				}
			},
			OnDeposed: func(tm Term, reason error) {
				k.mu.Lock()
				k.spans[len(k.spans)-1].to = time.Now()
				k.spans[len(k.spans)-1].reason = reason
				k.mu.Unlock()
				k.deposed <- reason
			},
		})
	}()
	t.Cleanup(k.stop)
	return k
}

func (k *cand) stop() {
	if k.cancel != nil {
		k.cancel()
		<-k.done
		k.cancel = nil
	}
}

func (k *cand) waitElected(t *testing.T, within time.Duration) (Term, time.Time) {
	t.Helper()
	select {
	case tm := <-k.elected:
		return tm, time.Now()
	case <-time.After(within):
		t.Fatalf("%s not elected within %s", k.name, within)
		return Term{}, time.Time{}
	}
}

// waitDeposed returns the reason of the next step-down and when it was seen.
func (k *cand) waitDeposed(t *testing.T, within time.Duration) (at time.Time, reason error) {
	t.Helper()
	select {
	case err := <-k.deposed:
		return time.Now(), err
	case <-time.After(within):
		t.Fatalf("%s not deposed within %s", k.name, within)
		return time.Time{}, nil
	}
}

func (k *cand) terms() []span {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]span(nil), k.spans...)
}

// noOverlap fails t if two candidates' terms overlapped in time.
func noOverlap(t *testing.T, cs ...*cand) {
	t.Helper()
	for i, a := range cs {
		for _, b := range cs[i+1:] {
			for _, x := range a.terms() {
				for _, y := range b.terms() {
					xe, ye := x.to, y.to
					if xe.IsZero() {
						xe = time.Now()
					}
					if ye.IsZero() {
						ye = time.Now()
					}
					if x.from.Before(ye) && y.from.Before(xe) {
						t.Errorf("%s's term [%s, %s) overlaps %s's [%s, %s)", a.name, x.from.Format(time.StampMilli), xe.Format(time.StampMilli),
							b.name, y.from.Format(time.StampMilli), ye.Format(time.StampMilli))
					}
				}
			}
		}
	}
}

func waitLeader(t *testing.T, k *cand, want string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		ch := k.el.LeaderChanged()
		if c, ok := k.el.Leader(); ok && c.ID == want {
			if c.AdminURL != "https://"+want+".example:8443" {
				t.Fatalf("%s observes leader %+v, want admin URL of %s", k.name, c, want)
			}
			return
		}
		select {
		case <-ch:
		case <-deadline:
			c, ok := k.el.Leader()
			t.Fatalf("%s observes leader %+v (%v), want %s", k.name, c, ok, want)
		}
	}
}

// TestElectionOneLeader: two candidates on a 3-member cluster; exactly one
// leads, both observe it with its admin URL, and when the leader shuts
// down (its lease revoked) the other takes over well within one TTL.
func TestElectionOneLeader(t *testing.T) {
	cl := etcdtest.Start(t, etcdtest.Options{Members: 3})
	a := startCand(t, "a", cl.Client(t))
	tmA, _ := a.waitElected(t, 10*time.Second)
	b := startCand(t, "b", cl.Client(t))
	waitLeader(t, b, "a")
	waitLeader(t, a, "a")
	if !a.el.IsLeader() || b.el.IsLeader() {
		t.Fatalf("IsLeader: a %v, b %v; want a only", a.el.IsLeader(), b.el.IsLeader())
	}
	// b's campaign key is queued behind a's (b may observe a before its
	// own campaign key is written).
	waitKeys(t, cl.Client(t), 2)
	resp, err := cl.Client(t).Get(context.Background(), "/test/leader/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 2 || string(resp.Kvs[0].Key) != tmA.Key || resp.Kvs[0].CreateRevision != tmA.Rev {
		t.Fatalf("election keys %v, want a's %s first and b's second", resp.Kvs, tmA.Key)
	}
	if got := testutil.ToFloat64(a.metrics.leader); got != 1 {
		t.Fatalf("a's machina_ha_leader = %v, want 1", got)
	}
	if got := testutil.ToFloat64(b.metrics.leader); got != 0 {
		t.Fatalf("b's machina_ha_leader = %v, want 0", got)
	}

	stopped := time.Now()
	a.stop()
	if _, reason := a.waitDeposed(t, time.Second); !errors.Is(reason, ErrShutdown) {
		t.Fatalf("a deposed for %v, want ErrShutdown", reason)
	}
	_, at := b.waitElected(t, 10*time.Second)
	if gap := at.Sub(stopped); gap > testTTL/2 {
		t.Fatalf("b took over %s after a shut down, want well under a TTL (lease revoked)", gap)
	}
	waitLeader(t, b, "b")
	noOverlap(t, a, b)
	if got := testutil.ToFloat64(a.metrics.stepdowns.WithLabelValues("shutdown")); got != 1 {
		t.Fatalf("a's machina_ha_stepdowns_total{reason=shutdown} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(b.metrics.elections); got != 1 {
		t.Fatalf("b's machina_ha_elections_total = %v, want 1", got)
	}
}

// TestPartitionedLeaderStepsDown cuts the leader off etcd with a TCP proxy
// (its only endpoint): it reports deposed (ErrUnreachable, or ErrLeaseLost
// when the client ends the session first) within one TTL
// of the cut, before the other candidate is elected, and the other is
// elected within TTL + 2 s. After the partition heals the old leader
// campaigns again and queues as a standby.
func TestPartitionedLeaderStepsDown(t *testing.T) {
	cl := etcdtest.Start(t, etcdtest.Options{Members: 3})
	px := etcdtest.NewProxy(t, cl.Member(0).ClientURL)
	cfg := cl.Config()
	cfg.Endpoints = []string{px.URL()}
	ca, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ca.Close() })
	a := startCand(t, "a", ca)
	a.waitElected(t, 10*time.Second)
	b := startCand(t, "b", cl.Client(t))
	waitLeader(t, b, "a")

	cut := time.Now()
	px.Partition()
	deposed, reason := a.waitDeposed(t, 2*testTTL)
	// Its own renewal deadline (ErrUnreachable) or the client ending the
	// session on the broken stream (ErrLeaseLost), whichever comes first.
	if !errors.Is(reason, ErrUnreachable) && !errors.Is(reason, ErrLeaseLost) {
		t.Fatalf("a deposed for %v, want ErrUnreachable or ErrLeaseLost", reason)
	}
	if d := deposed.Sub(cut); d > testTTL {
		t.Fatalf("a stepped down %s after the partition, want within one TTL (%s)", d, testTTL)
	}
	_, elected := b.waitElected(t, testTTL+5*time.Second)
	if d := elected.Sub(cut); d > testTTL+2*time.Second {
		t.Fatalf("b elected %s after the partition, want within TTL + 2 s", d)
	}
	if !deposed.Before(elected) {
		t.Fatalf("a stepped down at %s, after b was elected at %s", deposed.Format(time.StampMilli), elected.Format(time.StampMilli))
	}
	t.Logf("partition → a deposed %s, → b elected %s", deposed.Sub(cut), elected.Sub(cut))
	if got := testutil.ToFloat64(a.metrics.stepdowns.WithLabelValues("unreachable")) + testutil.ToFloat64(a.metrics.stepdowns.WithLabelValues("lease_lost")); got != 1 {
		t.Fatalf("a's machina_ha_stepdowns_total{reason=unreachable|lease_lost} = %v, want 1", got)
	}

	px.Heal()
	waitLeader(t, a, "b")
	waitKeys(t, cl.Client(t), 2) // a queues again behind b
	if a.el.IsLeader() {
		t.Fatal("a leads again after the heal while b holds its term")
	}
	noOverlap(t, a, b)
}

// TestClosedClientLosesLeadership: closing the leader's etcd client ends
// its session at once (ErrLeaseLost); its lease was not revoked, so the
// other candidate is elected when it lapses, within TTL + 2 s.
func TestClosedClientLosesLeadership(t *testing.T) {
	cl := etcdtest.Start(t, etcdtest.Options{Members: 1})
	ca, err := clientv3.New(cl.Config())
	if err != nil {
		t.Fatal(err)
	}
	a := startCand(t, "a", ca)
	a.waitElected(t, 10*time.Second)
	b := startCand(t, "b", cl.Client(t))
	waitLeader(t, b, "a")
	closed := time.Now()
	_ = ca.Close()
	deposed, reason := a.waitDeposed(t, testTTL)
	if !errors.Is(reason, ErrLeaseLost) && !errors.Is(reason, ErrUnreachable) {
		t.Fatalf("a deposed for %v, want ErrLeaseLost", reason)
	}
	_, elected := b.waitElected(t, testTTL+5*time.Second)
	if d := elected.Sub(closed); d > testTTL+2*time.Second {
		t.Fatalf("b elected %s after a's client closed, want within TTL + 2 s", d)
	}
	if !deposed.Before(elected) {
		t.Fatal("a stepped down after b was elected")
	}
	noOverlap(t, a, b)
}

// TestDeletedKeyAndResign: deleting the leader's election key (an operator
// forcing a hand-over) ends its term with ErrKeyGone; a leader whose
// OnElected returns an error resigns (ErrResigned) and the other takes
// over at once.
func TestDeletedKeyAndResign(t *testing.T) {
	cl := etcdtest.Start(t, etcdtest.Options{Members: 1})
	c := cl.Client(t)
	a := startCand(t, "a", cl.Client(t))
	tmA, _ := a.waitElected(t, 10*time.Second)
	b := startCand(t, "b", cl.Client(t))
	waitLeader(t, b, "a")

	if _, err := c.Delete(context.Background(), tmA.Key); err != nil {
		t.Fatal(err)
	}
	if _, reason := a.waitDeposed(t, testTTL); !errors.Is(reason, ErrKeyGone) {
		t.Fatalf("a deposed for %v, want ErrKeyGone", reason)
	}
	b.waitElected(t, testTTL)
	waitLeader(t, a, "b")
	waitKeys(t, c, 2) // a campaigns again, queued behind b

	b.resign <- fmt.Errorf("boot services failed to start")
	resigned, reason := b.waitDeposed(t, testTTL)
	if !errors.Is(reason, ErrResigned) {
		t.Fatalf("b deposed for %v, want ErrResigned", reason)
	}
	_, elected := a.waitElected(t, testTTL)
	if d := elected.Sub(resigned); d > testTTL/2 {
		t.Fatalf("a took over %s after b resigned, want well under a TTL", d)
	}
	noOverlap(t, a, b)
}

// waitKeys waits up to 10 s until the election has n keys (candidates).
func waitKeys(t *testing.T, c *clientv3.Client, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := c.Get(context.Background(), "/test/leader/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d election keys, want %d", resp.Count, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestNewElectorValidates(t *testing.T) {
	cl := &clientv3.Client{}
	for _, c := range []struct {
		name string
		cfg  ElectorConfig
	}{
		{"no client", ElectorConfig{Self: Candidate{ID: "a"}}},
		{"no id", ElectorConfig{Client: cl}},
		{"fractional ttl", ElectorConfig{Client: cl, Self: Candidate{ID: "a"}, TTL: 1500 * time.Millisecond}},
		{"short ttl", ElectorConfig{Client: cl, Self: Candidate{ID: "a"}, TTL: 500 * time.Millisecond}},
		{"newline id", ElectorConfig{Client: cl, Self: Candidate{ID: "a\nb"}}},
	} {
		if _, err := NewElector(c.cfg); err == nil {
			t.Errorf("%s: NewElector(%+v) = nil error", c.name, c.cfg)
		}
	}
	e, err := NewElector(ElectorConfig{Client: cl, Self: Candidate{ID: "a"}})
	if err != nil {
		t.Fatal(err)
	}
	if e.ttl != 10*time.Second || e.prefix != "/machina/leader/" {
		t.Fatalf("defaults: ttl %s prefix %q, want 10s and /machina/leader/", e.ttl, e.prefix)
	}
}
