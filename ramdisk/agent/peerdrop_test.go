package agent

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/internal/peertest"
)

// dialCounter is an HTTP client that counts its connection attempts by
// address.
type dialCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (d *dialCounter) client() *http.Client {
	var nd net.Dialer
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		d.mu.Lock()
		if d.n == nil {
			d.n = map[string]int{}
		}
		d.n[addr]++
		d.mu.Unlock()
		return nd.DialContext(ctx, network, addr)
	}}}
}

func (d *dialCounter) count(addr string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n[addr]
}

// TestUnreachablePeersAskedOnce: of a wave's two peers, one refuses
// connections (nothing listens on its port) and one accepts and never
// answers. Each is asked once, for the first piece, and dropped for the
// deploy (unreachable, stalled); every piece comes from the controller,
// and Stats names both with their reasons. Before, the refusing peer was
// connected to again for every piece.
func TestUnreachablePeersAskedOnce(t *testing.T) {
	img, m := pieceImage(t, 4*v1.PieceBytes)
	origin := newImageOrigin(t, img, "img-tok")
	refused := peertest.ClosedPort(t)
	silent, accepted := peertest.SilentListener(t)
	var dials dialCounter
	mb := newMember(t, m, origin.URL, "img-tok", "wave-tok")
	mb.f.Peers = []string{"http://" + refused, "http://" + silent}
	mb.f.HTTP, mb.f.StallTimeout = dials.client(), testStall
	res, got, err := writeWithin(t, mb, m)
	if err != nil || res.ReadBackSHA256 != m.SHA256 || !bytes.Equal(got, img) {
		t.Fatalf("WriteImage() = %+v, %v; disk matches image: %v", res, err, bytes.Equal(got, img))
	}
	if n := dials.count(refused); n != 1 {
		t.Errorf("refusing peer connected to %d times, want 1 (then dropped)", n)
	}
	if n := accepted(); n != 1 {
		t.Errorf("silent peer got %d connections, want 1 (then dropped)", n)
	}
	st := mb.f.Stats()
	if st.ControllerBytes != int64(len(img)) || st.PeerBytes != 0 || len(st.BadPeers) != 0 {
		t.Errorf("stats = %+v, want every piece from the controller", st)
	}
	want := map[string]string{"http://" + refused: v1.PeerUnreachable, "http://" + silent: v1.PeerStalled}
	if len(st.DroppedPeers) != 2 {
		t.Fatalf("dropped peers %+v, want the two", st.DroppedPeers)
	}
	for _, d := range st.DroppedPeers {
		if want[d.Peer] != d.Reason {
			t.Errorf("dropped peer %+v, want reason %q", d, want[d.Peer])
		}
	}
}

// TestConnectFailed: a failure to connect (refused; an OpError of the
// dial, as a connect timeout or no route is) is unreachable; a stall, a
// reset of a made connection or an HTTP refusal is not.
func TestConnectFailed(t *testing.T) {
	c := &http.Client{}
	_, err := c.Get("http://" + peertest.ClosedPort(t) + "/")
	if !connectFailed(err) {
		t.Errorf("connectFailed(%v) = false, want true", err)
	}
	for _, err := range []error{errStalled, &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}, &v1.AgentStatusError{Code: 404}} {
		if connectFailed(err) {
			t.Errorf("connectFailed(%v) = true", err)
		}
	}
}
