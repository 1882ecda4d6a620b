package connlimit

import (
	"net"
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
