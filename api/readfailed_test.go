package api

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/machina-metal/machina/state"
)

// TestReadFailedIsRetryable: a failed read of the state store (here etcd's
// "etcd read: context deadline exceeded" and an error the store does not
// classify) answers 503 with Retry-After, which the agent retries; only a
// missing record (ErrNotFound) or no error lets the handler go on to its
// definitive answer (409 "server is not deploying"). Before, the plan,
// wipe and installer routes answered every read failure 409 and the agent
// stopped: lab/sim TestHATwoControllersFailover left a server deploying
// with its machine off after the deposed leader's etcd read timed out.
func TestReadFailedIsRetryable(t *testing.T) {
	m := &Machine{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{fmt.Errorf("state: server r1-n01: %w", state.ErrNotFound), false},
		{fmt.Errorf("state: server r1-n01: etcd read: %w", context.DeadlineExceeded), true},
		{fmt.Errorf("state: server r1-n01: etcd read: rpc error: code = Unavailable"), true},
	} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "/v1/agent/plan", nil)
		if got := m.readFailed(w, r, tc.err); got != tc.want {
			t.Errorf("readFailed(%v) = %v, want %v", tc.err, got, tc.want)
			continue
		}
		if tc.want && (w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "") {
			t.Errorf("readFailed(%v) answered %d Retry-After %q, want 503 with Retry-After", tc.err, w.Code, w.Header().Get("Retry-After"))
		}
	}
}
