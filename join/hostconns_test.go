package join_test

import (
	"fmt"
	"net/netip"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/join/node"
)

// TestJoinedHostsHeartbeatWithinConnCap: the join listener caps the
// connections of one source address (64); a joined host's join and steps
// must not keep connections open once done, and a host joining from its
// own address heartbeats from it. The simulated lab once ran every host
// from 127.0.0.1 and left each join's and each step client's keep-alive
// connection open for the listener's idle timeout: at 30 joined hosts
// (three connections each) heartbeats were closed at accept and the
// controller marked healthy hosts lost. Here 40 hosts join, report a step
// and done, and heartbeat from one address (40 heartbeat connections, 120
// had join and steps kept theirs), and 70 more join and heartbeat each from
// its own address (more than 64 in all): no connection is refused and
// every heartbeat lands.
func TestJoinedHostsHeartbeatWithinConnCap(t *testing.T) {
	f := startListener(t, "")
	var agents []*node.Client
	joinHost := func(name string, src netip.Addr) {
		t.Helper()
		tok := f.token(t, v1.EnrolmentRequest{})
		dir := t.TempDir()
		if _, err := node.Join(t.Context(), node.JoinConfig{URL: tok.JoinURL, Fingerprint: tok.CAFingerprint, Token: tok.Token, Dir: dir,
			Facts: facts(name), LocalAddr: src}); err != nil {
			t.Fatalf("Join %s from %s: %v", name, src, err)
		}
		c, err := node.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		c.SetLocalAddr(src)
		if err := c.Step(t.Context(), v1.JoinStep{Step: "pool default", OK: true}); err != nil {
			t.Fatalf("%s: step: %v", name, err)
		}
		if err := c.Done(t.Context(), v1.JoinDone{OK: true}); err != nil {
			t.Fatalf("%s: done: %v", name, err)
		}
		c.CloseIdleConnections() // the join command ends
		a, err := node.Load(dir) // the agent: a process of its own, keeping its connection
		if err != nil {
			t.Fatal(err)
		}
		a.SetLocalAddr(src)
		if err := a.Beat(t.Context()); err != nil {
			t.Fatalf("%s: heartbeat from %s: %v (join listener refused %d connections)", name, src, err, f.srv.ConnsRefused())
		}
		agents = append(agents, a)
	}
	shared := netip.MustParseAddr("127.0.4.1")
	for i := range 40 {
		joinHost(fmt.Sprintf("shared%02d", i), shared)
	}
	for i := range 70 {
		joinHost(fmt.Sprintf("own%02d", i), netip.AddrFrom4([4]byte{127, 0, 5, byte(1 + i)}))
	}
	for _, a := range agents { // a second round over the kept connections
		if err := a.Beat(t.Context()); err != nil {
			t.Fatalf("%s: second heartbeat: %v (join listener refused %d connections)", a.Host(), err, f.srv.ConnsRefused())
		}
	}
	if n := f.srv.ConnsRefused(); n != 0 {
		t.Errorf("join listener refused %d connections, want 0", n)
	}
	hosts := mustHosts(t, f.store)
	seen := 0
	for _, h := range hosts {
		if !h.LastSeen.IsZero() && h.JoinStatus == "joined" {
			seen++
		}
	}
	if seen != 110 {
		t.Errorf("%d of %d hosts joined and heartbeated, want 110", seen, len(hosts))
	}
	for _, a := range agents {
		a.CloseIdleConnections()
	}
}
