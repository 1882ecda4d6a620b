package join_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"net"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
)

// TestJoinListenerConnCapPerSource: the join listener holds at most 64
// connections per source address (slow clients on an
// unauthenticated route held every descriptor). 64 idle connections from
// 127.0.0.2 get the 65th closed at accept, while a join from 127.0.0.3
// succeeds; once they close, 127.0.0.2 is served again.
func TestJoinListenerConnCapPerSource(t *testing.T) {
	f := startListener(t, "")
	addr := f.url[len("https://"):]
	dial := func(src string) net.Conn {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	var held []net.Conn
	for range 64 {
		held = append(held, dial("127.0.0.2"))
	}
	// The server has accepted them once a further connection's fate is
	// decided; the 65th is closed by the server without a byte.
	extra := dial("127.0.0.2")
	_ = extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := extra.Read(make([]byte, 1)); err == nil || n != 0 {
		t.Fatalf("65th connection from 127.0.0.2: read %d, %v; want it closed", n, err)
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("65th connection from 127.0.0.2 still open after 5 s (no per-address cap)")
	}
	extra.Close()
	if got := f.srv.ConnsRefused(); got < 1 {
		t.Errorf("ConnsRefused = %d, want at least 1 (the 65th)", got)
	}

	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tok := f.token(t, v1.EnrolmentRequest{})
	if code, e := postJoinFrom(t, f, "127.0.0.3", v1.JoinRequest{Token: tok.Token, CSR: csrPEM(t, key), Facts: facts("r1")}); code != 200 {
		t.Fatalf("join from 127.0.0.3 while 127.0.0.2 is at its cap = %d %+v, want 200", code, e)
	}
	for _, c := range held {
		c.Close()
	}
	tok2 := f.token(t, v1.EnrolmentRequest{})
	deadline := time.Now().Add(5 * time.Second)
	for {
		// Until the server has seen the 64 closes, a connection from
		// 127.0.0.2 may still be closed at accept (a transport error).
		code, e, err := tryJoinFrom(f, "127.0.0.2", v1.JoinRequest{Token: tok2.Token, CSR: csrPEM(t, key), Facts: facts("r2")})
		if err == nil && code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("join from 127.0.0.2 after its connections closed = %d %+v %v, want 200", code, e, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
