package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/ramdisk/agent/agenttest"
)

// testStall is the stall timeout of these tests: short, but long enough
// that a loaded machine's healthy loopback response does not trip it
// (and if it did, the request would only be asked again).
const testStall = 500 * time.Millisecond

// testBound bounds a test that would hang without the stall timeout: it
// ends the fetch long after any stall was detected, so a test that reaches
// it failed, not a slow machine.
const testBound = 45 * time.Second

// stallMidBody answers status with the headers of body and its first half,
// then sends nothing more and keeps the connection open until the client
// gives up or the test ends: a server, proxy or dropped link that stopped
// delivering without closing.
func stallMidBody(w http.ResponseWriter, r *http.Request, status int, body []byte, release <-chan struct{}) {
	w.Header().Set("Content-Length", fmt.Sprint(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body[:len(body)/2])
	w.(http.Flusher).Flush()
	select {
	case <-r.Context().Done():
	case <-release:
	}
}

// stallingServer serves handler on loopback; the handlers that stall are
// released when the test ends, before the server closes.
func stallingServer(t *testing.T, h func(w http.ResponseWriter, r *http.Request, release <-chan struct{})) *httptest.Server {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h(w, r, release) }))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	return srv
}

// pieceRange is the Range header of piece i of m.
func pieceRange(m v1.PieceManifest, i int) string {
	off := int64(i) * m.PieceBytes
	return fmt.Sprintf("bytes=%d-%d", off, min(off+m.PieceBytes, m.SizeBytes)-1)
}

// logBuffer collects the log lines of a test (and shows them in its output).
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
	t  *testing.T
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.Write(p)
	return l.t.Output().Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newLogBuffer(t *testing.T) (*logBuffer, *slog.Logger) {
	l := &logBuffer{t: t}
	return l, slog.New(slog.NewTextHandler(l, nil))
}

// writeWithin is member.writeTo bounded by testBound.
func writeWithin(t *testing.T, mb *member, m v1.PieceManifest) (WriteResult, []byte, error) {
	ctx, cancel := context.WithTimeout(t.Context(), testBound)
	defer cancel()
	return writeImageFile(ctx, t, m, mb.f.Open, 0)
}

// TestPieceControllerStallOnceThenAnswers: the controller sends half of
// piece 1 and then nothing, once. The fetcher aborts that request after
// StallTimeout with no bytes, logs it (piece, URL without its query, the
// attempt, never the token), asks again, and the deploy's write completes
// with the verified image. Without the stall timeout the fetch hangs on
// the first request (until testBound here).
func TestPieceControllerStallOnceThenAnswers(t *testing.T) {
	img, m := pieceImage(t, 3*v1.PieceBytes)
	var stalled, asked atomic.Int64
	origin := stallingServer(t, func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
		if r.Header.Get("Authorization") != "Bearer img-secret" {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		asked.Add(1)
		if r.Header.Get("Range") == pieceRange(m, 1) && stalled.Add(1) == 1 {
			w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", v1.PieceBytes, 2*v1.PieceBytes-1, len(img)))
			stallMidBody(w, r, http.StatusPartialContent, img[v1.PieceBytes:2*v1.PieceBytes], release)
			return
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(img))
	})
	logs, logger := newLogBuffer(t)
	mb := newMember(t, m, origin.URL+"/images/a?sig=query-secret", "img-secret", "wave-tok")
	mb.f.StallTimeout, mb.f.Logger = testStall, logger
	res, got, err := writeWithin(t, mb, m)
	if err != nil || res.ReadBackSHA256 != m.SHA256 || !bytes.Equal(got, img) {
		t.Fatalf("WriteImage() = %+v, %v; disk matches image: %v", res, err, bytes.Equal(got, img))
	}
	if stalled.Load() < 2 {
		t.Errorf("piece 1 asked %d times, want the stalled request and another", stalled.Load())
	}
	line := ""
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, "image piece request failed; asking again") && strings.Contains(l, "piece=1 ") {
			line = l
		}
	}
	if line == "" || !strings.Contains(line, errStalled.Error()) || !strings.Contains(line, "attempt=1 ") || !strings.Contains(line, origin.URL+"/images/a") {
		t.Errorf("no log line of piece 1's stalled attempt naming the URL and attempt; logs:\n%s", logs)
	}
	if s := logs.String(); strings.Contains(s, "img-secret") || strings.Contains(s, "query-secret") {
		t.Errorf("a token reached the log:\n%s", s)
	}
	if st := mb.f.Stats(); st.ControllerBytes != int64(len(img)) {
		t.Errorf("stats = %+v, want the whole image from the controller once", st)
	}
}

// TestPieceControllerAlwaysStallsFails: a controller that stalls every
// request for piece 0 fails the fetch after Attempts requests, each
// aborted after StallTimeout, with an error naming the piece, the URL
// without its query, the attempts and the stall, never the token; the
// error is final for the deploy (not retried as a whole again), so the
// agent reports the failure in done. Without the stall timeout the fetch
// hangs (until testBound here).
func TestPieceControllerAlwaysStallsFails(t *testing.T) {
	img, m := pieceImage(t, 2*v1.PieceBytes)
	var asked atomic.Int64
	origin := stallingServer(t, func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
		asked.Add(1)
		stallMidBody(w, r, http.StatusPartialContent, img[:v1.PieceBytes], release)
	})
	logs, logger := newLogBuffer(t)
	mb := newMember(t, m, origin.URL+"/images/a?sig=query-secret", "img-secret", "wave-tok")
	mb.f.StallTimeout, mb.f.Attempts, mb.f.Logger = testStall, 3, logger
	_, _, err := writeWithin(t, mb, m)
	var pf *pieceFailure
	if !errors.As(err, &pf) || !errors.Is(err, errStalled) {
		t.Fatalf("WriteImage() = %v, want the piece fetch given up on a stall", err)
	}
	msg := err.Error()
	for _, want := range []string{"get piece 0 from " + origin.URL + "/images/a:", "gave up after 3 attempts", errStalled.Error() + " for " + testStall.String()} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not name %q", msg, want)
		}
	}
	if strings.Contains(msg, "secret") || strings.Contains(logs.String(), "secret") {
		t.Errorf("a token reached the error or the log: %q", msg)
	}
	if transientFetch(err) {
		t.Error("transientFetch() = true: the deploy would fetch the image again after the piece's own retries")
	}
	if asked.Load() != 3 {
		t.Errorf("controller asked %d times, want 3 (Attempts)", asked.Load())
	}
	if n := strings.Count(logs.String(), "image piece request failed; asking again"); n != 2 {
		t.Errorf("%d retry log lines, want 2; logs:\n%s", n, logs)
	}
}

// TestPeerStallsMidBodySkipped: a wave peer answers 200 with half of a
// piece and then nothing. The fetcher gives it up after StallTimeout (not
// PeerTimeout, left at 30 s), does not ask it for any later piece, gets
// every piece from the controller, and the write completes. Without the
// skip every piece waited PeerTimeout on the stalled peer (asked 3 times,
// and past testBound here).
func TestPeerStallsMidBodySkipped(t *testing.T) {
	img, m := pieceImage(t, 3*v1.PieceBytes)
	origin := newImageOrigin(t, img, "img-tok")
	var asked atomic.Int64
	peer := stallingServer(t, func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
		asked.Add(1)
		stallMidBody(w, r, http.StatusOK, img[:v1.PieceBytes], release)
	})
	logs, logger := newLogBuffer(t)
	mb := newMember(t, m, origin.URL, "img-tok", "wave-tok")
	mb.f.Peers, mb.f.StallTimeout, mb.f.Logger = []string{peer.URL}, testStall, logger
	res, got, err := writeWithin(t, mb, m)
	if err != nil || res.ReadBackSHA256 != m.SHA256 || !bytes.Equal(got, img) {
		t.Fatalf("WriteImage() = %+v, %v; disk matches image: %v", res, err, bytes.Equal(got, img))
	}
	if asked.Load() != 1 {
		t.Errorf("stalled peer asked %d times, want 1 (then skipped)", asked.Load())
	}
	if st := mb.f.Stats(); st.PeerBytes != 0 || st.ControllerBytes != int64(len(img)) || len(st.BadPeers) != 0 {
		t.Errorf("stats = %+v, want every piece from the controller and no bad peer", st)
	}
	if !strings.Contains(logs.String(), "wave peer stalled; not asked again this deploy") {
		t.Errorf("no log line for the stalled peer; logs:\n%s", logs)
	}
}

// TestImageStreamStallRetried: the whole-image download (no wave) from a
// controller that sends half the image and then nothing fails the attempt
// after StallTimeout with errStalled, which the deploy's retry takes as
// transient; the next attempt writes the image. Without the stall timeout
// the first attempt hangs (until testBound here).
func TestImageStreamStallRetried(t *testing.T) {
	img, m := pieceImage(t, 3*v1.PieceBytes)
	var asked atomic.Int64
	origin := stallingServer(t, func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
		if asked.Add(1) == 1 {
			stallMidBody(w, r, http.StatusOK, img, release)
			return
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(img))
	})
	r := &Runner{Client: &v1.AgentClient{BaseURL: origin.URL}, StallTimeout: testStall}
	open := r.openImage(v1.Plan{ImageURL: origin.URL + "/images/a", ImageToken: "img-tok"})
	ctx, cancel := context.WithTimeout(t.Context(), testBound)
	defer cancel()
	_, _, err := writeImageFile(ctx, t, m, open, 0)
	if !errors.Is(err, errStalled) || !transientFetch(err) {
		t.Fatalf("first attempt: %v, want a transient errStalled", err)
	}
	res, got, err := writeImageFile(ctx, t, m, open, 0)
	if err != nil || res.ReadBackSHA256 != m.SHA256 || !bytes.Equal(got, img) {
		t.Fatalf("second attempt: %+v, %v", res, err)
	}
}

// TestStallReaderCountsOnlyReads: time between Reads of the body (the
// write busy with what it read) is not a stall: the timer is stopped; a
// Read that gets no bytes for the timeout is.
func TestStallReaderCountsOnlyReads(t *testing.T) {
	pr, pw := io.Pipe()
	// The pipe ends with its context, as an HTTP response body does.
	ctx, cancel := context.WithTimeout(t.Context(), testBound)
	defer cancel()
	rc, err := openStalling(ctx, testStall, func(ctx context.Context) (io.ReadCloser, error) {
		context.AfterFunc(ctx, func() { pw.CloseWithError(context.Cause(ctx)) })
		return pr, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	go func() {
		_, _ = pw.Write([]byte("a"))
	}()
	b := make([]byte, 1)
	if _, err := io.ReadFull(rc, b); err != nil {
		t.Fatal(err)
	}
	// The reader is idle between Reads: the timer is stopped, so the
	// context is still live however long this takes.
	sr := rc.(*stallReader)
	if sr.t.Stop() {
		t.Error("stall timer armed between Reads")
	}
	// A Read that gets nothing is a stall.
	if _, err := rc.Read(b); !errors.Is(err, errStalled) {
		t.Errorf("Read with no bytes coming = %v, want errStalled", err)
	}
}

// TestPieceControllerRefusalIsFinal: a controller that refuses the image
// token (403) is asked once: the fetch fails at once naming the piece and
// one attempt, and is final for the deploy.
func TestPieceControllerRefusalIsFinal(t *testing.T) {
	img, m := pieceImage(t, v1.PieceBytes)
	origin := newImageOrigin(t, img, "other-token")
	var asked atomic.Int64
	mb := newMember(t, m, origin.URL, "img-tok", "wave-tok")
	mb.f.HTTP = &http.Client{Transport: countTransport{&asked}}
	_, _, err := writeWithin(t, mb, m)
	var pf *pieceFailure
	if !errors.As(err, &pf) || !errors.Is(err, v1.ErrAgentTokenRefused) || !strings.Contains(err.Error(), "get piece 0 from "+origin.URL+": gave up after 1 attempt:") {
		t.Fatalf("WriteImage() = %v, want the refusal after one attempt", err)
	}
	if transientFetch(err) || asked.Load() != 1 {
		t.Errorf("transient %v, asked %d times; want final after 1", transientFetch(err), asked.Load())
	}
}

// countTransport counts the requests it passes to http.DefaultTransport.
type countTransport struct{ n *atomic.Int64 }

func (c countTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return http.DefaultTransport.RoundTrip(r)
}

// TestRunnerDeployReportsStalledPiece: a deploy sharing pieces with its
// wave, whose controller stalls every Range request of the image, ends
// (within ImageAttempts requests, each cut after StallTimeout) with a
// failed done report whose reason names the piece, the image URL, the
// attempts and the stall, and no token; the disk is untouched. Without
// the stall timeout the deploy hangs (until testBound here).
func TestRunnerDeployReportsStalledPiece(t *testing.T) {
	root, dev := qemuMachine(t)
	img, m := pieceImage(t, v1.PieceBytes+4096)
	ctl := agenttest.NewController(agenttest.ControllerConfig{DeployToken: "tok-deploy", Image: img,
		Plan: v1.Plan{Seed: testSeed, RootDevice: v1.RootDeviceHint{Serial: "machina-vm0"}, Pieces: &m,
			Wave: &v1.Wave{ID: "w1", Token: "wave-secret"}}})
	var ranges atomic.Int64
	srv := stallingServer(t, func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
		if r.Header.Get("Range") != "" {
			ranges.Add(1)
			stallMidBody(w, r, http.StatusPartialContent, img[:v1.PieceBytes], release)
			return
		}
		ctl.ServeHTTP(w, r)
	})
	ctl.SetBaseURL(srv.URL)
	before := fileSum(t, filepath.Join(dev, "vda"))
	logs, logger := newLogBuffer(t)
	r := &Runner{Client: &v1.AgentClient{BaseURL: srv.URL}, Token: "tok-deploy", Root: root, DevDir: dev,
		MemoryLimit: 64 << 20, Pieces: &PeerServer{}, StallTimeout: testStall, ImageAttempts: 2, Logger: logger}
	ctx, cancel := context.WithTimeout(t.Context(), testBound)
	defer cancel()
	res, err := r.Deploy(ctx)
	var pf *pieceFailure
	if !errors.As(err, &pf) || res.OK {
		t.Fatalf("Deploy() = %+v, %v; want the piece given up", res, err)
	}
	done := ctl.Done()
	if len(done) != 1 || done[0].OK {
		t.Fatalf("done = %+v, want one failure", done)
	}
	want := "get piece 0 from " + srv.URL + "/images/os.img: gave up after 2 attempts: get piece: " + errStalled.Error()
	if !strings.Contains(done[0].Reason, want) {
		t.Errorf("done reason %q, want it to name %q", done[0].Reason, want)
	}
	if ranges.Load() != 2 {
		t.Errorf("%d piece requests, want 2 (ImageAttempts; not fetched again as a whole)", ranges.Load())
	}
	if strings.Contains(done[0].Reason+logs.String(), "wave-secret") || strings.Contains(done[0].Reason+logs.String(), "tok-deploy") {
		t.Error("a token reached the done reason or the log")
	}
	if after := fileSum(t, filepath.Join(dev, "vda")); before != after {
		t.Error("disk changed")
	}
}
