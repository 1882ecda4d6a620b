package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestServeRunsAPIAndStops: serve opens the store, warns that secrets are
// unsealed, answers the admin API on a loopback port, and returns nil when
// ctx is done.
func TestServeRunsAPIAndStops(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	st, err := state.Open(path, state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tok, _, err := st.CreateAdminToken("ops", state.ActorLocal)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateServer(state.Server{Name: "r1-n01"}); err != nil {
		t.Fatal(err)
	}
	st.Close()

	logs := &lockedBuffer{}
	ready := make(chan net.Addr, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cfg := ServeConfig{StatePath: path, Listen: "127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(logs, nil)),
		OnReady: func(a net.Addr) { ready <- a },
		Setup: func(st *state.Store, srv *api.Server) error {
			return srv.HandleAdmin("GET /api/v1/whoami", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, api.Actor(r))
			}))
		}}
	go func() { done <- cfg.Run(ctx) }()
	var addr net.Addr
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("Run returned early: %v", err)
	}
	c, _ := v1.NewClient("http://"+addr.String(), tok)
	srv, err := c.Server(context.Background(), "r1-n01")
	if err != nil || srv.Lifecycle != "new" {
		t.Fatalf("Server = %+v, %v", srv, err)
	}
	req, _ := http.NewRequest("GET", "http://"+addr.String()+"/api/v1/whoami", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	who, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(who) != "ops" {
		t.Errorf("handler mounted in Setup answered %q", who)
	}
	// The one loopback listener has the machine and admin shares of the
	// descriptor budget (docs/operations.md, "Connection budgets").
	mresp, err := http.Get("http://" + addr.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	if !regexp.MustCompile(`(?m)^machina_listener_conns_budget\{listener="api"\} [1-9]`).Match(metrics) ||
		!regexp.MustCompile(`(?m)^machina_listener_conns_open\{listener="api"\} [1-9]`).Match(metrics) {
		t.Errorf("metrics: no budget and open connections for the api listener:\n%s", grepLines(string(metrics), "machina_listener_"))
	}
	// A second controller on the same file fails at once with a clear message.
	var errb bytes.Buffer
	if code := run(context.Background(), []string{"serve", "--state", path, "--listen", "127.0.0.1:0"}, nil, &errb, &errb); code == 0 ||
		!strings.Contains(errb.String(), "in use by another process") {
		t.Errorf("second serve: exit %d, %q", code, errb.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v, want nil after cancel", err)
	}
	if !strings.Contains(logs.String(), "secrets are stored unsealed") {
		t.Errorf("no unsealed warning in logs:\n%s", logs.String())
	}
}

func TestServeKeyChecks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	st, err := state.Open(path, state.Options{MasterKey: []byte("the-right-master-key")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutSecret("bmc", state.Credential{Username: "u", Password: "p"}, "t"); err != nil {
		t.Fatal(err)
	}
	st.Close()
	ctx := context.Background()
	err = ServeConfig{StatePath: path, Listen: "127.0.0.1:0", MasterKey: []byte("the-wrong-master-key")}.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "does not open this state file's secrets") {
		t.Errorf("wrong key: %v", err)
	}
	err = ServeConfig{StatePath: path, Listen: "127.0.0.1:0"}.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "sealed secrets but MACHINA_API_KEY_MASTER_KEY is not set") {
		t.Errorf("missing key: %v", err)
	}
	// The right key starts, logs sealing, and stops on a done ctx.
	logs := &lockedBuffer{}
	cctx, cancel := context.WithCancel(ctx)
	cfg := ServeConfig{StatePath: path, Listen: "127.0.0.1:0", MasterKey: []byte("the-right-master-key"),
		Logger: slog.New(slog.NewTextHandler(logs, nil)), OnReady: func(net.Addr) { cancel() }}
	if err := cfg.Run(cctx); err != nil {
		t.Errorf("right key: %v", err)
	}
	if !strings.Contains(logs.String(), "secrets are sealed") {
		t.Errorf("logs: %s", logs.String())
	}
}

// TestServeBrakeShareAndDeployTimeoutFlags: the safety brake's share and
// the deploy deadline are operator settings ("a configured share
// of the fleet (default 20%)"); values that would disable the brake or the
// deadline are refused before anything starts, naming the flag.
func TestServeBrakeShareAndDeployTimeoutFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--brake-share", "1.5"}, "--brake-share 1.5: want a share above 0 and at most 1"},
		{[]string{"--brake-share", "0"}, "--brake-share 0: want a share above 0 and at most 1"},
		{[]string{"--brake-share", "-0.1"}, "--brake-share -0.1: want a share above 0 and at most 1"},
		{[]string{"--brake-share", "NaN"}, "--brake-share NaN: want a share above 0 and at most 1"},
		{[]string{"--deploy-timeout", "0s"}, "--deploy-timeout 0s: want a positive duration"},
	} {
		var errb bytes.Buffer
		args := append([]string{"serve", "--state", path, "--listen", "127.0.0.1:0"}, c.args...)
		if code := run(context.Background(), args, nil, &errb, &errb); code == 0 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("serve %v: exit %d, %q; want an error with %q", c.args, code, errb.String(), c.want)
		}
	}
	if _, err := os.Stat(path); err == nil {
		t.Errorf("a refused flag still opened the state file")
	}
	var out bytes.Buffer
	if code := run(context.Background(), []string{"serve", "--help"}, nil, &out, &out); code != 0 ||
		!strings.Contains(out.String(), "--brake-share float") || !strings.Contains(out.String(), "(default 0.2)") ||
		!strings.Contains(out.String(), "--deploy-timeout duration") || !strings.Contains(out.String(), "(default 1h0m0s)") {
		t.Errorf("serve --help: exit %d\n%s", code, out.String())
	}
}

// TestUsageErrorsExit2: a command line cobra refuses exits 2 (as
// machinactl), with the reason on stderr; a command that fails running
// exits 1.
func TestUsageErrorsExit2(t *testing.T) {
	for _, args := range [][]string{{"serve", "--no-such-flag"}, {"nope"}, {"sim", "extra-arg"}, {"serve", "--bmc-watch-interval", "soon"}} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, strings.NewReader(""), &out, &errOut); code != 2 || errOut.Len() == 0 {
			t.Errorf("machina %q: exit %d, stderr %q; want 2 and a reason", args, code, errOut.String())
		}
	}
	// A state file in a folder that does not exist (a typo): the command
	// runs and fails naming the folder, and creates nothing, as root too
	// (it used to create the folders and a new state file holding a token).
	tmp := t.TempDir()
	missing := filepath.Join(tmp, "nonexistent", "dir")
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"token", "create", "--name", "ops", "--state", filepath.Join(missing, "state.db")}, strings.NewReader(""), &out, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), missing) || !strings.Contains(errOut.String(), "does not exist") {
		t.Errorf("machina token create --state in a missing folder: exit %d (%s), want 1 naming %s", code, errOut.String(), missing)
	}
	if _, err := os.Stat(filepath.Join(tmp, "nonexistent")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("machina token create created %s: %v", filepath.Join(tmp, "nonexistent"), err)
	}
	// list on an existing folder without a state file: refused, nothing created.
	errOut.Reset()
	code = run(context.Background(), []string{"token", "list", "--state", filepath.Join(tmp, "state.db")}, strings.NewReader(""), &out, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), "no state file at "+filepath.Join(tmp, "state.db")) {
		t.Errorf("machina token list --state of a missing file: exit %d (%s), want 1 and no state file at …", code, errOut.String())
	}
	if _, err := os.Stat(filepath.Join(tmp, "state.db")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("machina token list created a state file: %v", err)
	}
	if out.Len() != 0 {
		t.Errorf("stdout = %q, want no token printed", out.String())
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
