package gitops

import (
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh/knownhosts"
)

// Fault modes of faultProxy, fixed per connection at accept.
const (
	modePass      int32 = iota // forward both ways
	modeBlackhole              // accept, read, never answer (never dial the server)
	modeStall                  // forward the server's first threshold bytes, then nothing
	modeTrickle                // forward the server's first threshold bytes, then 8 bytes per 50 ms (160 B/s)
)

// faultProxy is a TCP proxy on loopback in front of a Git server, with the
// failures seen from real servers and middleboxes: a host that accepts and
// never answers (an overloaded sshd, a half-dead load balancer), one that
// answers then stalls mid-pack, and one that trickles. It records how many
// bytes each connection carried from the server.
type faultProxy struct {
	ln        net.Listener
	target    string
	mode      atomic.Int32
	threshold atomic.Int64
	// upRate, when > 0, limits what the client sends past its first 8 KiB
	// on a connection to upRate bytes per second (a slow uplink).
	upRate atomic.Int64
	done   chan struct{}
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns []net.Conn
	sizes []*atomic.Int64
}

func startFaultProxy(t *testing.T, target string) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{ln: ln, target: target, done: make(chan struct{})}
	t.Cleanup(func() {
		ln.Close()
		close(p.done)
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := new(atomic.Int64)
			p.mu.Lock()
			p.conns = append(p.conns, c)
			p.sizes = append(p.sizes, n)
			p.mu.Unlock()
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.serve(c, p.mode.Load(), p.threshold.Load(), n)
			}()
		}
	}()
	return p
}

func (p *faultProxy) addr() string { return p.ln.Addr().String() }

// serverBytes returns the bytes forwarded from the server on each
// connection accepted since the last call, and forgets them.
func (p *faultProxy) serverBytes() []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]int64, len(p.sizes))
	for i, n := range p.sizes {
		out[i] = n.Load()
	}
	p.sizes = nil
	return out
}

func (p *faultProxy) serve(c net.Conn, mode int32, threshold int64, n *atomic.Int64) {
	defer c.Close()
	if mode == modeBlackhole {
		io.Copy(io.Discard, c)
		return
	}
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer s.Close()
	closed := make(chan struct{})
	go func() {
		defer s.Close()
		defer close(closed)
		rate := p.upRate.Load()
		if rate <= 0 {
			io.Copy(s, c)
			return
		}
		io.CopyN(s, c, 8<<10)
		step := max(rate/20, 1)
		for {
			if _, err := io.CopyN(s, c, step); err != nil {
				return
			}
			tick := time.NewTimer(50 * time.Millisecond)
			select {
			case <-p.done:
				tick.Stop()
				return
			case <-tick.C:
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		k, err := s.Read(buf)
		chunk := buf[:k]
		for len(chunk) > 0 {
			sent := n.Load()
			if mode == modePass || sent < threshold {
				m := len(chunk)
				if mode != modePass {
					m = int(min(int64(m), threshold-sent))
				}
				if _, err := c.Write(chunk[:m]); err != nil {
					return
				}
				n.Add(int64(m))
				chunk = chunk[m:]
				continue
			}
			if mode == modeStall {
				select {
				case <-closed:
				case <-p.done:
				}
				return
			}
			tick := time.NewTimer(50 * time.Millisecond)
			select {
			case <-closed:
				tick.Stop()
				return
			case <-p.done:
				tick.Stop()
				return
			case <-tick.C:
			}
			m := min(8, len(chunk))
			if _, err := c.Write(chunk[:m]); err != nil {
				return
			}
			n.Add(int64(m))
			chunk = chunk[m:]
		}
		if err != nil {
			c.(*net.TCPConn).CloseWrite()
			<-closed
			return
		}
	}
}

// faultEnv is a real Git server (sshd-like SSH server running
// git-upload-pack/git-receive-pack, or git-http-backend behind TLS and
// basic auth) reached through a faultProxy.
type faultEnv struct {
	repo   *testRepo
	proxy  *faultProxy
	remote Remote
}

func newFaultEnv(t *testing.T, transport string) *faultEnv {
	t.Helper()
	r := newTestRepo(t)
	// A pack big enough that a stall can land in its middle:
	// incompressible bytes outside the inventory files.
	big := make([]byte, 256<<10)
	rand.Read(big)
	r.commit("add a large file", map[string]string{"firmware.bin": string(big)})
	r.push(false)
	e := &faultEnv{repo: r}
	switch transport {
	case "ssh":
		host := newSigner(t, "ed25519")
		keyFile, khFile, client := sshFixture(t, "")
		srv := startSSHGitServer(t, r.bare, client.PublicKey(), host)
		e.proxy = startFaultProxy(t, srv.addr)
		line := knownhosts.Line([]string{knownhosts.Normalize(e.proxy.addr())}, host.PublicKey())
		if err := os.WriteFile(khFile, []byte(line+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		e.remote = Remote{URL: "ssh://git@" + e.proxy.addr() + r.bare, SSHKeyFile: keyFile, KnownHostsFile: khFile}
	case "https":
		const token = "tok-fault-proxy"
		base, caFile := startHTTPSGit(t, filepath.Dir(r.bare), token)
		u, err := url.Parse(base)
		if err != nil {
			t.Fatal(err)
		}
		e.proxy = startFaultProxy(t, u.Host)
		tokFile := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(tokFile, []byte(token), 0o600); err != nil {
			t.Fatal(err)
		}
		e.remote = Remote{URL: "https://" + e.proxy.addr() + "/" + filepath.Base(r.bare), TokenFile: tokFile, CAFile: caFile}
	}
	return e
}

// within runs f and fails the test if it has not returned after limit.
func within(t *testing.T, limit time.Duration, what string, f func() error) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case err := <-ch:
		return time.Since(start), err
	case <-timer.C:
		t.Fatalf("%s still blocked after %s", what, limit)
		return 0, nil
	}
}

// TestGitDeadlinesCloseHungConnections puts each failure between the
// controller and a real Git server (SSH and HTTPS): every poll (ls-remote
// and fetch) and status push returns ErrGitTimeout within its deadline
// plus a margin, logs the operation, the remote and the elapsed time, and
// the next attempt succeeds once the server answers again.
func TestGitDeadlinesCloseHungConnections(t *testing.T) {
	const timeout = 2 * time.Second
	const margin = 15 * time.Second // generous for a loaded machine; without the fix it never returns
	for _, transport := range []string{"ssh", "https"} {
		t.Run(transport, func(t *testing.T) {
			e := newFaultEnv(t, transport)
			// Calibrate: a first poll's connections, the list's and the
			// fetch's (the one carrying the pack is the largest).
			cal, err := NewSource(SourceConfig{Remote: e.remote, StateDir: t.TempDir(), Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			e.proxy.serverBytes()
			if err := cal.Poll(t.Context()); err != nil {
				t.Fatalf("calibration Poll = %v", err)
			}
			sizes := e.proxy.serverBytes()
			list, pack := sizes[0], int64(0)
			for _, n := range sizes {
				pack = max(pack, n)
			}
			if pack < list+128<<10 {
				t.Fatalf("connections carried %v bytes: no pack connection to stall in", sizes)
			}
			e.proxy.threshold.Store(list + (pack-list)/2)
			t.Logf("server bytes per connection %v; stalling after %d", sizes, list+(pack-list)/2)

			for _, tc := range []struct {
				name string
				mode int32
				op   string // the operation that times out
			}{
				{"accepts and never answers", modeBlackhole, "ls-remote"},
				{"stalls mid-pack", modeStall, "fetch"},
				{"trickles", modeTrickle, "fetch"},
			} {
				t.Run("poll "+tc.name, func(t *testing.T) {
					var logs syncBuffer
					s, err := NewSource(SourceConfig{Remote: e.remote, StateDir: t.TempDir(), Timeout: timeout,
						Logger: slog.New(slog.NewTextHandler(&logs, nil))})
					if err != nil {
						t.Fatal(err)
					}
					e.proxy.mode.Store(tc.mode)
					took, err := within(t, timeout+margin, "Poll", func() error { return s.Poll(t.Context()) })
					if !errors.Is(err, ErrGitTimeout) {
						t.Fatalf("Poll = %v, want ErrGitTimeout", err)
					}
					t.Logf("Poll returned after %s: %v", took, err)
					if l := logs.String(); !strings.Contains(l, "git operation timed out") || !strings.Contains(l, "op="+tc.op) ||
						!strings.Contains(l, "remote=") || !strings.Contains(l, "elapsed=") || strings.Contains(l, "tok-fault-proxy") {
						t.Errorf("logs = %s, want the %s timeout with remote and elapsed, no token", l, tc.op)
					}
					e.proxy.mode.Store(modePass)
					if _, err := within(t, time.Minute, "Poll after recovery", func() error { return s.Poll(t.Context()) }); err != nil {
						t.Fatalf("Poll after the server recovered = %v", err)
					}
					if good, _ := s.Latest(); good.Inventory == nil {
						t.Error("no revision after recovery")
					}
				})
			}
			for i, tc := range []struct {
				name string
				mode int32
			}{
				{"accepts and never answers", modeBlackhole},
				{"trickles", modeTrickle},
			} {
				t.Run("push "+tc.name, func(t *testing.T) {
					var logs syncBuffer
					snap := sampleSnapshot()
					snap.Inventory.Good.Commit = strings.Repeat(fmt.Sprint(i+1), 40) // a change for each case
					w, err := NewStatusWriter(StatusConfig{Remote: e.remote, StateDir: t.TempDir(), Timeout: timeout, Attempts: 1,
						Logger: slog.New(slog.NewTextHandler(&logs, nil))})
					if err != nil {
						t.Fatal(err)
					}
					old := e.proxy.threshold.Load()
					e.proxy.threshold.Store(0) // trickle from the first byte
					defer e.proxy.threshold.Store(old)
					e.proxy.mode.Store(tc.mode)
					took, err := within(t, timeout+margin, "Write", func() error { _, err := w.Write(t.Context(), snap); return err })
					if !errors.Is(err, ErrGitTimeout) {
						t.Fatalf("Write = %v, want ErrGitTimeout", err)
					}
					t.Logf("Write returned after %s: %v", took, err)
					if !strings.Contains(logs.String(), "git operation timed out") {
						t.Errorf("logs = %s, want the timeout", logs.String())
					}
					e.proxy.mode.Store(modePass)
					var res WriteResult
					_, err = within(t, time.Minute, "Write after recovery", func() error {
						var err error
						res, err = w.Write(t.Context(), snap)
						return err
					})
					if err != nil || res.Commit == "" {
						t.Fatalf("Write after the server recovered = %+v, %v", res, err)
					}
				})
			}
		})
	}
}

// startHTTPSGitForge serves root's bare repos with git-http-backend behind
// TLS and basic auth like nginx or a forge in front of it: a wrong token
// gets 401 with an HTML page, the read-only token 403 with one on a push.
// It counts the requests.
func startHTTPSGitForge(t *testing.T, root, token, readOnly string) (base, caFile string, requests *atomic.Int32) {
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
	requests = new(atomic.Int32)
	page := func(w http.ResponseWriter, code int) {
		w.Header().Set("Content-Type", "text/html")
		if code == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, "<html>\r\n<head><title>%d %s</title></head>\r\n<body>\r\n<center><h1>%d %s</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n",
			code, http.StatusText(code), code, http.StatusText(code))
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		_, pass, ok := r.BasicAuth()
		switch {
		case ok && pass == token:
		case ok && pass == readOnly:
			if strings.Contains(r.URL.String(), "receive-pack") {
				page(w, http.StatusForbidden)
				return
			}
		default:
			page(w, http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return srv.URL, caFile, requests
}

// TestGitAuthErrorsClassified: a 401 or 403 from the server is ErrGitAuth
// or ErrGitPermission, logged without the server's HTML page, and a
// status write does not retry it; a pre-receive hook's refusal shows the
// server's "remote:" lines and is not retried either.
func TestGitAuthErrorsClassified(t *testing.T) {
	r := newTestRepo(t)
	const token, readOnly = "tok-good-1234567890", "tok-readonly-0987654321"
	base, caFile, requests := startHTTPSGitForge(t, filepath.Dir(r.bare), token, readOnly)
	url := base + "/" + filepath.Base(r.bare)
	dir := t.TempDir()
	tokenFile := func(v string) string {
		p := filepath.Join(dir, v)
		if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	noPage := func(what string, err error) {
		t.Helper()
		for _, s := range []string{err.Error(), logs.String()} {
			if strings.Contains(s, "<html") || strings.Contains(s, "nginx") || strings.Contains(s, "tok-") {
				t.Errorf("%s: the server's page or a token leaks: %s", what, s)
			}
		}
	}

	s, err := NewSource(SourceConfig{Remote: Remote{URL: url, TokenFile: tokenFile("tok-wrong"), CAFile: caFile}, StateDir: t.TempDir(), Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Poll(t.Context())
	if !errors.Is(err, ErrGitAuth) {
		t.Fatalf("Poll with a wrong token = %v, want ErrGitAuth", err)
	}
	noPage("poll", err)
	if l := logs.String(); !strings.Contains(l, "refuses the controller") || strings.Contains(l, "unreachable") {
		t.Errorf("logs = %s, want the refusal named as such", l)
	}

	w, err := NewStatusWriter(StatusConfig{Remote: Remote{URL: url, TokenFile: tokenFile("tok-wrong"), CAFile: caFile}, StateDir: t.TempDir(),
		Attempts: 5, RetryDelay: time.Millisecond, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	requests.Store(0)
	_, err = w.Write(t.Context(), sampleSnapshot())
	if !errors.Is(err, ErrGitAuth) {
		t.Fatalf("Write with a wrong token = %v, want ErrGitAuth", err)
	}
	noPage("write", err)
	if n := requests.Load(); n > 2 {
		t.Errorf("a write with a refused token made %d requests, want one attempt", n)
	}

	w, err = NewStatusWriter(StatusConfig{Remote: Remote{URL: url, TokenFile: tokenFile(readOnly), CAFile: caFile}, StateDir: t.TempDir(),
		Attempts: 5, RetryDelay: time.Millisecond, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	requests.Store(0)
	_, err = w.Write(t.Context(), sampleSnapshot())
	if !errors.Is(err, ErrGitPermission) {
		t.Fatalf("Write with a read-only token = %v, want ErrGitPermission", err)
	}
	noPage("read-only write", err)
	if n := requests.Load(); n > 4 {
		t.Errorf("a write refused for permission made %d requests, want one attempt", n)
	}

	// A pre-receive hook refuses: its output reaches the error.
	hook := filepath.Join(r.bare, "hooks", "pre-receive")
	if err := os.MkdirAll(filepath.Dir(hook), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hook, []byte("#!/bin/sh\necho 'policy: pushes to main need a review' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	w, err = NewStatusWriter(StatusConfig{Remote: Remote{URL: url, TokenFile: tokenFile(token), CAFile: caFile}, StateDir: t.TempDir(),
		Attempts: 5, RetryDelay: time.Millisecond, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	res, err := w.Write(t.Context(), sampleSnapshot())
	if !errors.Is(err, ErrGitPermission) || !strings.Contains(err.Error(), "remote: policy: pushes to main need a review") {
		t.Fatalf("Write refused by a hook = %v, want ErrGitPermission with the remote: line", err)
	}
	if res.Attempts != 1 {
		t.Errorf("Write refused by a hook made %d attempts, want 1", res.Attempts)
	}
	t.Logf("hook refusal: %v", err)
}

// TestSourceBackoffCap: after an outage the source polls again within
// about a minute, not ten.
func TestSourceBackoffCap(t *testing.T) {
	s, err := NewSource(SourceConfig{Remote: Remote{URL: "/nonexistent/repo.git"}, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if s.cfg.MaxBackoff != time.Minute {
		t.Errorf("default MaxBackoff = %s, want 1m", s.cfg.MaxBackoff)
	}
	if d := backoffDelay(s.cfg.Interval, s.cfg.MaxBackoff, 20, 0.999); d > 66*time.Second {
		t.Errorf("wait after 20 failed polls = %s, want at most 66s (1m + 10%% jitter)", d)
	}
}

// TestStatusPushDeadlineFollowsPackSize: a push over a slow uplink gets
// Timeout plus its pack's size at MinPushRate, so a status commit larger
// than Timeout's worth of upload still lands (with a fixed Timeout it
// could never complete). Timeout also bounds the write's fetch of the
// remote's tip (TLS and git-http-backend), so it is 4 s, not less: under
// -race on a loaded 2-core host that fetch alone took more than 1 s.
func TestStatusPushDeadlineFollowsPackSize(t *testing.T) {
	e := newFaultEnv(t, "https")
	snap := sampleSnapshot()
	for i := range 400 {
		serial := make([]byte, 16)
		rand.Read(serial)
		snap.Servers = append(snap.Servers, ServerStatus{Name: fmt.Sprintf("r%d-n%02d", i/40, i%40), Lifecycle: "ready",
			Hardware: Hardware{Serial: fmt.Sprintf("%x", serial)}})
	}
	var logs syncBuffer
	w, err := NewStatusWriter(StatusConfig{Remote: e.remote, StateDir: t.TempDir(), Attempts: 1,
		Timeout: 4 * time.Second, MinPushRate: 2 << 10, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	// The pack takes about 11 s at upRate, well past Timeout; its deadline
	// at MinPushRate (2 KiB/s) is about 48 s, four times the upload.
	const upRate = 8 << 10 // bytes a second
	e.proxy.upRate.Store(upRate)
	res, err := w.Write(t.Context(), snap)
	if err != nil {
		t.Fatalf("Write of a large status over an 8 KiB/s uplink = %v", err)
	}
	l := logs.String()
	i := strings.Index(l, "packBytes=")
	if i < 0 {
		t.Fatalf("no packBytes in %s", l)
	}
	var n int
	fmt.Sscanf(l[i+len("packBytes="):], "%d", &n)
	if n < 2*4*upRate {
		t.Fatalf("pack is %d bytes: too small to outlast Timeout (4 s) twice over at 8 KiB/s", n)
	}
	if got := e.repo.remoteHead("main").String(); got != res.Commit {
		t.Errorf("remote main = %s, want %s", got, res.Commit)
	}
	t.Logf("pushed %d bytes at 8 KiB/s with Timeout 4s: deadline %s", n, w.pushTimeout(n))
}
