package node

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
)

// connKey is the context key under which the test server keeps each
// connection's request counter.
type connKey struct{}

// TestHeartbeatRetriedWhenServerClosesKeptConnection: a server closes a
// kept-alive connection when the next request arrives on it, without an
// answer (an idle timeout crossing the request, a restart). The heartbeat
// is sent again on a new connection and succeeds; the other reports (a
// step), which are not marked idempotent, are not resent. Without the
// Idempotency-Key marking the second heartbeat fails with EOF.
func TestHeartbeatRetriedWhenServerClosesKeptConnection(t *testing.T) {
	var beats, dropped atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := r.Context().Value(connKey{}).(*atomic.Int32)
		if n.Add(1) > 1 {
			// The second request on this connection: close it unanswered.
			dropped.Add(1)
			c, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Errorf("hijack: %v", err)
				return
			}
			_ = c.Close()
			return
		}
		if r.URL.Path == "/hosts/h1/heartbeat" {
			beats.Add(1)
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	srv.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connKey{}, new(atomic.Int32))
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}
	c := &Client{cfg: nodeConfig{URL: srv.URL, Host: "h1", HeartbeatSeconds: 1}, tc: tc,
		hc: &http.Client{Timeout: 10 * time.Second, Transport: transport(tc, netip.Addr{})}, started: time.Now()}
	t.Cleanup(c.CloseIdleConnections)
	for i := range 3 {
		if err := c.Beat(t.Context()); err != nil {
			t.Fatalf("heartbeat %d: %v", i+1, err)
		}
	}
	if got := beats.Load(); got != 3 {
		t.Errorf("server recorded %d heartbeats, want 3", got)
	}
	if dropped.Load() == 0 {
		t.Fatal("the server never closed a kept connection: the test did not exercise the retry")
	}
	// A step report on the kept connection, which the server closes, is
	// not resent by the transport: it fails, and the caller decides.
	if err := postReq(t.Context(), c.hc, c.path("steps"), map[string]string{"step": "x"}, nil, false); err == nil {
		t.Error("a non-idempotent report on a closed kept connection succeeded: it was resent")
	}
}
