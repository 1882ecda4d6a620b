package api

import (
	"net"
	"sync"
	"sync/atomic"
)

// DefaultMaxConnsPerIP is the open-connection cap per source address of
// Serve's listener when Config.MaxConnsPerIP is zero: far above what one
// machine, operator or browser opens, far below the descriptors a host
// has, so one address cannot hold them all (slow bodies on an
// unauthenticated route held 20,000 of 20,000).
const DefaultMaxConnsPerIP = 256

// perIPListener closes, at once, connections from an address that already
// has max open, and counts them; Accept never fails for it.
type perIPListener struct {
	net.Listener
	max     int
	mu      sync.Mutex
	open    map[string]int
	refused *atomic.Int64
}

// limitPerIP wraps ln; refused (nil: not counted) counts the connections
// closed at accept.
func limitPerIP(ln net.Listener, max int, refused *atomic.Int64) *perIPListener {
	if refused == nil {
		refused = new(atomic.Int64)
	}
	return &perIPListener{Listener: ln, max: max, open: map[string]int{}, refused: refused}
}

func (l *perIPListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip, _, err := net.SplitHostPort(c.RemoteAddr().String())
		if err != nil {
			ip = c.RemoteAddr().String()
		}
		l.mu.Lock()
		if l.open[ip] >= l.max {
			l.mu.Unlock()
			l.refused.Add(1)
			_ = c.Close()
			continue
		}
		l.open[ip]++
		l.mu.Unlock()
		return &countedConn{Conn: c, release: func() {
			l.mu.Lock()
			if l.open[ip]--; l.open[ip] <= 0 {
				delete(l.open, ip)
			}
			l.mu.Unlock()
		}}, nil
	}
}

type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *countedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
