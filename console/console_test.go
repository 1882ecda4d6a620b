package console

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/machina-metal/machina/bmc"
)

// echoStream is a stand-in serial console: what is typed comes back, like a
// getty echoing input. Close is recorded.
type echoStream struct {
	pr     *io.PipeReader
	pw     *io.PipeWriter
	once   sync.Once
	closed chan struct{}
}

func newEchoStream() *echoStream {
	pr, pw := io.Pipe()
	return &echoStream{pr: pr, pw: pw, closed: make(chan struct{})}
}

func (e *echoStream) Read(p []byte) (int, error)  { return e.pr.Read(p) }
func (e *echoStream) Write(p []byte) (int, error) { return e.pw.Write(p) }
func (e *echoStream) Close() error {
	e.once.Do(func() {
		e.pw.Close()
		e.pr.Close()
		close(e.closed)
	})
	return nil
}

type auditLog struct {
	mu sync.Mutex
	ev []Event
	ch chan Event
}

func (a *auditLog) record(_ context.Context, e Event) {
	a.mu.Lock()
	a.ev = append(a.ev, e)
	a.mu.Unlock()
	a.ch <- e
}

func (a *auditLog) next(t *testing.T) Event {
	t.Helper()
	select {
	case e := <-a.ch:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no audit event")
		return Event{}
	}
}

type fixture struct {
	srv     *httptest.Server
	audit   *auditLog
	mu      sync.Mutex
	streams []*echoStream
}

func newFixture(t *testing.T, idle time.Duration) *fixture {
	f := &fixture{audit: &auditLog{ch: make(chan Event, 64)}}
	h, err := New(Config{
		Opener: OpenerFunc(func(ctx context.Context, server string) (io.ReadWriteCloser, error) {
			if server == "missing" {
				return nil, ErrServerNotFound
			}
			s := newEchoStream()
			f.mu.Lock()
			f.streams = append(f.streams, s)
			f.mu.Unlock()
			return s, nil
		}),
		Authenticate: func(r *http.Request) (string, error) {
			if r.Header.Get("Authorization") != "Bearer admin-token" {
				return "", errors.New("bad token")
			}
			return "alice", nil
		},
		Audit:       f.audit.record,
		IdleTimeout: idle,
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(Pattern, h)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fixture) dial(t *testing.T, name string) (*websocket.Conn, string) {
	t.Helper()
	url := "ws" + strings.TrimPrefix(f.srv.URL, "http") + "/api/v1/servers/" + name + "/console"
	c, resp, err := websocket.Dial(t.Context(), url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer admin-token"}}})
	if err != nil {
		t.Fatalf("dial %s: %v", name, err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c, resp.Header.Get(RoleHeader)
}

func readN(t *testing.T, c *websocket.Conn, n int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var got []byte
	for len(got) < n {
		_, b, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("read after %q: %v", got, err)
		}
		got = append(got, b...)
	}
	return string(got)
}

// TestRoundTripWriterReaderAudit: bytes typed by the writer reach the
// console and come back to both clients; the reader's input is dropped;
// open/close are audited; the stream closes when the last client leaves.
func TestRoundTripWriterReaderAudit(t *testing.T) {
	f := newFixture(t, time.Minute)
	w, role := f.dial(t, "node-1")
	if role != RoleWriter {
		t.Fatalf("first client role = %q, want writer", role)
	}
	if e := f.audit.next(t); e.Action != "console.open" || e.Server != "node-1" || e.Principal != "alice" || e.Role != RoleWriter {
		t.Errorf("open event = %+v", e)
	}
	r, role := f.dial(t, "node-1")
	if role != RoleReader {
		t.Fatalf("second client role = %q, want reader", role)
	}
	if e := f.audit.next(t); e.Action != "console.open" || e.Role != RoleReader {
		t.Errorf("second open event = %+v", e)
	}
	f.mu.Lock()
	if len(f.streams) != 1 {
		t.Fatalf("%d console streams opened, want 1 shared", len(f.streams))
	}
	stream := f.streams[0]
	f.mu.Unlock()

	// Reader input is dropped: only the writer's bytes come back.
	if err := r.Write(t.Context(), websocket.MessageBinary, []byte("IGNORED")); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(t.Context(), websocket.MessageBinary, []byte("root\r")); err != nil {
		t.Fatal(err)
	}
	if got := readN(t, w, 5); got != "root\r" {
		t.Errorf("writer got %q, want %q", got, "root\r")
	}
	if got := readN(t, r, 5); got != "root\r" {
		t.Errorf("reader got %q, want %q", got, "root\r")
	}

	w.Close(websocket.StatusNormalClosure, "")
	if e := f.audit.next(t); e.Action != "console.close" || e.Role != RoleWriter || e.Reason != "client closed" {
		t.Errorf("writer close event = %+v", e)
	}
	select {
	case <-stream.closed:
		t.Fatal("stream closed while a reader is still attached")
	default:
	}
	// The writer role is free again: a new client takes it.
	w2, role := f.dial(t, "node-1")
	if role != RoleWriter {
		t.Errorf("client after the writer left got role %q, want writer", role)
	}
	f.audit.next(t)
	w2.Close(websocket.StatusNormalClosure, "")
	r.Close(websocket.StatusNormalClosure, "")
	f.audit.next(t)
	f.audit.next(t)
	select {
	case <-stream.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("console stream not closed after the last client left")
	}
}

// TestIdleTimeout: a client that sends nothing and gets nothing is closed
// with policy-violation status and an audited reason.
func TestIdleTimeout(t *testing.T) {
	f := newFixture(t, 200*time.Millisecond)
	c, _ := f.dial(t, "node-2")
	f.audit.next(t)
	_, _, err := c.Read(t.Context())
	if got := websocket.CloseStatus(err); got != websocket.StatusPolicyViolation {
		t.Errorf("close status = %v (%v), want policy violation", got, err)
	}
	if e := f.audit.next(t); e.Action != "console.close" || e.Reason != "idle timeout" {
		t.Errorf("close event = %+v, want reason idle timeout", e)
	}
}

type noConsoleDriver struct{ bmc.Driver }

// TestHTTPErrors: unauthenticated, bad name, unknown server, and a BMC
// without a console (a Redfish driver) answer before any upgrade.
func TestHTTPErrors(t *testing.T) {
	h, err := New(Config{
		Opener: DriverOpener(func(ctx context.Context, server string) (bmc.Driver, error) {
			if server == "redfish-1" {
				return noConsoleDriver{}, nil
			}
			return nil, ErrServerNotFound
		}),
		Authenticate: func(r *http.Request) (string, error) {
			if r.Header.Get("Authorization") == "" {
				return "", errors.New("no token")
			}
			return "alice", nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(Pattern, h)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	cases := []struct {
		path, auth string
		code       int
		body       string
	}{
		{"/api/v1/servers/redfish-1/console", "", http.StatusUnauthorized, "unauthorized"},
		{"/api/v1/servers/redfish-1/console", "Bearer x", http.StatusNotImplemented, "not supported by this BMC"},
		{"/api/v1/servers/nope/console", "Bearer x", http.StatusNotFound, "server not found"},
		{"/api/v1/servers/Bad_Name/console", "Bearer x", http.StatusBadRequest, "invalid server name"},
	}
	for _, tc := range cases {
		req, _ := http.NewRequest("GET", srv.URL+tc.path, nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || !strings.Contains(string(b), tc.body) {
			t.Errorf("GET %s = %d %q, want %d containing %q", tc.path, resp.StatusCode, b, tc.code, tc.body)
		}
	}
	if _, err := New(Config{}); err == nil {
		t.Errorf("New without Opener succeeded")
	}
}

// TestConsoleEndedAndReopen: when the console stream ends (the BMC dropped
// SOL), clients are closed with 1001 and the next client gets a fresh stream.
func TestConsoleEndedAndReopen(t *testing.T) {
	f := newFixture(t, time.Minute)
	c, _ := f.dial(t, "node-3")
	f.audit.next(t)
	f.mu.Lock()
	first := f.streams[0]
	f.mu.Unlock()
	first.Close() // the console side goes away
	_, _, err := c.Read(t.Context())
	if got := websocket.CloseStatus(err); got != websocket.StatusGoingAway {
		t.Errorf("close status = %v (%v), want going away", got, err)
	}
	if e := f.audit.next(t); e.Reason != "console ended" {
		t.Errorf("close event = %+v, want reason console ended", e)
	}
	c2, role := f.dial(t, "node-3")
	if role != RoleWriter {
		t.Errorf("role after reopen = %q", role)
	}
	f.audit.next(t)
	if err := c2.Write(t.Context(), websocket.MessageBinary, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if got := readN(t, c2, 1); got != "x" {
		t.Errorf("echo after reopen = %q", got)
	}
	f.mu.Lock()
	n := len(f.streams)
	f.mu.Unlock()
	if n != 2 {
		t.Errorf("%d streams opened, want 2", n)
	}
}

// TestSlowOpenDoesNotBlockOtherServers: while one BMC takes its time to open
// SOL, another server's console attaches; an open error answers 502.
func TestSlowOpenDoesNotBlockOtherServers(t *testing.T) {
	release := make(chan struct{})
	opening := make(chan struct{}, 2)
	h, err := New(Config{
		Opener: OpenerFunc(func(ctx context.Context, server string) (io.ReadWriteCloser, error) {
			if server == "slow" {
				opening <- struct{}{}
				<-release
				return nil, errors.New("sol activation failed")
			}
			return newEchoStream(), nil
		}),
		Authenticate: func(r *http.Request) (string, error) { return "alice", nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(Pattern, h)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	slowDone := make(chan int, 2)
	for range 2 {
		go func() {
			resp, err := http.Get(srv.URL + "/api/v1/servers/slow/console")
			if err != nil {
				slowDone <- 0
				return
			}
			resp.Body.Close()
			slowDone <- resp.StatusCode
		}()
	}
	<-opening // the slow BMC's open is in progress
	url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/api/v1/servers/fast/console"
	c, _, err := websocket.Dial(t.Context(), url, nil)
	if err != nil {
		t.Fatalf("dial fast while slow is opening: %v", err)
	}
	c.Close(websocket.StatusNormalClosure, "")
	close(release)
	for range 2 {
		if code := <-slowDone; code != http.StatusBadGateway {
			t.Errorf("slow open failure answered %d, want 502", code)
		}
	}

}
