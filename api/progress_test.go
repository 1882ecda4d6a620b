package api_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
)

// progressFixture is machineFixture with ProgressEvery set: the server
// r1-n07 deploying, and an image token for it.
func progressFixture(t *testing.T, every time.Duration) (*fixture, string) {
	t.Helper()
	f := newFixture(t, state.Options{})
	m, err := api.NewMachine(api.MachineConfig{Store: f.store, Planner: &flakyPlanner{}, ProgressEvery: every})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Mount(f.api); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.CreateServer(state.Server{Name: "r1-n07", BootMAC: onceMAC}); err != nil {
		t.Fatal(err)
	}
	walk(t, f, state.LifecycleCommissioning, state.LifecycleReady, state.LifecycleAllocated, state.LifecycleDeploying)
	tok, _, err := f.store.IssueToken(state.TokenSpec{Purpose: state.PurposeImage, Server: "r1-n07", MAC: onceMAC, Reusable: true, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return f, tok
}

// postProgress posts p until it is not rate limited (the limiter's gap is
// ProgressEvery/2; the fixtures that take several reports use a gap of a
// millisecond), and returns the status.
func postProgress(t *testing.T, f *fixture, tok string, p v1.Progress) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, _, body := f.do(t, http.MethodPost, v1.PathAgentProgress, tok, mustJSON(t, p))
		if code != http.StatusTooManyRequests || time.Now().After(deadline) {
			if code != http.StatusNoContent {
				t.Logf("progress %+v: %d %s", p, code, body)
			}
			return code
		}
		time.Sleep(time.Millisecond) // the limiter's gap; bounded by the deadline
	}
}

func eventCount(t *testing.T, f *fixture) int {
	t.Helper()
	evs, err := f.store.Events(state.EventQuery{Limit: 100000})
	if err != nil {
		t.Fatal(err)
	}
	return len(evs)
}

// TestProgressHeardOnlyWhenBytesMove: a deploying machine's progress
// report with the image token is stored on the server, and counts as
// hearing from the machine (LastHeardAt) only when its step or bytes moved
// forward: the same bytes again, or fewer, move Progress.At and leave
// LastHeardAt and Progress.AdvancedAt where they were, so the plan's
// silent-after still sees a stalled write as silent. No report writes an
// event, and none moves the lifecycle. Before the endpoint existed, only
// the image GET's start counted, and a write longer than silent-after was
// network-booted again mid-write.
func TestProgressHeardOnlyWhenBytesMove(t *testing.T) {
	f, tok := progressFixture(t, 2*time.Millisecond)
	events := eventCount(t, f)
	const total = 40 << 30
	if code := postProgress(t, f, tok, v1.Progress{Step: v1.StepImageDownload, BytesDone: 1 << 30, BytesTotal: total, RateBytesPerSecond: 100 << 20}); code != http.StatusNoContent {
		t.Fatalf("first report: %d, want 204", code)
	}
	s1, _ := f.store.Server("r1-n07")
	if s1.Progress == nil || s1.Progress.BytesDone != 1<<30 || s1.Progress.BytesTotal != total || s1.Progress.RateBytesPerSecond != 100<<20 || s1.Progress.Step != v1.StepImageDownload {
		t.Fatalf("progress after the first report: %+v", s1.Progress)
	}
	if !strings.HasPrefix(s1.LastHeard, "progress: image-download") || s1.LastHeardAt.IsZero() || !s1.LastHeardAt.Equal(s1.Progress.AdvancedAt) {
		t.Fatalf("first report not heard: %q at %s (advanced %s)", s1.LastHeard, s1.LastHeardAt, s1.Progress.AdvancedAt)
	}
	for _, p := range []v1.Progress{
		{Step: v1.StepImageDownload, BytesDone: 1 << 30, BytesTotal: total}, // the same bytes: stalled
		{Step: v1.StepImageDownload, BytesDone: 1 << 20, BytesTotal: total}, // fewer bytes: not an advance
	} {
		if code := postProgress(t, f, tok, p); code != http.StatusNoContent {
			t.Fatalf("report %+v: %d, want 204", p, code)
		}
		s, _ := f.store.Server("r1-n07")
		if !s.LastHeardAt.Equal(s1.LastHeardAt) || !s.Progress.AdvancedAt.Equal(s1.Progress.AdvancedAt) {
			t.Errorf("report %+v without an advance: LastHeardAt %s -> %s, AdvancedAt %s -> %s", p, s1.LastHeardAt, s.LastHeardAt, s1.Progress.AdvancedAt, s.Progress.AdvancedAt)
		}
		if !s.Progress.At.After(s1.Progress.At) || s.Progress.BytesDone != p.BytesDone {
			t.Errorf("report %+v not stored: %+v", p, s.Progress)
		}
	}
	for _, p := range []v1.Progress{
		{Step: v1.StepImageDownload, BytesDone: 2 << 30, BytesTotal: total}, // more bytes
		{Step: v1.StepImageWrite, BytesDone: 0, BytesTotal: total},          // the next step
	} {
		before, _ := f.store.Server("r1-n07")
		if code := postProgress(t, f, tok, p); code != http.StatusNoContent {
			t.Fatalf("report %+v: %d, want 204", p, code)
		}
		s, _ := f.store.Server("r1-n07")
		if !s.LastHeardAt.After(before.LastHeardAt) || !s.Progress.AdvancedAt.Equal(s.Progress.At) {
			t.Errorf("advancing report %+v not heard: LastHeardAt %s -> %s, progress %+v", p, before.LastHeardAt, s.LastHeardAt, s.Progress)
		}
	}
	s, _ := f.store.Server("r1-n07")
	if s.Lifecycle != state.LifecycleDeploying {
		t.Errorf("lifecycle %s after progress reports, want deploying", s.Lifecycle)
	}
	if n := eventCount(t, f) - events; n != 0 {
		t.Errorf("progress reports wrote %d events, want none", n)
	}
}

// TestProgressRefused: a progress report needs the deploy's image token
// (another purpose, an unknown token or none is 403), a well-formed body
// (a known step, 0 <= bytesDone <= bytesTotal <= 1 PiB, a rate >= 0, no
// unknown field, at most 1 KiB: 400 or 413), a deploying server (409),
// and is taken at most once per half ProgressEvery per server (429, the
// record untouched). A refused report changes nothing on the record.
func TestProgressRefused(t *testing.T) {
	f, tok := progressFixture(t, time.Hour)
	good := v1.Progress{Step: v1.StepImageWrite, BytesDone: 10, BytesTotal: 100}
	report := issueFor(t, f, state.PurposeReport)
	for _, tc := range []struct {
		name, token, body string
		want              int
	}{
		{"no token", "", mustJSON(t, good), http.StatusForbidden},
		{"unknown token", "made-up", mustJSON(t, good), http.StatusForbidden},
		{"commissioning token", report, mustJSON(t, good), http.StatusForbidden},
		{"unknown step", tok, `{"step":"format","bytesDone":1,"bytesTotal":2,"rateBytesPerSecond":0}`, http.StatusBadRequest},
		{"done over total", tok, `{"step":"image-write","bytesDone":3,"bytesTotal":2,"rateBytesPerSecond":0}`, http.StatusBadRequest},
		{"negative", tok, `{"step":"image-write","bytesDone":-1,"bytesTotal":2,"rateBytesPerSecond":0}`, http.StatusBadRequest},
		{"negative rate", tok, `{"step":"image-write","bytesDone":1,"bytesTotal":2,"rateBytesPerSecond":-5}`, http.StatusBadRequest},
		{"over 1 PiB", tok, `{"step":"image-write","bytesDone":1,"bytesTotal":2251799813685248,"rateBytesPerSecond":0}`, http.StatusBadRequest},
		{"unknown field", tok, `{"step":"image-write","bytesDone":1,"bytesTotal":2,"rateBytesPerSecond":0,"lifecycle":"deployed"}`, http.StatusBadRequest},
		{"null", tok, `null`, http.StatusBadRequest},
		{"retry too long", tok, `{"step":"image-download","bytesDone":1,"bytesTotal":2,"rateBytesPerSecond":0,"retry":"` + strings.Repeat("x", v1.MaxProgressRetryBytes+1) + `"}`, http.StatusBadRequest},
		{"retry with a control character", tok, `{"step":"image-download","bytesDone":1,"bytesTotal":2,"rateBytesPerSecond":0,"retry":"piece 1\u001b[2J"}`, http.StatusBadRequest},
		{"oversize", tok, `{"step":"image-write","bytesDone":1,"bytesTotal":2,"rateBytesPerSecond":0` + strings.Repeat(" ", 2048) + `}`, http.StatusRequestEntityTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := f.store.Server("r1-n07")
			code, _, body := f.do(t, http.MethodPost, v1.PathAgentProgress, tc.token, tc.body)
			if code != tc.want {
				t.Errorf("POST progress: %d %s, want %d", code, body, tc.want)
			}
			if after, _ := f.store.Server("r1-n07"); after.Revision != before.Revision {
				t.Errorf("refused report wrote the record (revision %d -> %d)", before.Revision, after.Revision)
			}
		})
	}
	// The first good report is taken; the next one within half of
	// ProgressEvery (30 minutes here) is 429 and writes nothing.
	if code, _, body := f.do(t, http.MethodPost, v1.PathAgentProgress, tok, mustJSON(t, good)); code != http.StatusNoContent {
		t.Fatalf("good report: %d %s", code, body)
	}
	before, _ := f.store.Server("r1-n07")
	for range 20 {
		code, hdr, _ := f.do(t, http.MethodPost, v1.PathAgentProgress, tok, mustJSON(t, v1.Progress{Step: v1.StepImageWrite, BytesDone: 20, BytesTotal: 100}))
		if code != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" {
			t.Fatalf("report sooner than the interval: %d (Retry-After %q), want 429 with Retry-After", code, hdr.Get("Retry-After"))
		}
	}
	if after, _ := f.store.Server("r1-n07"); after.Revision != before.Revision || after.Progress.BytesDone != 10 {
		t.Errorf("rate-limited reports wrote the record: revision %d -> %d, progress %+v", before.Revision, after.Revision, after.Progress)
	}
	// A server no longer deploying refuses progress (409) and keeps its lifecycle.
	f2, tok2 := progressFixture(t, time.Millisecond)
	walk(t, f2, state.LifecycleDeployed)
	if code := postProgress(t, f2, tok2, good); code != http.StatusConflict {
		t.Errorf("progress for a deployed server: %d, want 409", code)
	}
	if s, _ := f2.store.Server("r1-n07"); s.Lifecycle != state.LifecycleDeployed || s.Progress != nil {
		t.Errorf("after a refused report: %s, progress %+v", s.Lifecycle, s.Progress)
	}
}

// TestPlanCarriesProgressEvery: the deploy plan tells the ramdisk how often
// to report (MachineConfig.ProgressEvery).
func TestPlanCarriesProgressEvery(t *testing.T) {
	f, _ := progressFixture(t, 7*time.Second)
	plan := issueFor(t, f, state.PurposePlan)
	code, _, body := f.do(t, http.MethodGet, v1.PathAgentPlan, plan, "")
	if code != http.StatusOK {
		t.Fatalf("plan: %d %s", code, body)
	}
	if !strings.Contains(string(body), `"progressEveryNs":7000000000`) {
		t.Errorf("plan %s has no progressEveryNs of 7s", body)
	}
}

// TestProgressRetryHeard: a report naming a new retry of the agent's
// failing image or piece request (v1.Progress.Retry) counts as hearing
// from the machine though its bytes did not move, and LastHeard and the
// stored progress say why; the same retry reported again is not heard (a
// wedged agent still goes silent), and a report whose bytes moved clears
// it. Without it a machine working through its bounded retries was taken
// for silent and booted again, and the operator saw "silent" rather than
// the stalled controller request.
func TestProgressRetryHeard(t *testing.T) {
	f, tok := progressFixture(t, 2*time.Millisecond)
	const total = 64 << 22
	post := func(p v1.Progress) state.Server {
		t.Helper()
		if code := postProgress(t, f, tok, p); code != http.StatusNoContent {
			t.Fatalf("report %+v: %d, want 204", p, code)
		}
		s, _ := f.store.Server("r1-n07")
		return s
	}
	s0 := post(v1.Progress{Step: v1.StepImageDownload, BytesDone: 12 << 22, BytesTotal: total})
	retry := "piece 12 of 64: controller request stalled for 1m0s, retry 1 of 19 in 250ms"
	s1 := post(v1.Progress{Step: v1.StepImageDownload, BytesDone: 12 << 22, BytesTotal: total, Retry: retry})
	if !s1.LastHeardAt.After(s0.LastHeardAt) || !strings.Contains(s1.LastHeard, "retrying: "+retry) {
		t.Errorf("new retry not heard: %q at %s (before %s)", s1.LastHeard, s1.LastHeardAt, s0.LastHeardAt)
	}
	if s1.Progress.Retry != retry || !s1.Progress.AdvancedAt.Equal(s0.Progress.AdvancedAt) {
		t.Errorf("progress %+v: want the retry stored and AdvancedAt unchanged (no byte moved)", s1.Progress)
	}
	if p := s1.CurrentProgress(); p == nil || p.Retry != retry {
		t.Errorf("CurrentProgress() = %+v, want the retry", p)
	}
	s2 := post(v1.Progress{Step: v1.StepImageDownload, BytesDone: 12 << 22, BytesTotal: total, Retry: retry})
	if !s2.LastHeardAt.Equal(s1.LastHeardAt) {
		t.Errorf("the same retry again was heard: LastHeardAt %s -> %s", s1.LastHeardAt, s2.LastHeardAt)
	}
	retry2 := "piece 12 of 64: controller request stalled for 1m0s, retry 2 of 19 in 500ms"
	if s3 := post(v1.Progress{Step: v1.StepImageDownload, BytesDone: 12 << 22, BytesTotal: total, Retry: retry2}); !s3.LastHeardAt.After(s2.LastHeardAt) {
		t.Errorf("the next retry was not heard: LastHeardAt %s -> %s", s2.LastHeardAt, s3.LastHeardAt)
	}
	if s4 := post(v1.Progress{Step: v1.StepImageDownload, BytesDone: 13 << 22, BytesTotal: total}); s4.Progress.Retry != "" || strings.Contains(s4.LastHeard, "retrying") {
		t.Errorf("bytes moved: progress %+v, last heard %q; want the retry cleared", s4.Progress, s4.LastHeard)
	}
}

// TestPlanCarriesSilentAfter: the deploy plan tells the ramdisk the
// controller's silent-after window (MachineConfig.SilentAfter, default 5
// minutes), which bounds its image and piece retries.
func TestPlanCarriesSilentAfter(t *testing.T) {
	f, _ := progressFixture(t, 7*time.Second)
	plan := issueFor(t, f, state.PurposePlan)
	code, _, body := f.do(t, http.MethodGet, v1.PathAgentPlan, plan, "")
	if code != http.StatusOK {
		t.Fatalf("plan: %d %s", code, body)
	}
	if !strings.Contains(string(body), `"silentAfterNs":300000000000`) {
		t.Errorf("plan %s has no silentAfterNs of 5m", body)
	}
}
