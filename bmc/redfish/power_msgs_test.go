package redfish_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/redfish"
)

// silentAfterReset is a host that stays on, and whose BMC stops answering
// shortly after a reset is accepted (after two more reads of the power
// state, silence calls stop): a BMC that reboots itself with the host, or
// a management network that drops.
type silentAfterReset struct {
	mu    sync.Mutex
	reads int // power reads since the reset; -1 before it
	stop  func()
}

func (p *silentAfterReset) PowerState(context.Context) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reads >= 0 {
		p.reads++
		if p.reads == 2 {
			go p.stop() // not under the emulator's request handling
		}
	}
	return "On", nil
}

func (p *silentAfterReset) Reset(context.Context, string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reads = 0
	return nil
}

// TestPowerWaitSaysBMCStoppedAnswering: the wait for off ends while every
// read of the System is dropped; the error says the BMC stopped answering
// (and what it last said), never "still on", and wraps both ErrTimeout and
// ErrUnreachable. Before, it said "want off, still on".
func TestPowerWaitSaysBMCStoppedAnswering(t *testing.T) {
	p := &silentAfterReset{reads: -1}
	tr := loadTree(t, treeDell)
	l := newLab(t, "", labOpts{on: true, tree: tr, backend: p, quirks: &bmcsim.Quirks{}, tune: func(c *redfish.Config) {
		c.PowerTimeout = 500 * time.Millisecond
		c.PollInterval = 20 * time.Millisecond
		c.Timeout = 200 * time.Millisecond
		c.Retries = 1
	}})
	p.stop = func() { l.sim.Inject(bmcsim.Fault{Method: "GET", Kind: bmcsim.FaultDrop}) }
	err := l.drv.Power(context.Background(), bmc.PowerActionOff)
	if err == nil {
		t.Fatal("Power(off) = nil; want an error")
	}
	if s := err.Error(); !strings.Contains(s, "stopped answering") || !strings.Contains(s, "saying on") || strings.Contains(s, "still on") {
		t.Errorf("Power(off) = %q; want 'stopped answering' and what it last said, not 'still on'", s)
	}
	if !errors.Is(err, bmc.ErrTimeout) || !errors.Is(err, bmc.ErrUnreachable) {
		t.Errorf("Power(off) = %v; want ErrTimeout and ErrUnreachable", err)
	}
}

// TestResetUnverifiedSaysWhy: a reset keeps the machine on by design, so
// its *bmc.ResetError says so and what was looked at (no task, no
// LastResetTime or BootProgress to watch, no power-off seen), instead of
// calling the on state a failure ("power stayed on").
func TestResetUnverifiedSaysWhy(t *testing.T) {
	for _, tc := range []struct {
		name   string
		quirks bmcsim.Quirks
		want   string
	}{
		{"no-marks", bmcsim.Quirks{NoLastResetTime: true}, "reports neither LastResetTime nor BootProgress"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLabPower(t, loadTree(t, treeDell), tc.quirks, stuckPower{})
			err := l.drv.Power(context.Background(), bmc.PowerActionReset)
			var re *bmc.ResetError
			if !errors.As(err, &re) {
				t.Fatalf("Power(reset) = %v, want *bmc.ResetError", err)
			}
			for _, w := range []string{"keeps the machine on by design", "no power-off was seen", tc.want} {
				if !strings.Contains(re.Why, w) {
					t.Errorf("Why = %q, want %q in it", re.Why, w)
				}
			}
			if strings.Contains(re.Why, "power stayed on") {
				t.Errorf("Why = %q calls a reset's on state a failure", re.Why)
			}
		})
	}
}
