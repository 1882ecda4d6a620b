// Package connlimit bounds the connections a listener holds open, so that
// no inbound load can take every file descriptor of the process: a cap per
// source address (slow request bodies from one address once held 20,000 of
// 20,000), a total per listener derived from RLIMIT_NOFILE (Budget: slow
// GETs from 80 addresses, each under the per-address cap, held 19,999 of
// 20,000 and stopped every other listener and all outbound work) within
// which the heaviest address, then a connection the server has made no
// progress on (a slow-loris with one connection from each of as many
// addresses as the total), makes room for a new one, and an
// accept loop that backs off instead of spinning when the process is out
// of descriptors (EMFILE, ENFILE). The machine-facing and admin listeners
// (api), the join listener (join) and the controller's wiring use it.
// Imports only the standard library.
package connlimit

import (
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Config configures New. Every zero value is usable.
type Config struct {
	// Name names the listener in log lines ("machine", "admin", "join");
	// "" logs the listener's address.
	Name string
	// MaxPerIP caps the open connections of one source address; a further
	// one is closed at accept and counted (Stats.RefusedPerIP). Zero: no
	// cap per address.
	MaxPerIP int
	// MaxTotal caps the open connections of the listener (its descriptor
	// budget, see Budget). At the cap a new connection from an address
	// that holds at least two fewer than the address holding the most is
	// admitted by closing that address's oldest connection (Stats.Evicted:
	// under a flood from many addresses a machine with one connection is
	// still served). Failing that, the oldest connection the server has
	// made no progress on for StallAfter is closed to admit it
	// (Stats.EvictedStalled: a slow-loris from as many addresses as the
	// budget, one connection each, would otherwise lock every client
	// out); any other is closed at accept (Stats.RefusedBudget). Zero: no
	// total cap.
	MaxTotal int
	// StallAfter is how long a connection may go without server progress
	// (a Write or ReadFrom that sent bytes, e.g. a TLS ServerHello or a
	// response) before, at MaxTotal, it may be closed to admit a new one.
	// A connection inside a Write or ReadFrom (a long sendfile(2) of an
	// image to a slow reader) is never closed for this. A real client
	// sends its request headers or its TLS ClientHello within
	// milliseconds, so a connection silent for the server this long is a
	// slow request, an idle keep-alive, or an attack: under overload each
	// may be closed (nginx likewise closes keep-alive connections at its
	// worker_connections limit). Zero: 2 s; negative: never.
	StallAfter time.Duration
	// Refused, if not nil, is also incremented for every connection closed
	// at accept (either cap), for counters kept by the caller.
	Refused *atomic.Int64
	// Logger receives one Warn line when Accept starts backing off on
	// EMFILE or ENFILE and at most one a minute while it goes on, and one
	// when the listener first reaches MaxTotal and at most one a minute
	// while it stays there; nil discards.
	Logger *slog.Logger
}

// Stats is a snapshot of a Listener's counters.
type Stats struct {
	// Open is the number of connections accepted and not yet closed.
	Open int
	// MaxTotal is Config.MaxTotal (0: none).
	MaxTotal int
	// RefusedPerIP counts connections closed at accept because their
	// address had MaxPerIP open.
	RefusedPerIP int64
	// RefusedBudget counts connections closed at accept because the
	// listener had MaxTotal open, their address was not under its share
	// and no connection had stalled (see Config.MaxTotal).
	RefusedBudget int64
	// Evicted counts open connections closed to admit a new one at
	// MaxTotal, for either reason (see Config.MaxTotal): EvictedStalled of
	// them for making no server progress, the rest for their address
	// holding more.
	Evicted int64
	// EvictedStalled counts the connections of Evicted closed because the
	// server had made no progress on them for Config.StallAfter.
	EvictedStalled int64
	// AcceptErrors counts accept(2) failures Accept backed off from
	// (EMFILE, ENFILE, ENOBUFS, ENOMEM).
	AcceptErrors int64
}

// Listener is a net.Listener with the caps of its Config. Accept never
// returns an error for a refused connection or a temporary accept(2)
// failure. An accepted connection keeps the underlying one's ReadFrom (a
// *net.TCPConn's: sendfile(2) and splice(2), which net/http uses for file
// bodies only when the connection it serves has it) and CloseWrite
// (net/http's half-close before closing a connection with unread request
// body); closing it frees its slot once, however often Close is called.
// Safe for concurrent use.
type Listener struct {
	net.Listener
	cfg  Config
	log  *slog.Logger
	done chan struct{}
	stop sync.Once

	mu    sync.Mutex
	peers map[peer]*peerConns
	total int
	// byCount[n] holds the peers with n open connections (n >= 1), so that
	// the address holding the most is found without a scan of every peer.
	byCount []map[peer]struct{}
	maxN    int
	// oldest and newest end the list of every open connection in
	// admission order (countedConn.allPrev, allNext).
	oldest, newest *countedConn
	// now returns the time in unix nanoseconds (time.Now; tests set a
	// clock of their own before the first Accept).
	now func() int64

	refusedPerIP, refusedBudget, evicted, evictedStalled, acceptErrors atomic.Int64
	// lastFullLog and lastErrLog pace the Warn lines (unix nanoseconds).
	lastFullLog, lastErrLog atomic.Int64
}

// peerConns is the open connections of one address, oldest first.
type peerConns struct {
	n          int
	head, tail *countedConn
}

// New wraps ln with the caps of cfg.
func New(ln net.Listener, cfg Config) *Listener {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	name := cfg.Name
	if name == "" {
		name = ln.Addr().String()
	}
	if cfg.StallAfter == 0 {
		cfg.StallAfter = DefaultStallAfter
	}
	return &Listener{Listener: ln, cfg: cfg, log: cfg.Logger.With("listener", name), done: make(chan struct{}),
		peers: map[peer]*peerConns{}, byCount: []map[peer]struct{}{nil}, now: unixNano}
}

// DefaultStallAfter is Config.StallAfter when zero.
const DefaultStallAfter = 2 * time.Second

// maxStallScan bounds the connections admit looks at, oldest first, for
// one stalled: admission stays cheap under a flood of busy connections.
const maxStallScan = 256

func unixNano() int64 { return time.Now().UnixNano() }

// PerIP wraps ln with a cap of max open connections per source address
// and no total (New with Config.MaxPerIP); refused (nil: not counted) is
// incremented for each connection closed at accept.
func PerIP(ln net.Listener, max int, refused *atomic.Int64) net.Listener {
	return New(ln, Config{MaxPerIP: max, Refused: refused})
}

// Limits returns l itself: servers that wrap a listener they are given
// (api.Server.Serve) look for this method, also on a TLS listener built
// over l (see TLS), so as not to wrap it twice.
func (l *Listener) Limits() *Listener { return l }

// Stats returns the listener's counters.
func (l *Listener) Stats() Stats {
	l.mu.Lock()
	open := l.total
	l.mu.Unlock()
	return Stats{Open: open, MaxTotal: l.cfg.MaxTotal, RefusedPerIP: l.refusedPerIP.Load(), RefusedBudget: l.refusedBudget.Load(),
		Evicted: l.evicted.Load(), EvictedStalled: l.evictedStalled.Load(), AcceptErrors: l.acceptErrors.Load()}
}

// Close closes the underlying listener and ends a back-off wait in Accept.
func (l *Listener) Close() error {
	l.stop.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// peer is a connection's source: its IP address (IPv4-mapped IPv6
// unmapped), or for a peer that has none, its address string in other.
type peer struct {
	ip    netip.Addr
	other string
}

// peerOf is c's source: the netip.Addr of a *net.TCPAddr (no string built
// or parsed per connection: a boot storm opens a thousand at once), else
// the host of RemoteAddr().String().
func peerOf(c net.Conn) peer {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return peer{ip: ip.Unmap()}
		}
	}
	s := c.RemoteAddr().String()
	if host, _, err := net.SplitHostPort(s); err == nil {
		s = host
	}
	if ip, err := netip.ParseAddr(s); err == nil {
		return peer{ip: ip.Unmap()}
	}
	return peer{other: s}
}

// Backoff bounds of Accept after a temporary accept(2) failure: the first
// wait, doubled per failure in a row up to the last (net/http's Serve uses
// the same 5 ms to 1 s).
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// logEvery paces the Warn lines of a listener at its cap or backing off.
const logEvery = time.Minute

// temporary reports whether an accept(2) error is one to wait out: the
// process or the host is out of descriptors or memory for sockets.
func temporary(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// Accept returns the next connection within the caps. On EMFILE, ENFILE,
// ENOBUFS or ENOMEM it waits (5 ms doubling to 1 s) and tries again rather
// than returning the error, so that neither its caller nor net/http spins;
// the connection stays in the kernel's backlog meanwhile. Errors: those of
// the underlying Accept, e.g. net.ErrClosed after Close.
func (l *Listener) Accept() (net.Conn, error) {
	var backoff time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if !temporary(err) {
				return nil, err
			}
			n := l.acceptErrors.Add(1)
			if backoff == 0 {
				backoff = acceptBackoffMin
			} else if backoff *= 2; backoff > acceptBackoffMax {
				backoff = acceptBackoffMax
			}
			if pace(&l.lastErrLog) {
				l.log.Warn("accept failed: backing off", "err", err, "backoff", backoff, "accept_errors_total", n)
			}
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-l.done:
				t.Stop()
			}
			continue
		}
		backoff = 0
		if cc := l.admit(c); cc != nil {
			return cc, nil
		}
	}
}

// pace reports whether a paced log line is due (none within logEvery), and
// if so records now.
func pace(last *atomic.Int64) bool {
	now := time.Now().UnixNano()
	prev := last.Load()
	return (prev == 0 || now-prev >= int64(logEvery)) && last.CompareAndSwap(prev, now)
}

// admit counts c in, or closes it (refused) and returns nil.
func (l *Listener) admit(c net.Conn) *countedConn {
	p := peerOf(c)
	l.mu.Lock()
	pc := l.peers[p]
	have := 0
	if pc != nil {
		have = pc.n
	}
	var victim *countedConn
	stalled := false
	switch {
	case l.cfg.MaxPerIP > 0 && have >= l.cfg.MaxPerIP:
		l.mu.Unlock()
		l.refusedPerIP.Add(1)
		l.refuse(c)
		return nil
	case l.cfg.MaxTotal > 0 && l.total >= l.cfg.MaxTotal:
		if l.maxN >= have+2 {
			// The heaviest address holds two or more than c's: its
			// oldest connection makes room.
			for q := range l.byCount[l.maxN] {
				victim = l.peers[q].head
				break
			}
		} else if victim = l.stalled(); victim != nil {
			stalled = true
		} else {
			l.mu.Unlock()
			n := l.refusedBudget.Add(1)
			if pace(&l.lastFullLog) {
				l.log.Warn("listener at its connection budget: refusing connections", "max_total", l.cfg.MaxTotal, "refused_budget_total", n)
			}
			l.refuse(c)
			return nil
		}
		l.remove(victim)
	}
	cc := &countedConn{Conn: c, l: l, p: p}
	cc.progress.Store(l.now())
	l.add(cc)
	l.mu.Unlock()
	if victim != nil {
		l.evicted.Add(1)
		if stalled {
			l.evictedStalled.Add(1)
		}
		_ = victim.Conn.Close()
	}
	return cc
}

// stalled returns the oldest admitted connection, among the first
// maxStallScan, that is not inside a Write or ReadFrom and has had no
// server progress for Config.StallAfter; nil if none (or StallAfter < 0).
// l.mu held.
func (l *Listener) stalled() *countedConn {
	if l.cfg.StallAfter < 0 {
		return nil
	}
	before := l.now() - int64(l.cfg.StallAfter)
	n := 0
	for c := l.oldest; c != nil && n < maxStallScan; c, n = c.allNext, n+1 {
		if c.busy.Load() == 0 && c.progress.Load() <= before {
			return c
		}
	}
	return nil
}

// refuse closes a connection refused at accept.
func (l *Listener) refuse(c net.Conn) {
	if l.cfg.Refused != nil {
		l.cfg.Refused.Add(1)
	}
	_ = c.Close()
}

// setCount moves p from bucket from to bucket to (0: none). l.mu held.
func (l *Listener) setCount(p peer, from, to int) {
	if from > 0 {
		delete(l.byCount[from], p)
	}
	if to > 0 {
		for len(l.byCount) <= to {
			l.byCount = append(l.byCount, nil)
		}
		if l.byCount[to] == nil {
			l.byCount[to] = map[peer]struct{}{}
		}
		l.byCount[to][p] = struct{}{}
		if to > l.maxN {
			l.maxN = to
		}
	}
	for l.maxN > 0 && len(l.byCount[l.maxN]) == 0 {
		l.maxN--
	}
}

// add counts c in as its peer's newest connection. l.mu held.
func (l *Listener) add(c *countedConn) {
	pc := l.peers[c.p]
	if pc == nil {
		pc = &peerConns{}
		l.peers[c.p] = pc
	}
	c.prev, c.next = pc.tail, nil
	if pc.tail != nil {
		pc.tail.next = c
	} else {
		pc.head = c
	}
	pc.tail = c
	c.allPrev, c.allNext = l.newest, nil
	if l.newest != nil {
		l.newest.allNext = c
	} else {
		l.oldest = c
	}
	l.newest = c
	pc.n++
	l.total++
	l.setCount(c.p, pc.n-1, pc.n)
}

// remove counts c out, once: false if it already was. l.mu held.
func (l *Listener) remove(c *countedConn) bool {
	if c.released {
		return false
	}
	c.released = true
	pc := l.peers[c.p]
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		pc.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else {
		pc.tail = c.prev
	}
	c.prev, c.next = nil, nil
	if c.allPrev != nil {
		c.allPrev.allNext = c.allNext
	} else {
		l.oldest = c.allNext
	}
	if c.allNext != nil {
		c.allNext.allPrev = c.allPrev
	} else {
		l.newest = c.allPrev
	}
	c.allPrev, c.allNext = nil, nil
	pc.n--
	l.total--
	l.setCount(c.p, pc.n+1, pc.n)
	if pc.n == 0 {
		delete(l.peers, c.p)
	}
	return true
}

// countedConn is an accepted connection holding a slot of its listener.
// Its Write and ReadFrom record the server's progress on it (see
// Config.StallAfter); under a TLS listener (TLS) the handshake's writes
// (ServerHello, certificate) go through Write and count too, a
// ClientHello that never completes does not.
type countedConn struct {
	net.Conn
	l                *Listener
	p                peer
	prev, next       *countedConn // the peer's connections, oldest first; l.mu
	allPrev, allNext *countedConn // every connection, oldest first; l.mu
	released         bool         // l.mu
	// progress is when a Write or ReadFrom last sent bytes, or the
	// connection was admitted (unix nanoseconds, Listener.now); busy
	// counts the Writes and ReadFroms in progress.
	progress atomic.Int64
	busy     atomic.Int32
}

// Write is the underlying connection's, recording the server's progress:
// while it runs the connection is busy (never closed as stalled), and
// once it has sent bytes its progress time is now.
func (c *countedConn) Write(b []byte) (int, error) {
	c.busy.Add(1)
	n, err := c.Conn.Write(b)
	c.done(n > 0)
	return n, err
}

// done ends a Write or ReadFrom, recording progress if it sent bytes.
func (c *countedConn) done(sent bool) {
	if sent {
		c.progress.Store(c.l.now())
	}
	c.busy.Add(-1)
}

func (c *countedConn) Close() error {
	c.l.mu.Lock()
	c.l.remove(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// ReadFrom is the underlying connection's, so that http.ServeContent of an
// *os.File goes out with sendfile(2): without it net/http copies every
// file through a 32 KiB user-space buffer (a boot storm's ramdisk step
// spent 80 % of the server's CPU in that read and write).
//
// Like Write it records progress, and the connection is busy while it
// runs (a ramdisk's sendfile to a slow machine is never closed as
// stalled).
func (c *countedConn) ReadFrom(r io.Reader) (n int64, err error) {
	c.busy.Add(1)
	defer func() { c.done(n > 0) }()
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(c.Conn, r)
}

// CloseWrite half-closes the underlying connection (a *net.TCPConn's
// CloseWrite); errors.ErrUnsupported when it has none.
func (c *countedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// TLS returns tls.NewListener(l, cfg) with l's Limits method, so that a
// server given it does not wrap it again. l counts the TCP connections, so
// a refused one is closed before any handshake.
func TLS(l *Listener, cfg *tls.Config) net.Listener {
	return tlsListener{Listener: tls.NewListener(l, cfg), l: l}
}

type tlsListener struct {
	net.Listener
	l *Listener
}

// Limits returns the Listener under the TLS layer.
func (t tlsListener) Limits() *Listener { return t.l }
