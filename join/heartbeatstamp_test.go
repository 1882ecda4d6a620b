package join_test

import (
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/join/node"
	"github.com/machina-metal/machina/state"
)

// slowHostRead is a join.Store whose host reads take a while by the
// listener's clock (a store busy under load): each read of the host
// advances the clock by delay.
type slowHostRead struct {
	join.Store
	clk   *clock
	delay *atomic.Int64 // nanoseconds
}

func (s slowHostRead) Host(name string) (state.Host, error) {
	s.clk.Add(time.Duration(s.delay.Load()))
	return s.Store.Host(name)
}

// TestHeartbeatStampedAtReceipt: a heartbeat's time is when the listener
// received it, not when the handler got round to recording it: with the
// host's record read taking 40 s by the listener's clock (a store busy
// under load), the recorded LastSeen is the receipt, 40 s before the
// clock when the write starts. Before, the heartbeat was stamped after
// that read, and a loaded store made a host look silent for longer than
// it was.
func TestHeartbeatStampedAtReceipt(t *testing.T) {
	var clk *clock
	delay := new(atomic.Int64)
	f := startListenerWith(t, func(c *join.Config) {
		clk = &clock{t: c.Now()}
		c.Now = clk.Now
		c.Store = slowHostRead{Store: c.Store, clk: clk, delay: delay}
	})
	tok := f.token(t, v1.EnrolmentRequest{})
	dir := t.TempDir()
	if _, err := node.Join(t.Context(), node.JoinConfig{URL: tok.JoinURL, Fingerprint: tok.CAFingerprint, Token: tok.Token, Dir: dir, Facts: facts("hv1")}); err != nil {
		t.Fatal(err)
	}
	c, err := node.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseIdleConnections()
	delay.Store(int64(40 * time.Second)) // the heartbeat's read of its host is slow
	received := clk.Now()
	if err := c.Beat(t.Context()); err != nil {
		t.Fatal(err)
	}
	h, err := f.store.Host("hv1")
	if err != nil {
		t.Fatal(err)
	}
	if !h.LastSeen.Equal(received) {
		t.Errorf("LastSeen %s, want the heartbeat's receipt %s (the clock after the slow read: %s)", h.LastSeen, received, clk.Now())
	}
}
