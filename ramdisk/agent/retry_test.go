package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/ramdisk/agent/agenttest"
)

// stallingDeploy runs a Runner's Deploy against an agenttest controller
// with plan whose image requests (Range requests when ranged, else every
// image GET) all stall after half a piece; it returns the controller, the
// deploy's result, how many stalled requests were made and its error.
func stallingDeploy(t *testing.T, plan v1.Plan, ranged bool, attempts int) (*agenttest.Controller, v1.DeployResult, int64, error) {
	t.Helper()
	root, dev := qemuMachine(t)
	img, m := pieceImage(t, v1.PieceBytes+4096)
	if plan.Wave != nil {
		plan.Pieces = &m
	}
	plan.Seed, plan.RootDevice = testSeed, v1.RootDeviceHint{Serial: "machina-vm0"}
	ctl := agenttest.NewController(agenttest.ControllerConfig{DeployToken: "tok-deploy", Image: img, Plan: plan})
	var stalled atomic.Int64
	srv := stallingServer(t, func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
		if r.URL.Path == "/images/os.img" && (!ranged || r.Header.Get("Range") != "") {
			stalled.Add(1)
			status := http.StatusOK
			if ranged {
				status = http.StatusPartialContent
			}
			stallMidBody(w, r, status, img[:v1.PieceBytes], release)
			return
		}
		ctl.ServeHTTP(w, r)
	})
	ctl.SetBaseURL(srv.URL)
	_, logger := newLogBuffer(t)
	r := &Runner{Client: &v1.AgentClient{BaseURL: srv.URL}, Token: "tok-deploy", Root: root, DevDir: dev,
		MemoryLimit: 64 << 20, Pieces: &PeerServer{}, StallTimeout: testStall, ImageAttempts: attempts, Logger: logger}
	ctx, cancel := context.WithTimeout(t.Context(), testBound)
	defer cancel()
	res, err := r.Deploy(ctx)
	return ctl, res, stalled.Load(), err
}

// retryNotes are the distinct Retry notes of the progress reports, in
// order.
func retryNotes(ps []v1.Progress) []string {
	var out []string
	for _, p := range ps {
		if p.Retry != "" && (len(out) == 0 || out[len(out)-1] != p.Retry) {
			out = append(out, p.Retry)
		}
	}
	return out
}

// TestRunnerDeployReportsPieceRetries: a deploy sharing pieces, whose
// controller stalls every piece request, posts a progress report naming
// the piece, the cause and the retry for each retry (so the controller
// hears it while no byte moves), then reports the failure in done naming
// the piece, the stall and the attempts. Without the retry notes the
// progress reports carry no Retry (none are posted at all: no byte ever
// arrived).
func TestRunnerDeployReportsPieceRetries(t *testing.T) {
	plan := v1.Plan{ProgressEvery: 100 * time.Millisecond, SilentAfter: time.Hour, Wave: &v1.Wave{ID: "w1", Token: "wave-secret"}}
	ctl, res, stalled, err := stallingDeploy(t, plan, true, 3)
	var pf *pieceFailure
	if !errors.As(err, &pf) || res.OK {
		t.Fatalf("Deploy() = %+v, %v; want the piece given up", res, err)
	}
	if stalled != 3 {
		t.Errorf("%d piece requests, want 3 (ImageAttempts)", stalled)
	}
	want := []string{
		"piece 0 of 2: controller request stalled for " + testStall.String() + ", retry 1 of 2 in 250ms",
		"piece 0 of 2: controller request stalled for " + testStall.String() + ", retry 2 of 2 in 500ms",
	}
	if got := retryNotes(ctl.Progress()); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("retry notes = %q, want %q", got, want)
	}
	for _, p := range ctl.Progress() {
		if p.Step != v1.StepImageDownload || p.BytesDone != 0 || p.BytesTotal != int64(v1.PieceBytes+4096) {
			t.Errorf("progress %+v: want the download step at 0 of the image's bytes", p)
		}
	}
	done := ctl.Done()
	if len(done) != 1 || done[0].OK || !strings.Contains(done[0].Reason, "get piece 0 from ") ||
		!strings.Contains(done[0].Reason, "gave up after 3 attempts") || !strings.Contains(done[0].Reason, errStalled.Error()) {
		t.Errorf("done = %+v, want one failure naming piece 0, 3 attempts and the stall", done)
	}
}

// TestRunnerDeployPieceRetriesEndWithinSilentAfter: with the plan's
// SilentAfter short, the piece's retries end once another attempt would
// start later than SilentAfter less ProgressEvery after the first, long
// before ImageAttempts, and done says so. Without the bound the agent
// makes all 20 requests (and, at the default one-minute stall, outlasts
// the controller's patience).
func TestRunnerDeployPieceRetriesEndWithinSilentAfter(t *testing.T) {
	plan := v1.Plan{ProgressEvery: 100 * time.Millisecond, SilentAfter: 2 * time.Second, Wave: &v1.Wave{ID: "w1", Token: "wave-secret"}}
	ctl, res, stalled, err := stallingDeploy(t, plan, true, 20)
	var pf *pieceFailure
	if !errors.As(err, &pf) || res.OK {
		t.Fatalf("Deploy() = %+v, %v; want the piece given up", res, err)
	}
	// Attempts start at 0, 0.75s and 1.75s at the earliest (500ms stalls,
	// 250ms and 500ms delays); the next would start at 3.25s.
	if stalled < 1 || stalled > 3 {
		t.Errorf("%d piece requests, want 1 to 3 (bounded by 1.9s, not by 20 attempts)", stalled)
	}
	done := ctl.Done()
	if len(done) != 1 || done[0].OK {
		t.Fatalf("done = %+v, want one failure", done)
	}
	for _, w := range []string{"get piece 0 from ", fmt.Sprintf("gave up after %d attempt", stalled), "no attempt starts later than 1.9s after the first", errStalled.Error()} {
		if !strings.Contains(done[0].Reason, w) {
			t.Errorf("done reason %q does not name %q", done[0].Reason, w)
		}
	}
	if n := len(retryNotes(ctl.Progress())); int64(n) != stalled-1 {
		t.Errorf("%d retry notes, want one per retry (%d)", n, stalled-1)
	}
}

// TestRunnerDeployReportsImageRetries: without a wave, a controller that
// stalls every whole-image GET gets a progress report per retry naming
// the image download, the cause and the retry, and the done failure names
// the attempts and the stall. A plan without SilentAfter (an older
// controller, which refuses unknown fields) gets no Retry field.
func TestRunnerDeployReportsImageRetries(t *testing.T) {
	plan := v1.Plan{ProgressEvery: 100 * time.Millisecond, SilentAfter: time.Hour}
	ctl, res, stalled, err := stallingDeploy(t, plan, false, 2)
	if err == nil || res.OK || stalled != 2 {
		t.Fatalf("Deploy() = %+v, %v after %d requests; want failure after 2", res, err, stalled)
	}
	want := []string{"image download: controller request stalled for " + testStall.String() + ", retry 1 of 1 in 250ms"}
	if got := retryNotes(ctl.Progress()); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("retry notes = %q, want %q", got, want)
	}
	done := ctl.Done()
	if len(done) != 1 || !strings.Contains(done[0].Reason, "image download: gave up after 2 attempts") || !strings.Contains(done[0].Reason, errStalled.Error()) {
		t.Errorf("done = %+v, want the failure naming 2 attempts and the stall", done)
	}

	plan.SilentAfter = 0
	ctl, _, _, _ = stallingDeploy(t, plan, false, 2)
	if got := retryNotes(ctl.Progress()); len(got) != 0 {
		t.Errorf("plan without SilentAfter: retry notes %q sent", got)
	}
	if len(ctl.Progress()) == 0 {
		t.Error("plan without SilentAfter: no progress report (the half image read should be reported)")
	}
}
