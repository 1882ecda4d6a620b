package ui_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/machina-metal/machina/ui/uitest"
)

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuf) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// TestCSPReportBounded: a bounded flood of 200 CSP reports from one
// address is answered 204 for its burst then 429 (counted), and the log
// gets one violation line, not 200. Before the fix every report was
// accepted and logged.
func TestCSPReportBounded(t *testing.T) {
	var logs lockedBuf
	l := newLab(t, uitest.Options{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	ok, limited := 0, 0
	for range 200 {
		resp, err := http.Post(l.Server.URL+"/ui/csp-report", "application/csp-report", strings.NewReader(`{"csp-report":{"violated-directive":"script-src","blocked-uri":"inline"}}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusNoContent:
			ok++
		case http.StatusTooManyRequests:
			limited++
		default:
			t.Fatalf("csp report: %d", resp.StatusCode)
		}
	}
	if ok > 25 || limited < 175 || l.UI.CSPRefused() != int64(limited) {
		t.Errorf("200 reports: %d accepted, %d refused (counted %d); want the burst of 20 accepted and the rest refused", ok, limited, l.UI.CSPRefused())
	}
	if n := strings.Count(logs.String(), "csp violation"); n != 1 {
		t.Errorf("%d csp log lines for 200 reports, want 1", n)
	}
}
