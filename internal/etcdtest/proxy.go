package etcdtest

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
)

// Proxy is a TCP proxy on loopback in front of one etcd member, to cut a
// client off etcd (a partition) in election, fencing and failover tests: Partition closes every open connection and leaves new
// ones accepted but silent (a black hole, as a partition looks to TCP),
// Heal forwards again.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]bool
}

// NewProxy starts a proxy to the member at clientURL (http://host:port),
// closed with the test.
func NewProxy(t testing.TB, clientURL string) *Proxy {
	t.Helper()
	u, err := url.Parse(clientURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: u.Host, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { _ = ln.Close(); p.closeAll() })
	go p.serve()
	return p
}

// URL is the proxy's client URL.
func (p *Proxy) URL() string { return "http://" + p.ln.Addr().String() }

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns[c] = true
	return !p.cut
}

func (p *Proxy) forget(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			continue // black hole: accepted, never answered, closed on Heal
		}
		go func() {
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				p.forget(c)
				return
			}
			if !p.track(up) {
				p.forget(up)
				p.forget(c)
				return
			}
			go func() { _, _ = io.Copy(up, c); p.forget(up); p.forget(c) }()
			_, _ = io.Copy(c, up)
			p.forget(up)
			p.forget(c)
		}()
	}
}

func (p *Proxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// Partition cuts every connection and black-holes new ones.
func (p *Proxy) Partition() {
	p.mu.Lock()
	p.cut = true
	p.mu.Unlock()
	p.closeAll()
}

// Heal closes the black-holed connections and forwards new ones again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
	p.closeAll()
}
