package api

import (
	"fmt"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
)

// TestRetriesHeardOnlyWithinSilentAfter: a new retry counts as hearing
// from the machine only while less than the plan's SilentAfter has passed
// since its bytes last moved. An agent that names a new retry forever (a
// wedged or hostile one; ours stops within SilentAfter less a progress
// interval) stops being heard at that bound, so the reconciler's silent
// check boots it again; bytes that move reset the bound.
func TestRetriesHeardOnlyWithinSilentAfter(t *testing.T) {
	const silentAfter = 5 * time.Minute
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	s := &state.Server{Name: "r1-n07", Lifecycle: state.LifecycleDeploying, LifecycleAt: t0.Add(-time.Minute)}
	report := func(at time.Duration, done int64, retry string) (heard bool) {
		before := s.LastHeardAt
		noteProgress(s, v1.Progress{Step: v1.StepImageDownload, BytesDone: done, BytesTotal: 1 << 30, Retry: retry}, t0.Add(at), silentAfter)
		if s.Progress == nil || s.Progress.Retry != retry {
			t.Fatalf("at %v: stored progress %+v, want retry %q kept for the status", at, s.Progress, retry)
		}
		return s.LastHeardAt.After(before)
	}
	if !report(0, 1<<20, "") {
		t.Fatal("first report not heard")
	}
	// New retries, no byte moving: heard while within silentAfter of the last advance.
	n := 0
	for at := 30 * time.Second; at < silentAfter; at += 30 * time.Second {
		n++
		if !report(at, 1<<20, fmt.Sprintf("piece 3 of 256: controller answered 503, retry %d of 19 in 8s", n)) {
			t.Fatalf("retry %d at %v (within %v of the last advance) not heard", n, at, silentAfter)
		}
	}
	heardAt := s.LastHeardAt
	for at := silentAfter; at < 3*silentAfter; at += 30 * time.Second {
		n++
		if report(at, 1<<20, fmt.Sprintf("piece 3 of 256: controller answered 503, retry %d of 19 in 8s", n)) {
			t.Fatalf("retry %d at %v (%v after the last advance, bound %v) was heard", n, at, at, silentAfter)
		}
	}
	if !s.LastHeardAt.Equal(heardAt) {
		t.Fatalf("LastHeardAt moved to %s past the bound (last heard %s)", s.LastHeardAt, heardAt)
	}
	// Bytes move: heard, and the bound starts again from there.
	if !report(3*silentAfter, 2<<20, "") {
		t.Fatal("a report whose bytes moved was not heard")
	}
	if !report(3*silentAfter+time.Minute, 2<<20, "piece 4 of 256: controller answered 503, retry 1 of 19 in 1s") {
		t.Fatal("a retry one minute after the bytes moved again was not heard")
	}
	// No bound configured (silentAfter <= 0): every new retry is heard.
	s2 := &state.Server{Name: "r1-n08", Lifecycle: state.LifecycleDeploying, LifecycleAt: t0}
	noteProgress(s2, v1.Progress{Step: v1.StepImageDownload, BytesDone: 1, BytesTotal: 2}, t0, 0)
	noteProgress(s2, v1.Progress{Step: v1.StepImageDownload, BytesDone: 1, BytesTotal: 2, Retry: "retry 1"}, t0.Add(time.Hour), 0)
	if !s2.LastHeardAt.Equal(t0.Add(time.Hour)) {
		t.Errorf("silentAfter 0: a new retry an hour later not heard (LastHeardAt %s)", s2.LastHeardAt)
	}
}
