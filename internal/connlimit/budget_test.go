package connlimit

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestSplit: the documented split, the reserve never below 256, every
// descriptor accounted for, and a limit too small for it refused.
func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		limit                         uint64
		reserve, machine, admin, join int
	}{
		{1024, 256, 576, 96, 96},
		{20000, 5000, 11250, 1875, 1875},
		{1 << 20, 1 << 18, 589824, 98304, 98304},
		{512, 256, 192, 32, 32},
		{1 << 40, 0, 0, 0, 0}, // capped at MaxBudgetLimit: only the sum is checked
	} {
		b, err := Split(tc.limit)
		if err != nil {
			t.Fatalf("Split(%d): %v", tc.limit, err)
		}
		if tc.limit <= MaxBudgetLimit {
			if b.Reserve != tc.reserve || b.Machine != tc.machine || b.Admin != tc.admin || b.Join != tc.join {
				t.Errorf("Split(%d) = %+v, want reserve %d machine %d admin %d join %d", tc.limit, b, tc.reserve, tc.machine, tc.admin, tc.join)
			}
		}
		if uint64(b.Reserve+b.Machine+b.Admin+b.Join) != b.Limit || b.Limit > MaxBudgetLimit {
			t.Errorf("Split(%d) = %+v: shares do not add up to the limit", tc.limit, b)
		}
	}
	if _, err := Split(256); err == nil {
		t.Error("Split(256): no error for a limit below the reserve")
	}
}

// TestNoFile: the limit read is the soft limit, raised to the hard one.
func TestNoFile(t *testing.T) {
	n, err := NoFile()
	if err != nil {
		t.Fatal(err)
	}
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		t.Fatal(err)
	}
	if n != r.Cur || r.Cur != r.Max {
		t.Errorf("NoFile() = %d; rlimit now %d/%d, want soft = hard = the value returned", n, r.Cur, r.Max)
	}
}

// serveAccepts accepts from ln into a channel until it fails.
func serveAccepts(ln net.Listener) chan net.Conn {
	ch := make(chan net.Conn, 64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(ch)
				return
			}
			ch <- c
		}
	}()
	return ch
}

// closedByServer reports whether the server closed c (EOF or reset)
// within 5s.
func closedByServer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// TestMaxTotalFairShare: at its budget, a listener refuses a connection
// from an address already holding as many as the heaviest, and admits one
// from an address holding fewer by closing the heaviest address's oldest.
// Without the total cap (the per-address cap only) addresses under it
// filled every descriptor; without the share a flood from many addresses
// locked a machine out.
func TestMaxTotalFairShare(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := New(raw, Config{MaxPerIP: 10, MaxTotal: 5, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	defer ln.Close()
	accepted := serveAccepts(ln)
	dialFrom := func(src string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// The flood: .1 holds 3, .2 holds 2: the budget is full.
	flood := []net.Conn{dialFrom("127.0.0.1"), dialFrom("127.0.0.1"), dialFrom("127.0.0.1")}
	var served []net.Conn
	for range flood {
		served = append(served, <-accepted)
	}
	dialFrom("127.0.0.2")
	dialFrom("127.0.0.2")
	<-accepted
	<-accepted
	// .2 again: it holds 2, the heaviest 3 → refused (not two under).
	if c := dialFrom("127.0.0.2"); !closedByServer(c) {
		t.Fatal("at the budget, a connection from an address one under the heaviest was not refused")
	}
	if s := ln.Stats(); s.RefusedBudget != 1 || s.Open != 5 {
		t.Fatalf("stats %+v, want 1 refused for the budget and 5 open", s)
	}
	// .3 holds none: admitted, .1's oldest closed.
	dialFrom("127.0.0.3")
	select {
	case <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("a new address was not admitted at the budget")
	}
	if !closedByServer(flood[0]) {
		t.Fatal("the heaviest address's oldest connection was not closed")
	}
	if s := ln.Stats(); s.Evicted != 1 || s.Open != 5 {
		t.Fatalf("stats %+v, want 1 evicted and 5 open", s)
	}
	// The evicted connection's own Close (its server's) frees nothing
	// more; another's frees one slot.
	served[0].Close()
	if s := ln.Stats(); s.Open != 5 {
		t.Fatalf("after closing the evicted connection: %d open, want 5", s.Open)
	}
	served[1].Close()
	if s := ln.Stats(); s.Open != 4 {
		t.Fatalf("after closing one: %d open, want 4", s.Open)
	}
}

// emfileListener fails its first n Accepts with EMFILE, as accept(2) does
// when the process is out of descriptors, then hands out conn.
type emfileListener struct {
	net.Listener
	mu    sync.Mutex
	n     int
	calls int
	conn  net.Conn
}

func (l *emfileListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	if l.calls <= l.n {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: fmt.Errorf("accept4: %w", syscall.EMFILE)}
	}
	if l.conn == nil {
		return nil, net.ErrClosed
	}
	c := l.conn
	l.conn = nil
	return c, nil
}

// TestAcceptBacksOff: EMFILE from accept(2) is waited out inside Accept
// (counted, logged once), not returned: a caller's loop never sees it and
// cannot spin. Fails without the back-off: Accept returned the error.
func TestAcceptBacksOff(t *testing.T) {
	server, client := net.Pipe()
	defer client.Close()
	var logs bytes.Buffer
	var logMu sync.Mutex
	el := &emfileListener{Listener: dummyListener{}, n: 4, conn: server}
	ln := New(el, Config{Name: "machine", Logger: slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil))})
	c, err := ln.Accept()
	if err != nil {
		t.Fatalf("Accept through 4 EMFILEs: %v", err)
	}
	c.Close()
	if s := ln.Stats(); s.AcceptErrors != 4 {
		t.Errorf("AcceptErrors = %d, want 4", s.AcceptErrors)
	}
	logMu.Lock()
	out := logs.String()
	logMu.Unlock()
	if n := strings.Count(out, "accept failed: backing off"); n != 1 || !strings.Contains(out, "too many open files") || !strings.Contains(out, "listener=machine") {
		t.Errorf("log lines: %d (want 1 naming the error and the listener):\n%s", n, out)
	}
	// After the EMFILEs, a real error ends Accept.
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after the connection: %v, want net.ErrClosed", err)
	}
}

// TestAcceptBackoffEndsAtClose: Close ends a back-off wait.
func TestAcceptBackoffEndsAtClose(t *testing.T) {
	el := &emfileListener{Listener: dummyListener{}, n: 1 << 30}
	ln := New(el, Config{})
	done := make(chan error, 1)
	go func() { _, err := ln.Accept(); done <- err }()
	for ln.Stats().AcceptErrors < 3 {
		runtime.Gosched()
	}
	el.mu.Lock()
	el.n = 0 // the next accept(2) reports the closed listener
	el.mu.Unlock()
	ln.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Accept still backing off 10s after Close")
	}
}

type dummyListener struct{}

func (dummyListener) Accept() (net.Conn, error) { return nil, net.ErrClosed }
func (dummyListener) Close() error              { return nil }
func (dummyListener) Addr() net.Addr            { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
