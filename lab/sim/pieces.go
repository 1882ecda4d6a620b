package sim

import (
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/machina-metal/machina/ramdisk/agent"
)

// SharePieces turns the machine's ramdisk piece sharing on or off for its
// next deploys: the agent serves the verified pieces of the image it
// deploys to its wave on a loopback listener of its own (agent.PeerServer,
// announced with the plan request) and fetches pieces from the peers the
// plan names before the controller, as a ramdisk on a real provisioning
// network does. The listener closes when the deploy ends (the ramdisk
// reboots into the written OS).
func (m *Machine) SharePieces(on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sharePieces = on
}

// ServeBadPieces makes the machine's piece listener flip the first byte of
// every piece it serves (or stop doing so): a peer whose RAM flips a bit in
// the pieces it holds, or a hostile machine in the wave. Its own deploy is
// not affected.
func (m *Machine) ServeBadPieces(bad bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.badPieces = bad
}

// ImageBytesFromController returns how many bytes of the controller's
// image responses (/images/...) the lab's ramdisks have read: the
// controller's image egress as the provisioning network sees it.
func (l *Lab) ImageBytesFromController() int64 { return l.imageBytes.Load() }

// withPieces counts the deploy's image bytes from the controller and,
// with SharePieces on, serves r's pieces on a new loopback listener; the
// returned func closes it.
func (m *Machine) withPieces(r *agent.Runner) (stop func()) {
	c := *r.Client.HTTP
	base := c.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	c.Transport = countImagesTransport{base: base, m: m}
	r.Client.HTTP = &c
	m.mu.Lock()
	share := m.sharePieces
	m.mu.Unlock()
	if !share {
		return func() {}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		m.log.Warn("piece listener; deploying without sharing", "err", err)
		return func() {}
	}
	ps := &agent.PeerServer{}
	srv := &http.Server{Handler: badPieces{m: m, next: ps}, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	r.Pieces, r.PiecePort = ps, ln.Addr().(*net.TCPAddr).Port
	return func() {
		srv.Close()
		<-done
	}
}

// countImagesTransport adds the body bytes of image responses read through
// it to the lab's count.
type countImagesTransport struct {
	base http.RoundTripper
	m    *Machine
}

func (t countImagesTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(r)
	if err == nil && strings.HasPrefix(r.URL.Path, "/images/") {
		resp.Body = &countBody{ReadCloser: resp.Body, l: t.m.lab}
	}
	return resp, err
}

type countBody struct {
	io.ReadCloser
	l *Lab
}

func (b *countBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.l.imageBytes.Add(int64(n))
	return n, err
}

// badPieces serves next, flipping the first byte of each response body
// while the machine's ServeBadPieces is on.
type badPieces struct {
	m    *Machine
	next http.Handler
}

func (b badPieces) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.m.mu.Lock()
	bad := b.m.badPieces
	b.m.mu.Unlock()
	if bad {
		w = &flipWriter{ResponseWriter: w}
	}
	b.next.ServeHTTP(w, r)
}

type flipWriter struct {
	http.ResponseWriter
	flipped bool
}

func (f *flipWriter) Write(p []byte) (int, error) {
	if !f.flipped && len(p) > 0 {
		q := append([]byte(nil), p...)
		q[0] ^= 0xff
		f.flipped = true
		return f.ResponseWriter.Write(q)
	}
	return f.ResponseWriter.Write(p)
}
