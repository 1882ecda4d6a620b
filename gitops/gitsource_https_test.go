package gitops

import (
	"bytes"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// startHTTPSGit serves the bare repos under root with the real
// git-http-backend (smart HTTP) behind TLS and basic auth with token.
func startHTTPSGit(t *testing.T, root, token string) (url string, caFile string) {
	t.Helper()
	backend, err := exec.LookPath("git-http-backend")
	if err != nil {
		out, err2 := exec.Command("git", "--exec-path").Output()
		if err2 != nil {
			t.Fatalf("git --exec-path: %v", err2)
		}
		backend = filepath.Join(strings.TrimSpace(string(out)), "git-http-backend")
	}
	h := &cgi.Handler{Path: backend, Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1", "REMOTE_USER=machina"}}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pass, ok := r.BasicAuth(); !ok || pass != token {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "unauthorised", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	// The no-CA case makes the client abort handshakes on purpose.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(caFile, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	return srv.URL, caFile
}

// syncBuffer is a log sink safe for concurrent writes.
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

func TestSourceHTTPSToken(t *testing.T) {
	r := newTestRepo(t)
	const token = "tok-9f8e7d6c5b4a-SECRET"
	base, caFile := startHTTPSGit(t, filepath.Dir(r.bare), token)
	dir := t.TempDir()
	tokFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	url := base + "/" + filepath.Base(r.bare)

	// Token from a file.
	s, err := NewSource(SourceConfig{Remote: Remote{URL: url, TokenFile: tokFile, CAFile: caFile}, StateDir: t.TempDir(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Poll(t.Context()); err != nil {
		t.Fatalf("Poll over https = %v", err)
	}
	if good, _ := s.Latest(); good.Inventory == nil || len(good.Inventory.Servers) != 12 {
		t.Fatalf("Latest over https = %+v", good)
	}

	// Token from the environment; the status writer pushes over https too.
	t.Setenv("MACHINA_TEST_GIT_TOKEN", token)
	w, err := NewStatusWriter(StatusConfig{Remote: Remote{URL: url, TokenEnv: "MACHINA_TEST_GIT_TOKEN", CAFile: caFile}, StateDir: t.TempDir(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	res, err := w.Write(t.Context(), sampleSnapshot())
	if err != nil || res.Commit == "" {
		t.Fatalf("Write over https = %+v, %v", res, err)
	}
	if got := r.remoteHead("main").String(); got != res.Commit {
		t.Errorf("remote main = %s, want status commit %s", got, res.Commit)
	}

	// A wrong token is refused, and never logged.
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("wrong-"+token), 0o600); err != nil {
		t.Fatal(err)
	}
	s2, err := NewSource(SourceConfig{Remote: Remote{URL: url, TokenFile: bad, CAFile: caFile}, StateDir: t.TempDir(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Poll(t.Context()); err == nil {
		t.Error("Poll with a wrong token succeeded")
	} else if strings.Contains(err.Error(), token) {
		t.Errorf("error leaks the token: %v", err)
	}
	// Without the CA the server is not trusted.
	s3, err := NewSource(SourceConfig{Remote: Remote{URL: url, TokenFile: tokFile}, StateDir: t.TempDir(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := s3.Poll(t.Context()); err == nil {
		t.Error("Poll without the CA succeeded")
	}
	if strings.Contains(logs.String(), token) {
		t.Error("logs contain the token")
	}
	if _, err := NewSource(SourceConfig{Remote: Remote{URL: "https://x:" + token + "@h/r.git"}, StateDir: t.TempDir()}); !errors.Is(err, ErrRemoteConfig) || strings.Contains(err.Error(), token) {
		t.Errorf("token in URL: %v, want ErrRemoteConfig without the token", err)
	}
}
