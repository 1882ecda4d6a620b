// Package connlimit caps the open connections per source address of a
// listener, so one address cannot hold every file descriptor of a host
// (issue 23: slow request bodies on an unauthenticated route held 20,000
// of 20,000). The admin/machine listener (api) and the join listener
// (join) use it. Imports only the standard library.
package connlimit

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// PerIP wraps ln: a connection from an address that already has max open
// is closed at once and counted in refused (nil: not counted); Accept
// never fails for it. Closing an accepted connection frees its slot
// (once, however often Close is called). An accepted connection keeps the
// underlying one's ReadFrom (a *net.TCPConn's: sendfile(2) and splice(2),
// which net/http uses for file bodies only when the connection it serves
// has it) and CloseWrite (net/http's half-close before closing a
// connection with unread request body). Safe for concurrent use.
func PerIP(ln net.Listener, max int, refused *atomic.Int64) net.Listener {
	if refused == nil {
		refused = new(atomic.Int64)
	}
	return &perIPListener{Listener: ln, max: max, open: map[peer]int{}, refused: refused}
}

type perIPListener struct {
	net.Listener
	max     int
	mu      sync.Mutex
	open    map[peer]int
	refused *atomic.Int64
}

// peer is a connection's source: its IP address (IPv4-mapped IPv6
// unmapped), or for a peer that has none, its address string in other.
type peer struct {
	ip    netip.Addr
	other string
}

// peerOf is c's source: the netip.Addr of a *net.TCPAddr (no string built
// or parsed per connection: a boot storm opens a thousand at once, issue
// 24), else the host of RemoteAddr().String().
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

func (l *perIPListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		p := peerOf(c)
		l.mu.Lock()
		if l.open[p] >= l.max {
			l.mu.Unlock()
			l.refused.Add(1)
			_ = c.Close()
			continue
		}
		l.open[p]++
		l.mu.Unlock()
		return &countedConn{Conn: c, l: l, p: p}, nil
	}
}

// release frees one slot of p.
func (l *perIPListener) release(p peer) {
	l.mu.Lock()
	if l.open[p]--; l.open[p] <= 0 {
		delete(l.open, p)
	}
	l.mu.Unlock()
}

type countedConn struct {
	net.Conn
	l        *perIPListener
	p        peer
	released atomic.Bool
}

func (c *countedConn) Close() error {
	if c.released.CompareAndSwap(false, true) {
		c.l.release(c.p)
	}
	return c.Conn.Close()
}

// ReadFrom is the underlying connection's, so that http.ServeContent of an
// *os.File goes out with sendfile(2): without it net/http copies every
// file through a 32 KiB user-space buffer (issue 24: the ramdisk step of
// a boot storm spent 80 % of the server's CPU in that read and write).
func (c *countedConn) ReadFrom(r io.Reader) (int64, error) {
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
