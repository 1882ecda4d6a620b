package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/controller"
	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/state"
)

// recordingProxy forwards TCP connections from a loopback port to target
// and records every byte in both directions: what a capture on the
// management network would see.
type recordingProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	buf   bytes.Buffer
	wg    sync.WaitGroup
	conns []net.Conn
}

func newRecordingProxy(t *testing.T, target string) *recordingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &recordingProxy{ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			p.wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer p.wg.Done()
				_, _ = io.Copy(io.MultiWriter(dst, p), src)
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
			}
			go pipe(up, c)
			go pipe(c, up)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns { // idle keep-alive connections
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *recordingProxy) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.buf.Write(b)
}

func (p *recordingProxy) bytes() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]byte(nil), p.buf.Bytes()...)
}

// tlsAdminFixture serves the admin API the way machina serve does with a
// TLS admin listener (controller.ListenAdminTLS, certificate from the
// controller CA) on loopback, and writes the CA's PEM for --ca-file.
func tlsAdminFixture(t *testing.T) (st *state.Store, tlsAddr, plainURL, caFile, token string) {
	t.Helper()
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{MasterKey: []byte("master-key-for-tls-test")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ca, err := join.LoadOrCreateCA(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	adminLn, _, err := controller.ListenAdminTLS("127.0.0.1:0", controller.AdminTLS{Listen: "127.0.0.1:0"}, ca)
	if err != nil {
		t.Fatal(err)
	}
	plainLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = srv.Serve(ctx, adminLn) }()
	go func() { defer wg.Done(); _ = srv.Serve(ctx, plainLn) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	token, _, err = st.CreateAdminToken("ops", state.ActorLocal)
	if err != nil {
		t.Fatal(err)
	}
	return st, adminLn.Addr().String(), "http://" + plainLn.Addr().String(), caFile, token
}

// TestSecretSetNeverInClearOverTLS runs `machinactl secret set` against
// the admin API's TLS listener through a proxy recording both directions
// and checks that neither the password nor the admin token appears in the
// recorded bytes, while the secret is stored. The same request over plain
// HTTP through the same proxy shows both, so the capture would catch a
// leak.
func TestSecretSetNeverInClearOverTLS(t *testing.T) {
	st, tlsAddr, plainURL, caFile, tok := tlsAdminFixture(t)
	t.Setenv(envToken, tok)
	ctx := context.Background()
	const pw = "Zq7-bmc-password-that-must-not-leak"

	proxy := newRecordingProxy(t, tlsAddr)
	var out, errb bytes.Buffer
	code := run(ctx, []string{"secret", "set", "bmc-default", "--username", "admin", "--password-stdin",
		"--api", "https://" + proxy.ln.Addr().String(), "--ca-file", caFile}, strings.NewReader(pw+"\n"), &out, &errb)
	if code != 0 {
		t.Fatalf("secret set over TLS: exit %d: %s", code, errb.String())
	}
	if cred, err := st.Secret("bmc-default"); err != nil || cred.Password != pw {
		t.Fatalf("stored %v, %v", cred, err)
	}
	wire := proxy.bytes()
	if len(wire) < 1000 {
		t.Fatalf("recorded only %d bytes: the proxy did not see the exchange", len(wire))
	}
	for what, secret := range map[string]string{"password": pw, "admin token": tok, "token prefix": state.AdminTokenPrefix + tok[len(state.AdminTokenPrefix):len(state.AdminTokenPrefix)+8]} {
		if bytes.Contains(wire, []byte(secret)) {
			t.Errorf("the %s crossed the wire in clear over TLS", what)
		}
	}
	if bytes.Contains(wire, []byte("PUT /api/v1/secrets")) {
		t.Error("the request line crossed the wire in clear over TLS")
	}

	// Control: plain HTTP (allowed on loopback) through the same kind of
	// proxy puts both in the capture.
	plainProxy := newRecordingProxy(t, strings.TrimPrefix(plainURL, "http://"))
	code = run(ctx, []string{"secret", "set", "bmc-other", "--username", "admin", "--password-stdin",
		"--api", "http://" + plainProxy.ln.Addr().String()}, strings.NewReader(pw+"\n"), &out, &errb)
	if code != 0 {
		t.Fatalf("secret set over plain loopback HTTP: exit %d: %s", code, errb.String())
	}
	if clear := plainProxy.bytes(); !bytes.Contains(clear, []byte(pw)) || !bytes.Contains(clear, []byte(tok)) {
		t.Error("control: the plain-HTTP capture lacks the password or token: the proxy records nothing useful")
	}
}

// TestTLSPinsTheCA checks machinactl verifies the admin certificate
// against --ca-file alone: another CA's PEM fails the handshake, and
// without --ca-file the system roots do not know the controller's CA.
func TestTLSPinsTheCA(t *testing.T) {
	_, tlsAddr, _, _, tok := tlsAdminFixture(t)
	t.Setenv(envToken, tok)
	other, err := state.Open(filepath.Join(t.TempDir(), "other.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	otherCA, err := join.LoadOrCreateCA(other, nil)
	if err != nil {
		t.Fatal(err)
	}
	otherFile := filepath.Join(t.TempDir(), "other-ca.pem")
	if err := os.WriteFile(otherFile, otherCA.PEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, args := range map[string][]string{
		"other CA":   {"status", "--api", "https://" + tlsAddr, "--ca-file", otherFile},
		"system CAs": {"status", "--api", "https://" + tlsAddr, "--ca-file", ""},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), args, strings.NewReader(""), &out, &errb)
		if code == 0 || !strings.Contains(errb.String(), "certificate") {
			t.Errorf("%s: exit %d, stderr %q; want a certificate verification failure", name, code, errb.String())
		}
	}
}

// TestRefusesPlainHTTPOffLoopback checks every admin-API verb refuses
// http:// to a non-loopback address without --insecure, before reading
// stdin or dialling (192.0.2.10 is TEST-NET-1, RFC 5737: nothing is ever
// sent there), and accepts loopback names.
func TestRefusesPlainHTTPOffLoopback(t *testing.T) {
	t.Setenv(envToken, "mna_test")
	for _, args := range [][]string{
		{"secret", "set", "bmc", "--username", "a", "--password-stdin", "--api", "http://192.0.2.10:8080"},
		{"status", "--api", "http://192.0.2.10:8080"},
		{"admin-token", "list", "--api", "http://machina.example:8080"},
		{"console", "r1-n01", "--api", "http://[2001:db8::1]:8080"},
	} {
		stdin := &failReader{t: t}
		var out, errb bytes.Buffer
		code := run(context.Background(), args, stdin, &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), "refusing plain HTTP") || !strings.Contains(errb.String(), "--insecure") {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 refusing plain HTTP", args, code, errb.String())
		}
	}
	var c connFlags
	for _, u := range []string{"http://127.0.0.1:8080", "http://localhost:8080", "http://[::1]:8080", "https://192.0.2.10:8444"} {
		if _, err := c.checkAPIURL(u); err != nil {
			t.Errorf("checkAPIURL(%s) = %v, want nil", u, err)
		}
	}
	c.insecure = true
	if _, err := c.checkAPIURL("http://192.0.2.10:8080"); err != nil {
		t.Errorf("checkAPIURL with --insecure = %v, want nil", err)
	}
}

// failReader fails the test when read: the refusal must come first.
type failReader struct{ t *testing.T }

func (f *failReader) Read([]byte) (int, error) {
	f.t.Error("stdin read before the plain-HTTP refusal")
	return 0, io.EOF
}

// TestControllerServesAdminAndUIOverTLS runs the whole controller on the
// simulated lab with its admin TLS listener: machinactl status answers
// over TLS with the CA pinned, and the UI is served on the same listener
// (its login page; the session cookie is Secure there).
func TestControllerServesAdminAndUIOverTLS(t *testing.T) {
	h := startControllerWith(t, func(c *controller.Config) { c.AdminTLS = controller.AdminTLS{Listen: "127.0.0.1:0"} })
	if !strings.HasPrefix(h.run.AdminURL, "https://127.0.0.1:") {
		t.Fatalf("AdminURL %q", h.run.AdminURL)
	}
	ca, err := join.LoadOrCreateCA(h.run.Store, nil)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(envToken, h.token)
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"status", "--api", h.run.AdminURL, "--ca-file", caFile}, strings.NewReader(""), &out, &errb); code != 0 {
		t.Fatalf("status over TLS: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "Servers:") {
		t.Errorf("status output %q", out.String())
	}
	hc, err := (&connFlags{caFile: caFile}).httpClient()
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get(h.run.AdminURL + "/ui/")
	if err != nil {
		t.Fatalf("UI over TLS: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(strings.ToLower(string(body)), "<html") {
		t.Errorf("GET /ui/ over TLS = %d %.200q", resp.StatusCode, body)
	}
}
