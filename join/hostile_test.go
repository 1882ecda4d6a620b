package join_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/join/node"
	"github.com/machina-metal/machina/state"
)

// syncBuf is a bytes.Buffer safe for the listener's goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// joinHost joins host name for server (created here) and returns the
// node's state directory.
func joinHost(t *testing.T, f *fixture, name, server string) string {
	t.Helper()
	if _, err := f.store.CreateServer(state.Server{Name: server}); err != nil {
		t.Fatal(err)
	}
	tok := f.token(t, v1.EnrolmentRequest{Site: "lab1", Server: server})
	dir := t.TempDir()
	if _, err := node.Join(t.Context(), node.JoinConfig{URL: tok.JoinURL, Fingerprint: tok.CAFingerprint, Token: tok.Token, Dir: dir, Facts: facts(name)}); err != nil {
		t.Fatalf("Join: %v", err)
	}
	return dir
}

// nodeHTTP is an HTTP client presenting the node certificate in dir, for
// heartbeats whose body the test writes.
func nodeHTTP(t *testing.T, dir string) *http.Client {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, node.CertFile), filepath.Join(dir, node.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, node.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	tr := &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, Certificates: []tls.Certificate{pair}}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Timeout: 30 * time.Second, Transport: tr}
}

// TestHeartbeatFloodLimitedPerHost: a joined host that heartbeats far
// faster than the per-host rate, reporting a reboot each time (its uptime
// going backwards), is answered 429 with Retry-After past its burst and
// counted; what it reports beyond the burst is not recorded, its events
// are a handful (one reboot event and one summary; one refusal event and
// one summary), and its liveness is still recorded once the heartbeat
// interval has passed, so the flood neither writes per request nor gets
// the host marked lost.
func TestHeartbeatFloodLimitedPerHost(t *testing.T) {
	f := startListenerWith(t, func(c *join.Config) { c.HeartbeatRate = 0.01 }) // burst 5; 0.11 tokens in 11s
	dir := joinHost(t, f, "hv1", "r1-n01")
	hc := nodeHTTP(t, dir)
	before, err := f.store.LastEventSeq()
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	codes := map[int]int{}
	for i := range n {
		if i == n/2 {
			f.clock.Add(11 * time.Second) // past the 10s heartbeat interval
		}
		body := fmt.Sprintf(`{"uptimeSeconds":%d,"agentUptimeSeconds":%d}`, 10_000-i, 10_000-i)
		resp, err := hc.Post(f.url+"/hosts/hv1/heartbeat", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		codes[resp.StatusCode]++
		if resp.StatusCode == http.StatusTooManyRequests {
			if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 {
				t.Fatalf("429 Retry-After = %q, want whole seconds ≥ 1", resp.Header.Get("Retry-After"))
			}
		}
	}
	if codes[http.StatusNoContent] != 5 || codes[http.StatusTooManyRequests] != n-5 {
		t.Fatalf("answers %v, want 5 × 204 (the burst) and %d × 429", codes, n-5)
	}
	if got := f.srv.HeartbeatsLimited(); got != n-5 {
		t.Errorf("HeartbeatsLimited = %d, want %d", got, n-5)
	}
	h, err := f.store.Host("hv1")
	if err != nil {
		t.Fatal(err)
	}
	if !h.LastSeen.Equal(f.clock.Now()) {
		t.Errorf("LastSeen %s, want %s: a limited host's liveness is recorded once per interval", h.LastSeen, f.clock.Now())
	}
	if h.Uptime != 9_996*time.Second {
		t.Errorf("recorded uptime %s, want the last accepted heartbeat's 9996s (nothing of a limited one)", h.Uptime)
	}
	if err := f.store.FlushAnomalies(); err != nil {
		t.Fatal(err)
	}
	if err := f.store.FlushRefusals(); err != nil {
		t.Fatal(err)
	}
	evs, err := f.store.Events(state.EventQuery{After: before, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[state.EventKind]int{}
	for _, e := range evs {
		kinds[e.Kind]++
	}
	if len(evs) != 4 || kinds[state.EventHostRebooted] != 2 || kinds[state.EventHostHeartbeatLimited] != 2 {
		t.Errorf("events of the flood %v (%d), want host.rebooted ×2 (one, one summary) and host.heartbeat_limited ×2", kinds, len(evs))
	}
	if got := f.store.RefusalCounts()[state.RefusalRateLimited]; got != n-5 {
		t.Errorf("RefusalCounts[rate_limited] = %d, want %d", got, n-5)
	}
}

// TestFencedHostHeartbeatIsFenceFailure: a host fenced (its power read
// back off) that heartbeats all the same is not recorded as returned: it
// stays fenced and lost, gets the FenceFailed condition with the
// heartbeats counted, one host.fence_failed event, one Error log line,
// and the listener counts the heartbeats; the API view says offline. An
// unfence clears the condition, and the host's next heartbeat is then a
// return.
//
// Before, the heartbeat cleared the loss with host.returned and the view
// said online, with nothing saying the fence did not hold.
func TestFencedHostHeartbeatIsFenceFailure(t *testing.T) {
	logs := &syncBuf{}
	f := startListenerWith(t, func(c *join.Config) {
		c.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(logs, t.Output()), nil))
	})
	dir := joinHost(t, f, "hv1", "r1-n01")
	c, err := node.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Beat(t.Context()); err != nil {
		t.Fatal(err)
	}
	f.clock.Add(31 * time.Second)
	if _, err := f.store.MarkHostLost("hv1", f.clock.Now().Add(-30*time.Second), f.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.FenceServer("r1-n01", state.Fencing{Actor: "ops", Reason: "lost", Host: "hv1", Device: "fence ipmi 10.0.0.9"}); err != nil {
		t.Fatal(err)
	}
	before, _ := f.store.LastEventSeq()
	for range 3 {
		f.clock.Add(time.Second)
		if err := c.Beat(t.Context()); err != nil {
			t.Fatalf("heartbeat of a fenced host: %v", err)
		}
	}
	h, err := f.store.Host("hv1")
	if err != nil {
		t.Fatal(err)
	}
	if h.Fenced == nil || h.Lost == nil || h.FenceNotHeld == nil || h.FenceNotHeld.Heartbeats != 3 {
		t.Fatalf("fenced host after 3 heartbeats = fenced %+v lost %+v notHeld %+v; want fenced, lost, 3 heartbeats counted", h.Fenced, h.Lost, h.FenceNotHeld)
	}
	if srv, _ := f.store.Server("r1-n01"); srv.Fenced == nil {
		t.Error("server r1-n01 unfenced by heartbeats")
	}
	evs, _ := f.store.Events(state.EventQuery{After: before})
	failed := 0
	for _, e := range evs {
		switch e.Kind {
		case state.EventHostReturned:
			t.Errorf("fenced host recorded as returned: %+v", e)
		case state.EventHostFenceFailed:
			failed++
			if !strings.Contains(e.Message, "fence did not hold") {
				t.Errorf("fence_failed message %q does not say the fence did not hold", e.Message)
			}
		}
	}
	if failed != 1 {
		t.Errorf("%d host.fence_failed events, want 1", failed)
	}
	views := f.srv.HostViews(mustHosts(t, f.store))
	if len(views) != 1 || views[0].Online || views[0].Fenced == nil || views[0].Fenced.NotHeld == nil || views[0].Fenced.NotHeld.Heartbeats != 3 {
		t.Fatalf("host view = %+v, want offline, fenced, the fence not held (3 heartbeats)", views)
	}
	cond := false
	for _, c := range views[0].Conditions {
		cond = cond || (c.Type == join.ConditionFenceFailed && c.Reason == "HeartbeatWhileFenced")
	}
	if !cond {
		t.Errorf("conditions %+v lack FenceFailed/HeartbeatWhileFenced", views[0].Conditions)
	}
	if got := f.srv.FencedHeartbeats(); got != 3 {
		t.Errorf("FencedHeartbeats = %d, want 3", got)
	}
	// The first heartbeat since the fence may have been in flight
	// (state.Host.FencedBeat): the condition counts it, the anomaly
	// counter only the two that prove the fence did not hold.
	if n := f.store.AnomalyCounts()[state.EventHostFenceFailed]; n != 2 {
		t.Errorf("AnomalyCounts[host.fence_failed] = %d, want 2", n)
	}
	if n := strings.Count(logs.String(), "level=ERROR msg=\"fenced host heartbeats: the fence did not hold\""); n != 1 {
		t.Errorf("%d Error lines for the fence that did not hold, want 1:\n%s", n, logs.String())
	}

	if _, err := f.store.UnfenceServer("r1-n01", "ops", "power checked by hand"); err != nil {
		t.Fatal(err)
	}
	if h, _ := f.store.Host("hv1"); h.FenceNotHeld != nil {
		t.Errorf("FenceNotHeld after unfence = %+v, want cleared", h.FenceNotHeld)
	}
	f.clock.Add(time.Second)
	if err := c.Beat(t.Context()); err != nil {
		t.Fatal(err)
	}
	if h, _ := f.store.Host("hv1"); h.Lost != nil || h.FenceNotHeld != nil {
		t.Errorf("after unfence a heartbeat returns the host: lost %+v notHeld %+v", h.Lost, h.FenceNotHeld)
	}
}

// TestHeartbeatUnderAnotherHostsName: a joined host's valid certificate
// does not speak for another host: its heartbeats, steps and done under
// the other's name are answered 403 and the other host's liveness and
// join status are untouched, however many it sends (a compromised
// hypervisor cannot keep a lost neighbour "heard" or mark it joined).
func TestHeartbeatUnderAnotherHostsName(t *testing.T) {
	f := startListener(t, "")
	dir1 := joinHost(t, f, "hv1", "r1-n01")
	joinHost(t, f, "hv2", "r1-n02")
	hc := nodeHTTP(t, dir1)
	was, err := f.store.Host("hv2")
	if err != nil {
		t.Fatal(err)
	}
	f.clock.Add(time.Hour)
	for _, tc := range []struct{ path, body string }{
		{"/hosts/hv2/heartbeat", `{"uptimeSeconds":5}`},
		{"/hosts/hv2/steps", `{"step":"x","ok":true}`},
		{"/hosts/hv2/done", `{"ok":false,"reason":"forged"}`},
	} {
		for range 20 {
			resp, err := hc.Post(f.url+tc.path, "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden {
				t.Fatalf("POST %s with hv1's certificate = %d, want 403", tc.path, resp.StatusCode)
			}
		}
	}
	now, err := f.store.Host("hv2")
	if err != nil {
		t.Fatal(err)
	}
	if !now.LastSeen.Equal(was.LastSeen) || now.JoinStatus != was.JoinStatus || now.Uptime != was.Uptime {
		t.Errorf("hv2 after hv1's forged posts: LastSeen %s status %q uptime %s, want %s %q %s unchanged",
			now.LastSeen, now.JoinStatus, now.Uptime, was.LastSeen, was.JoinStatus, was.Uptime)
	}
}
