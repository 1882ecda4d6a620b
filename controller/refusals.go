package controller

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/machina-metal/machina/boot/ipxe"
	"github.com/machina-metal/machina/state"
)

// refusalSummary counts the boot endpoints' refusals (rate-limited,
// token-rejected) and writes one event per interval summarising them,
// instead of one event (and one fsync, and a planning pass woken by the
// store) per refused request: a flood of refused requests can no longer
// rotate the audit log and the servers' histories away. Discoveries are
// rare and bounded (auto-enrol's cap) and still get an event each.
// machina_boot_refusals_total{kind} counts every refusal. Safe for
// concurrent use.
type refusalSummary struct {
	st      *state.Store
	counter *prometheus.CounterVec

	mu     sync.Mutex
	counts map[ipxe.EventKind]int64
	last   ipxe.Event
}

func newRefusalSummary(st *state.Store, reg prometheus.Registerer) (*refusalSummary, error) {
	r := &refusalSummary{st: st, counts: map[ipxe.EventKind]int64{},
		counter: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "machina_boot_refusals_total",
			Help: "Boot endpoint requests refused, by kind (rate-limited, token-rejected)."}, []string{"kind"})}
	// Both refusal kinds are exported from the start (at 0), so a
	// dashboard or alert on them has a series before the first refusal.
	for _, k := range []ipxe.EventKind{ipxe.EventTokenRejected, ipxe.EventRateLimited} {
		r.counter.WithLabelValues(string(k))
	}
	if reg != nil {
		if err := reg.Register(r.counter); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// event is the ipxe handler's OnEvent: it must not block.
func (r *refusalSummary) event(e ipxe.Event) {
	if e.Kind == ipxe.EventDiscovered {
		_, _ = r.st.AppendEvent(state.Event{Kind: state.EventKind("boot." + string(e.Kind)), Message: fmt.Sprintf("%s mac=%s ip=%s: %s", e.Kind, e.MAC, e.IP, e.Reason)})
		return
	}
	r.counter.WithLabelValues(string(e.Kind)).Inc()
	r.mu.Lock()
	r.counts[e.Kind]++
	r.last = e
	r.mu.Unlock()
}

// flush writes one event for the refusals counted since the last flush,
// nothing when there were none.
func (r *refusalSummary) flush(every time.Duration) {
	r.mu.Lock()
	counts, last := r.counts, r.last
	r.counts = map[ipxe.EventKind]int64{}
	r.mu.Unlock()
	if len(counts) == 0 {
		return
	}
	var parts []string
	for k, n := range counts {
		parts = append(parts, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(parts)
	_, _ = r.st.AppendEvent(state.Event{Kind: "boot.refused", Message: fmt.Sprintf("boot requests refused in the last %s: %s (last: %s mac=%s ip=%s: %s)",
		every, strings.Join(parts, ", "), last.Kind, last.MAC, last.IP, last.Reason)})
}

// run flushes every interval until ctx ends, then once more.
func (r *refusalSummary) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			r.flush(every)
			return
		case <-t.C:
			r.flush(every)
		}
	}
}
