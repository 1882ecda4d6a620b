package controller

import (
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/reconciler/plan"
)

// TestStatusFeedCoalesces: passes arriving faster than the gap are
// coalesced, and the newest one is always built in the end.
func TestStatusFeedCoalesces(t *testing.T) {
	var mu sync.Mutex
	var built []string
	done := make(chan struct{}, 100)
	f := &statusFeed{gap: 20 * time.Millisecond, build: func(r plan.Result) {
		mu.Lock()
		built = append(built, r.Brake)
		mu.Unlock()
		done <- struct{}{}
	}}
	const passes = 200
	for i := range passes {
		f.onPass(plan.Result{Brake: string(rune('a' + i%26))})
	}
	last := string(rune('a' + (passes-1)%26))
	deadline := time.After(10 * time.Second)
	for {
		mu.Lock()
		n, tail := len(built), ""
		if n > 0 {
			tail = built[n-1]
		}
		mu.Unlock()
		if tail == last && n >= 2 {
			break
		}
		select {
		case <-done:
		case <-deadline:
			t.Fatalf("newest pass never built: built %q", built)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(built) >= passes/2 {
		t.Errorf("%d builds for %d back-to-back passes: not coalesced", len(built), passes)
	}
	if built[0] != "a" {
		t.Errorf("first pass %q not built at once", built[0])
	}
}

// TestStatusBuildGap: a fifth of the status interval, at most 1 s.
func TestStatusBuildGap(t *testing.T) {
	for _, c := range []struct{ in, want time.Duration }{
		{0, time.Second}, {30 * time.Second, time.Second}, {time.Second, 200 * time.Millisecond}, {50 * time.Millisecond, 10 * time.Millisecond},
	} {
		if got := statusBuildGap(c.in); got != c.want {
			t.Errorf("statusBuildGap(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// TestStatusUrgency: only news is urgent: a newly invalid revision (or
// another invalid one), a newly stalled server; the same invalid revision
// or the same stalled servers at the next pass are not.
func TestStatusUrgency(t *testing.T) {
	var u statusUrgency
	bad := &gitops.InvalidRevision{Commit: "aaaa"}
	for i, c := range []struct {
		inv     *gitops.InvalidRevision
		stalled []string
		want    bool
	}{
		{nil, nil, false},
		{bad, nil, true},
		{bad, nil, false},
		{&gitops.InvalidRevision{Commit: "bbbb"}, nil, true},
		{nil, []string{"s1"}, true},
		{nil, []string{"s1"}, false},
		{nil, []string{"s1", "s2"}, true},
		{nil, []string{"s2"}, false},
		{nil, []string{"s1", "s2"}, true}, // s1 stalled again after it was cleared
		{bad, []string{"s1", "s2"}, true}, // invalid again after a valid tip
	} {
		if got := u.check(c.inv, c.stalled); got != c.want {
			t.Errorf("check %d (%v, %v) = %v, want %v", i, c.inv, c.stalled, got, c.want)
		}
	}
}
