package peertest

import (
	"net"
	"sync"
	"testing"
)

// ClosedPort returns a loopback address ("127.0.0.1:PORT") that refuses
// connections: a port listened on and closed again, so a dial to it fails
// at once with "connection refused" (a machine that is off, a service not
// started). Another process may take the port later; tests use it at once.
func ClosedPort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// SilentListener returns a loopback address that accepts TCP connections
// and never answers (a BMC or peer whose service hangs after the
// handshake), and a func returning how many connections it accepted so
// far. The listener and every accepted connection are closed at the
// test's end.
func SilentListener(t testing.TB) (addr string, accepted func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String(), func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(conns)
	}
}
