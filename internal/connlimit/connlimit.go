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
	return &perIPListener{Listener: ln, max: max, open: map[netip.Addr]int{}, other: map[string]int{}, refused: refused}
}

type perIPListener struct {
	net.Listener
	max     int
	mu      sync.Mutex
	open    map[netip.Addr]int // TCP (and UDP) peers, by address (IPv4-mapped IPv6 unmapped)
	other   map[string]int     // peers of other networks, by RemoteAddr().String()
	refused *atomic.Int64
}

// peerKey is c's source address: the netip.Addr of a *net.TCPAddr (no
// string built or parsed per connection: a boot storm opens a thousand at
// once, issue 24), else the host of RemoteAddr().String().
func peerKey(c net.Conn) (netip.Addr, string) {
	switch a := c.RemoteAddr().(type) {
	case *net.TCPAddr:
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return ip.Unmap(), ""
		}
	case *net.UDPAddr:
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return ip.Unmap(), ""
		}
	}
	s := c.RemoteAddr().String()
	if host, _, err := net.SplitHostPort(s); err == nil {
		s = host
	}
	if ip, err := netip.ParseAddr(s); err == nil {
		return ip.Unmap(), ""
	}
	return netip.Addr{}, s
}

func (l *perIPListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip, other := peerKey(c)
		l.mu.Lock()
		n := l.open[ip]
		if other != "" {
			n = l.other[other]
		}
		if n >= l.max {
			l.mu.Unlock()
			l.refused.Add(1)
			_ = c.Close()
			continue
		}
		if other != "" {
			l.other[other]++
		} else {
			l.open[ip]++
		}
		l.mu.Unlock()
		return &countedConn{Conn: c, l: l, ip: ip, other: other}, nil
	}
}

// release frees one slot of ip (or other).
func (l *perIPListener) release(ip netip.Addr, other string) {
	l.mu.Lock()
	if other != "" {
		if l.other[other]--; l.other[other] <= 0 {
			delete(l.other, other)
		}
	} else if l.open[ip]--; l.open[ip] <= 0 {
		delete(l.open, ip)
	}
	l.mu.Unlock()
}

type countedConn struct {
	net.Conn
	l        *perIPListener
	ip       netip.Addr
	other    string
	released atomic.Bool
}

func (c *countedConn) Close() error {
	if c.released.CompareAndSwap(false, true) {
		c.l.release(c.ip, c.other)
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
