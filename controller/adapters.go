package controller

import (
	"context"
	"sync"
	"time"

	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/images"
	"github.com/machina-metal/machina/reconciler/plan"
)

// statusFeed passes reconcile passes' plans to the status writer, at most
// once per gap: each hand-over scans the store for stalled servers (to
// decide urgency), while a busy reconciler runs several passes a second.
// The snapshot itself is built by the writer when it writes. A pass that
// arrives inside the gap is kept and handed over when the gap ends, so the
// newest pass is always the one that reaches the status writer.
type statusFeed struct {
	mu      sync.Mutex
	build   func(plan.Result)
	gap     time.Duration // least time between builds; 0 builds every pass
	last    time.Time     // start of the newest build
	pending *plan.Result
	timer   *time.Timer
}

func (f *statusFeed) onPass(res plan.Result) {
	f.mu.Lock()
	b := f.build
	if b == nil {
		f.mu.Unlock()
		return
	}
	if wait := f.gap - time.Since(f.last); wait > 0 {
		f.pending = &res
		if f.timer == nil {
			f.timer = time.AfterFunc(wait, f.flush)
		}
		f.mu.Unlock()
		return
	}
	f.last = time.Now()
	f.mu.Unlock()
	b(res)
}

// flush builds the pass kept by onPass, if any.
func (f *statusFeed) flush() {
	f.mu.Lock()
	res, b := f.pending, f.build
	f.pending, f.timer = nil, nil
	f.last = time.Now()
	f.mu.Unlock()
	if res != nil && b != nil {
		b(*res)
	}
}

// imageStatus keeps the importer's latest status per image for status/.
type imageStatus struct {
	mu sync.Mutex
	m  map[string]images.Status
}

// RecordImageStatus implements images.StatusRecorder.
func (s *imageStatus) RecordImageStatus(_ context.Context, name string, st images.Status) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[name] = st
	return nil
}

func (s *imageStatus) list() []gitops.ImageStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []gitops.ImageStatus
	for name, st := range s.m {
		is := gitops.ImageStatus{Name: name, State: string(st.State), SizeBytes: st.SizeBytes, Message: st.Reason}
		if st.Raw.Hex != "" {
			is.Checksum = string(st.Raw.Algo) + ":" + st.Raw.Hex
		}
		out = append(out, is)
	}
	return out
}

// statusUrgency decides which status updates skip the commit interval:
// those that bring news an operator waits for, a newly invalid inventory
// revision or a newly stalled server. A revision that stays invalid or a
// server that stays stalled is not news again at every pass (the status
// file already says so), so it does not make a commit per pass.
type statusUrgency struct {
	mu      sync.Mutex
	invalid string          // commit of the invalid revision last reported
	stalled map[string]bool // servers stalled at the last check
}

// check returns true when inv names another invalid revision than the
// last check or stalled names a server that was not stalled then.
func (u *statusUrgency) check(inv *gitops.InvalidRevision, stalled []string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	urgent := false
	if inv != nil && inv.Commit != u.invalid {
		urgent = true
	}
	u.invalid = ""
	if inv != nil {
		u.invalid = inv.Commit
	}
	now := make(map[string]bool, len(stalled))
	for _, n := range stalled {
		now[n] = true
		urgent = urgent || !u.stalled[n]
	}
	u.stalled = now
	return urgent
}

// statusBuildGap is the least time between status builds for a status
// commit interval: a fifth of it, at most 1 s (a zero interval means the
// 30 s default). A status commit then lags the newest pass by at most the
// gap, and an urgent condition (a stalled server) reaches Git at most one
// gap later than it would with a build per pass.
func statusBuildGap(interval time.Duration) time.Duration {
	if interval <= 0 {
		interval = 30 * time.Second
	}
	return min(interval/5, time.Second)
}
