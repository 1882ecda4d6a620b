package eventsout_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/eventsout"
	"github.com/machina-metal/machina/internal/etcdtest"
	"github.com/machina-metal/machina/state"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMain(m *testing.M) { os.Exit(etcdtest.Main(m)) }

var secret = []byte("test-webhook-secret")

// site opens "the same" store again and again on one engine: a bbolt
// file, or one key prefix of a shared etcd cluster.
type site struct {
	t      *testing.T
	engine string
	path   string
	ret    state.Retention
}

func newSite(t *testing.T, engine string, ret state.Retention) *site {
	return &site{t: t, engine: engine, path: filepath.Join(t.TempDir(), "state.db"), ret: ret}
}

func (s *site) open() *state.Store {
	s.t.Helper()
	opts := state.Options{NoSync: true, Retention: s.ret}
	var st *state.Store
	var err error
	if s.engine == "bbolt" {
		st, err = state.Open(s.path, opts)
	} else {
		c := etcdtest.Shared(s.t, etcdtest.Options{})
		st, err = state.OpenEtcd(state.EtcdConfig{Endpoints: c.Config().Endpoints, Prefix: "/t/" + strings.ReplaceAll(s.t.Name(), "/", "_") + "/"}, opts)
	}
	if err != nil {
		s.t.Fatalf("open state: %v", err)
	}
	return st
}

func eachEngine(t *testing.T, body func(t *testing.T, engine string)) {
	for _, e := range []string{"bbolt", "etcd"} {
		t.Run(e, func(t *testing.T) { body(t, e) })
	}
}

// receiver is a loopback webhook receiver that verifies every request
// and records the event IDs it answered 2xx to, in arrival order.
type receiver struct {
	t    *testing.T
	srv  *httptest.Server
	mu   sync.Mutex
	n    int                             // requests seen
	plan func(n int) string              // "500", "hang" or "ok" for the n-th request (1-based)
	ids  []uint64                        // accepted event IDs, in order
	evs  map[uint64]eventsout.CloudEvent // accepted events by ID
	bad  []string                        // verification failures
	quit chan struct{}
}

func newReceiver(t *testing.T, plan func(n int) string) *receiver {
	r := &receiver{t: t, plan: plan, evs: map[uint64]eventsout.CloudEvent{}, quit: make(chan struct{})}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(func() { close(r.quit); r.srv.Close() })
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.n++
	action := r.plan(r.n)
	r.mu.Unlock()
	switch action {
	case "500":
		http.Error(w, "receiver down", http.StatusInternalServerError)
		return
	case "hang": // beyond the sender's timeout: until it gives up
		select {
		case <-req.Context().Done():
		case <-r.quit:
		}
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := eventsout.Verify(secret, req.Header.Get(eventsout.HeaderTimestamp), req.Header.Get(eventsout.HeaderSignature), body, time.Now(), 5*time.Minute); err != nil {
		r.bad = append(r.bad, err.Error())
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	if ct := req.Header.Get("Content-Type"); ct != eventsout.ContentType {
		r.bad = append(r.bad, "content type "+ct)
	}
	var ce eventsout.CloudEvent
	if err := json.Unmarshal(body, &ce); err != nil {
		r.bad = append(r.bad, err.Error())
		return
	}
	id, err := strconv.ParseUint(ce.ID, 10, 64)
	if err != nil || ce.SpecVersion != "1.0" || ce.Type != eventsout.TypePrefix+string(ce.Data.Kind) || ce.Data.Seq != id || ce.Subject != ce.Data.Server || ce.Source != "http://controller.test" {
		r.bad = append(r.bad, fmt.Sprintf("envelope %+v", ce))
	}
	r.ids = append(r.ids, id)
	r.evs[id] = ce
}

// accepted returns the accepted IDs with consecutive repeats (at-least-once
// retries) folded.
func (r *receiver) accepted() []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.bad) > 0 {
		r.t.Fatalf("receiver rejected requests: %q", r.bad)
	}
	return slices.Compact(slices.Clone(r.ids))
}

// waitFor polls until the receiver accepted want (folded), or fails.
func (r *receiver) waitFor(want []uint64) {
	r.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		got := r.accepted()
		if slices.Equal(got, want) {
			return
		}
		if len(got) > len(want) || time.Now().After(deadline) {
			r.t.Fatalf("receiver accepted %v, want %v", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// start runs a sender on st to r until the returned stop is called.
func start(t *testing.T, st *state.Store, r *receiver) (*eventsout.Sender, func()) {
	t.Helper()
	s, err := eventsout.New(eventsout.Config{Store: st, Source: "http://controller.test",
		Webhooks: []eventsout.Webhook{{URL: r.srv.URL + "/hook", Secret: secret}},
		Timeout:  300 * time.Millisecond, MinBackoff: 10 * time.Millisecond, MaxBackoff: 80 * time.Millisecond, Poll: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	return s, func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}
}

func appendEvents(t *testing.T, st *state.Store, n int) []uint64 {
	t.Helper()
	var seqs []uint64
	for i := range n {
		e := state.Event{Message: fmt.Sprintf("event %d", i)}
		switch i % 3 {
		case 1:
			e.Server, e.Kind, e.Actor = "node-"+strconv.Itoa(i%2), state.EventPower, state.ActorController
		case 2:
			e.Actor = "admin-ops" // an audit event: the other log
		}
		got, err := st.AppendEvent(e)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, got.Seq)
	}
	return seqs
}

// waitCounter polls c until it reads want, or fails after a minute.
func waitCounter(t *testing.T, c prometheus.Collector, want float64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for testutil.ToFloat64(c) != want {
		if time.Now().After(deadline) {
			t.Fatalf("counter = %v, want %v", testutil.ToFloat64(c), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDeliversThroughFailuresAndRestart: a receiver that answers 500,
// then hangs beyond the timeout, then recovers gets every event (machine
// and audit logs) once accepted, in Seq order, each signature verified;
// the delivery cursor survives closing and reopening store and sender.
func TestDeliversThroughFailuresAndRestart(t *testing.T) {
	eachEngine(t, func(t *testing.T, engine string) {
		site := newSite(t, engine, state.Retention{})
		st := site.open()
		r := newReceiver(t, func(n int) string {
			switch n {
			case 1:
				return "500"
			case 2, 3:
				return "hang"
			}
			return "ok"
		})
		name := eventsout.Webhook{URL: r.srv.URL + "/hook"}.Name()
		if _, err := st.WebhookCursor(name); err != nil { // a new webhook starts here
			t.Fatal(err)
		}
		want := appendEvents(t, st, 12)
		s, stop := start(t, st, r)
		r.waitFor(want)
		// The receiver records an event before its answer reaches the
		// sender; stopping in between leaves that event undelivered (it is
		// sent again after the restart: at least once). Stop only once the
		// sender counted the last answer, which it does before moving the
		// cursor past it.
		waitCounter(t, s.Collectors()[0], float64(len(want)))
		stop()
		if f := testutil.ToFloat64(s.Collectors()[1]); f < 3 {
			t.Errorf("machina_webhook_failed_total = %v, want at least 3 (one 500, two timeouts)", f)
		}
		if d := testutil.ToFloat64(s.Collectors()[0]); d != float64(len(want)) {
			t.Errorf("machina_webhook_delivered_total = %v, want %d", d, len(want))
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}

		st = site.open()
		defer st.Close()
		if c, err := st.WebhookCursor(name); err != nil || c != want[len(want)-1] {
			t.Fatalf("cursor after reopen = %d, %v; want %d", c, err, want[len(want)-1])
		}
		more := appendEvents(t, st, 4)
		_, stop = start(t, st, r)
		defer stop()
		r.waitFor(append(slices.Clone(want), more...)) // none of the first delivered again
	})
}

// TestEvictedBeforeDeliveryIsDropped: events the log's retention evicted
// before delivery are counted in machina_webhook_dropped_total and
// recorded as one webhook.dropped event, which is itself delivered.
func TestEvictedBeforeDeliveryIsDropped(t *testing.T) {
	eachEngine(t, func(t *testing.T, engine string) {
		site := newSite(t, engine, state.Retention{MaxEvents: 5})
		st := site.open()
		defer st.Close()
		r := newReceiver(t, func(int) string { return "ok" })
		name := eventsout.Webhook{URL: r.srv.URL + "/hook"}.Name()
		if _, err := st.WebhookCursor(name); err != nil {
			t.Fatal(err)
		}
		var seqs []uint64
		for i := range 12 {
			e, err := st.AppendEvent(state.Event{Actor: state.ActorController, Message: fmt.Sprintf("event %d", i)})
			if err != nil {
				t.Fatal(err)
			}
			seqs = append(seqs, e.Seq)
		}
		kept := seqs[7:] // MaxEvents 5: seqs[:7] are evicted
		s, stop := start(t, st, r)
		defer stop()
		dropSeq := seqs[11] + 1
		r.waitFor(append(slices.Clone(kept), dropSeq))
		if d := testutil.ToFloat64(s.Collectors()[2]); d != 7 {
			t.Errorf("machina_webhook_dropped_total = %v, want 7", d)
		}
		r.mu.Lock()
		ce := r.evs[dropSeq]
		r.mu.Unlock()
		if ce.Data.Kind != state.EventWebhookDropped || !strings.Contains(ce.Data.Message, "7 events evicted") {
			t.Errorf("drop event = %+v", ce.Data)
		}
	})
}

func TestWebhookValidate(t *testing.T) {
	for _, c := range []struct {
		url string
		ok  bool
	}{
		{"https://hooks.example.com/machina", true},
		{"http://127.0.0.1:9000/x", true},
		{"ftp://hooks.example.com/", false},
		{"file:///tmp/x", false},
		{"https://user:pw@hooks.example.com/", false},
		{"hooks.example.com/x", false},
	} {
		err := eventsout.Webhook{URL: c.url, Secret: secret}.Validate()
		if (err == nil) != c.ok {
			t.Errorf("Validate(%q) = %v, want ok=%v", c.url, err, c.ok)
		}
	}
	if err := (eventsout.Webhook{URL: "https://h.example/", Secret: nil}).Validate(); err == nil {
		t.Error("empty secret accepted")
	}
}

func TestVerifyRejectsStaleAndForged(t *testing.T) {
	body := []byte(`{"id":"1"}`)
	now := time.Unix(1_800_000_000, 0)
	ts := strconv.FormatInt(now.Unix(), 10)
	sig := eventsout.Sign(secret, ts, body)
	if err := eventsout.Verify(secret, ts, sig, body, now.Add(time.Minute), 5*time.Minute); err != nil {
		t.Fatalf("fresh request refused: %v", err)
	}
	if err := eventsout.Verify(secret, ts, sig, body, now.Add(6*time.Minute), 5*time.Minute); err == nil {
		t.Error("a replay 6 minutes old accepted")
	}
	if err := eventsout.Verify(secret, ts, sig, []byte(`{"id":"2"}`), now, 5*time.Minute); err == nil {
		t.Error("a changed body accepted")
	}
	if err := eventsout.Verify([]byte("other"), ts, sig, body, now, 5*time.Minute); err == nil {
		t.Error("another secret's signature accepted")
	}
}
