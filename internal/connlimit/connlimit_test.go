package connlimit

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestPerIP: the third connection from one address is closed at accept and
// counted; closing one frees its slot for the next.
func TestPerIP(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var refused atomic.Int64
	ln := PerIP(raw, 2, &refused)
	defer ln.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := dial(), dial()
	defer a.Close()
	defer b.Close()
	first := <-accepted
	<-accepted
	c := dial()
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("third connection was not closed")
	}
	if refused.Load() != 1 {
		t.Fatalf("refused = %d, want 1", refused.Load())
	}
	first.Close()
	first.Close() // twice: one slot freed, not two
	d := dial()
	defer d.Close()
	select {
	case <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("a freed slot was not reused")
	}
	e := dial()
	defer e.Close()
	e.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := e.Read(make([]byte, 1)); err == nil || refused.Load() != 2 {
		t.Fatalf("after a double Close the cap is %v/%d: a slot was freed twice", err, refused.Load())
	}
}

// TestPerIPKeepsReadFrom: an accepted connection offers the TCP
// connection's ReadFrom (net/http sends file bodies with sendfile(2) only
// through it) and CloseWrite, and both work. Fails without them: the
// wrapper hid them (every ramdisk byte was copied through user
// space).
func TestPerIPKeepsReadFrom(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := PerIP(raw, 4, nil)
	defer ln.Close()
	body := strings.Repeat("ramdisk ", 64<<10) // 512 KiB
	path := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		rf, ok := c.(io.ReaderFrom)
		cw, ok2 := c.(interface{ CloseWrite() error })
		if !ok || !ok2 {
			served <- fmt.Errorf("accepted %T: ReadFrom %v, CloseWrite %v", c, ok, ok2)
			return
		}
		f, err := os.Open(path)
		if err != nil {
			served <- err
			return
		}
		defer f.Close()
		if _, err := rf.ReadFrom(f); err != nil {
			served <- err
			return
		}
		served <- cw.CloseWrite()
	}()
	c, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c) // ends at the server's CloseWrite
	if err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	if string(got) != body {
		t.Fatalf("read %d bytes, want %d", len(got), len(body))
	}
}

// addrConn is a net.Conn whose only use here is its RemoteAddr.
type addrConn struct {
	net.Conn
	remote net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.remote }

// TestPeerKey: a TCP peer is keyed by its address, the same for its 4-byte
// and IPv4-mapped 16-byte forms and for every port; a peer of another
// network by the host of its string form.
func TestPeerKey(t *testing.T) {
	v4 := peerOf(addrConn{remote: &net.TCPAddr{IP: net.IPv4(10, 66, 1, 7).To4(), Port: 1}})
	mapped := peerOf(addrConn{remote: &net.TCPAddr{IP: net.IPv4(10, 66, 1, 7), Port: 2}})
	if v4 != mapped || v4.ip.String() != "10.66.1.7" || v4.other != "" {
		t.Errorf("TCP 10.66.1.7: keys %+v and %+v, want both 10.66.1.7", v4, mapped)
	}
	if v6 := peerOf(addrConn{remote: &net.TCPAddr{IP: net.ParseIP("fd00::1"), Port: 3}}); v6 != (peer{ip: netip.MustParseAddr("fd00::1")}) {
		t.Errorf("TCP [fd00::1]:3: key %+v", v6)
	}
	if u := peerOf(addrConn{remote: &net.UnixAddr{Name: "/run/x.sock", Net: "unix"}}); u != (peer{other: "/run/x.sock"}) {
		t.Errorf("unix /run/x.sock: key %+v, want the name", u)
	}
}
