package controller

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/state"
)

// syncBuffer is a bytes.Buffer safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestUILogsLogins checks that the web console mounted by the controller
// logs through the controller's logger (component=ui): a cross-origin
// login and a wrong token are refused with a Warn line, a good login gets
// an Info line naming the token's name, and no token value is ever logged.
func TestUILogsLogins(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{MasterKey: []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	srv, err := api.New(api.Config{Store: st, Heartbeat: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var buf syncBuffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if _, err := mountConsoleAndUI(srv, st, nil, nil, nil, nil, t.TempDir(), nil, log); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	tok, _, err := st.CreateAdminToken("ops-ui", state.ActorLocal)
	if err != nil {
		t.Fatal(err)
	}
	const wrong = "mt_wrong-token-value-0123456789"
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	login := func(token, origin string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, hs.URL+"/ui/login", strings.NewReader(url.Values{"token": {token}}.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", origin)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		name, token, origin string
		code                int
		line                string
	}{
		{"cross-origin", tok, "http://evil.example", http.StatusForbidden, `level=WARN msg="ui login refused" component=ui reason=cross-origin`},
		{"wrong token", wrong, hs.URL, http.StatusUnauthorized, `level=WARN msg="ui login refused" component=ui reason="unknown token"`},
		{"good token", tok, hs.URL, http.StatusSeeOther, `level=INFO msg="ui login" component=ui actor=ops-ui`},
	} {
		if code := login(tc.token, tc.origin); code != tc.code {
			t.Errorf("%s: login = %d, want %d", tc.name, code, tc.code)
		}
		if !strings.Contains(buf.String(), tc.line) {
			t.Errorf("%s: no %q in the controller's log:\n%s", tc.name, tc.line, buf.String())
		}
	}
	for _, secret := range []string{tok, wrong} {
		if strings.Contains(buf.String(), secret) {
			t.Errorf("a token value is in the log:\n%s", buf.String())
		}
	}
}
