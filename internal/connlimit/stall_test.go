package connlimit

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// stallLab is a listener at a budget of 3 with StallAfter 100 ms on a
// clock the test moves, and a dialer from any 127.0.0.x address.
type stallLab struct {
	t        *testing.T
	raw      net.Listener
	ln       *Listener
	clock    atomic.Int64
	accepted chan net.Conn
}

func newStallLab(t *testing.T) *stallLab { return newStallLabTLS(t, nil) }

// newStallLabTLS is newStallLab with the accepts through TLS(ln, cfg)
// when cfg is not nil.
func newStallLabTLS(t *testing.T, cfg *tls.Config) *stallLab {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &stallLab{t: t, raw: raw}
	s.ln = New(raw, Config{MaxPerIP: 10, MaxTotal: 3, StallAfter: 100 * time.Millisecond})
	s.clock.Store(time.Now().UnixNano())
	s.ln.now = s.clock.Load // before the first Accept
	t.Cleanup(func() { s.ln.Close() })
	if cfg == nil {
		s.accepted = serveAccepts(s.ln)
	} else {
		s.accepted = serveAccepts(TLS(s.ln, cfg))
	}
	return s
}

// advance moves the listener's clock by d.
func (s *stallLab) advance(d time.Duration) { s.clock.Add(int64(d)) }

// dial connects from src; its server side is returned when accepted,
// nil when the listener closed it at accept.
func (s *stallLab) dial(src string) (client, server net.Conn) {
	s.t.Helper()
	// Accepted, or closed at accept: the refusal counters grow (read
	// before the dial: the refusal may come before Dial returns).
	st := s.ln.Stats()
	refused := st.RefusedBudget + st.RefusedPerIP
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", s.raw.Addr().String())
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { c.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case sc := <-s.accepted:
			s.t.Cleanup(func() { sc.Close() })
			return c, sc
		case <-time.After(time.Millisecond):
		}
		if st := s.ln.Stats(); st.RefusedBudget+st.RefusedPerIP > refused {
			return c, nil
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("connection from %s neither accepted nor refused", src)
		}
	}
}

// TestEvictsStalledAtBudget: at the budget with every address holding
// one connection the server has not written to for StallAfter (a
// slow-loris from as many addresses as the budget), a new address's
// connection is admitted and the oldest stalled one closed. Failed before
// stall eviction: the newcomer was refused (no address held two more).
func TestEvictsStalledAtBudget(t *testing.T) {
	s := newStallLab(t)
	first, _ := s.dial("127.0.0.1")
	s.dial("127.0.0.2")
	s.dial("127.0.0.3")
	s.advance(time.Second)
	if _, sc := s.dial("127.0.0.4"); sc == nil {
		t.Fatalf("at the budget with every connection stalled, a new address was refused (stats %+v)", s.ln.Stats())
	}
	if !closedByServer(first) {
		t.Fatal("the oldest stalled connection was not closed")
	}
	if st := s.ln.Stats(); st.Evicted != 1 || st.EvictedStalled != 1 || st.Open != 3 || st.RefusedBudget != 0 {
		t.Fatalf("stats %+v, want 1 evicted (stalled), 3 open, none refused", st)
	}
}

// TestStallEvictionSparesWriters: a connection inside a Write the peer
// does not read, or inside a ReadFrom (sendfile of an image to a slow
// machine), is never closed as stalled however long ago it last sent;
// a connection written to within StallAfter is not either, and with no
// other the newcomer is refused as before.
func TestStallEvictionSparesWriters(t *testing.T) {
	s := newStallLab(t)
	_, writer := s.dial("127.0.0.1")
	_, sender := s.dial("127.0.0.2")
	idleClient, _ := s.dial("127.0.0.3")
	// .1: a Write of 64 MiB to a client that reads nothing blocks.
	wdone := make(chan struct{})
	go func() { defer close(wdone); writer.Write(make([]byte, 64<<20)) }()
	// .2: a ReadFrom of a source that never ends.
	pr, pw := io.Pipe()
	defer pw.Close()
	rdone := make(chan struct{})
	go func() { defer close(rdone); sender.(io.ReaderFrom).ReadFrom(pr) }()
	deadline := time.Now().Add(10 * time.Second)
	for writer.(*countedConn).busy.Load() == 0 || sender.(*countedConn).busy.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the Write and ReadFrom did not start")
		}
		time.Sleep(time.Millisecond)
	}
	s.advance(time.Second)
	// Only .3 is stalled: it makes room.
	if _, sc := s.dial("127.0.0.4"); sc == nil {
		t.Fatalf("a new address was refused with an idle connection open (stats %+v)", s.ln.Stats())
	}
	if !closedByServer(idleClient) {
		t.Fatal("the idle connection was not the one closed")
	}
	// .4 was just admitted, .1 and .2 are busy: refused.
	if _, sc := s.dial("127.0.0.5"); sc != nil {
		t.Fatal("a connection inside a Write or ReadFrom, or one just admitted, was closed as stalled")
	}
	if st := s.ln.Stats(); st.EvictedStalled != 1 || st.RefusedBudget != 1 || st.Open != 3 {
		t.Fatalf("stats %+v, want 1 evicted as stalled, 1 refused, 3 open", st)
	}
	select {
	case <-wdone:
		t.Fatal("the blocked Write ended: its connection was closed")
	case <-rdone:
		t.Fatal("the ReadFrom ended: its connection was closed")
	default:
	}
}

// TestStallEvictionSparesRecentWriters: connections the server wrote to
// within StallAfter are not closed; the newcomer is refused as before.
func TestStallEvictionSparesRecentWriters(t *testing.T) {
	s := newStallLab(t)
	var clients, servers []net.Conn
	for _, src := range []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"} {
		c, sc := s.dial(src)
		clients, servers = append(clients, c), append(servers, sc)
	}
	s.advance(time.Second)
	for _, sc := range servers {
		if _, err := sc.Write([]byte("HTTP/1.1 200 OK\r\n")); err != nil {
			t.Fatal(err)
		}
	}
	s.advance(50 * time.Millisecond) // written 50 ms ago, under StallAfter
	if _, sc := s.dial("127.0.0.4"); sc != nil {
		t.Fatalf("a connection written to within StallAfter was closed (stats %+v)", s.ln.Stats())
	}
	if st := s.ln.Stats(); st.Evicted != 0 || st.RefusedBudget != 1 || st.Open != 3 {
		t.Fatalf("stats %+v, want none evicted, 1 refused, 3 open", st)
	}
	for _, c := range clients {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != nil {
			t.Fatalf("a recently written connection was closed: %v", err)
		}
	}
}

// selfSigned is a TLS server configuration with a fresh self-signed
// ECDSA P-256 certificate.
func selfSigned(t *testing.T) *tls.Config {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "connlimit test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
}

// TestStallEvictionTLSHandshakeIsProgress: under a TLS listener (the
// admin and join listeners) a completed handshake counts as server
// progress (its ServerHello goes through the counted connection's Write),
// a ClientHello that never completes does not: at the budget the
// handshake-less connection is closed, not the older ones that completed
// theirs.
func TestStallEvictionTLSHandshakeIsProgress(t *testing.T) {
	s := newStallLabTLS(t, selfSigned(t))
	handshake := func(c, sc net.Conn) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- sc.(*tls.Conn).Handshake() }()
		tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true})
		tc.SetDeadline(time.Now().Add(10 * time.Second))
		if err := tc.Handshake(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	c1, sc1 := s.dial("127.0.0.1") // the oldest: its handshake comes late
	s.advance(time.Second)
	loris, _ := s.dial("127.0.0.2") // never sends its ClientHello
	s.advance(time.Second)
	handshake(c1, sc1)
	c3, sc3 := s.dial("127.0.0.3")
	handshake(c3, sc3)
	s.advance(50 * time.Millisecond)
	if _, sc := s.dial("127.0.0.4"); sc == nil {
		t.Fatalf("a new address was refused with a handshake-less connection open (stats %+v)", s.ln.Stats())
	}
	if !closedByServer(loris) {
		t.Fatal("the connection that never sent its ClientHello was not the one closed")
	}
	if st := s.ln.Stats(); st.EvictedStalled != 1 || st.Open != 3 {
		t.Fatalf("stats %+v, want 1 evicted as stalled, 3 open", st)
	}
}
