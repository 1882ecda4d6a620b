package redfish_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/redfish"
)

// tickClock advances one second every time it is read: a BMC's power
// transition of N seconds ends after about N reads, without real waiting.
type tickClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *tickClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Second)
	return c.t
}

// TestPowerThroughTransition: a BMC whose power changes take time
// (PowerState reads PoweringOn/PoweringOff, or keeps the old state, as
// iDRAC, iLO and bmcweb report during a transition) still gets power on,
// off and a verified restart: the driver polls until the state settles.
func TestPowerThroughTransition(t *testing.T) {
	for _, keep := range []bool{false, true} {
		clk := &tickClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		sim, err := bmcsim.New(bmcsim.Config{Tree: loadTree(t, "dell-poweredge-r750-idrac9"), Username: "admin", Password: "pw",
			Power: bmcsim.NewMemoryPower(false), Now: clk.now, SessionTimeout: -1,
			PowerTransition: 20 * time.Second, PowerTransitionKeepsState: keep})
		if err != nil {
			t.Fatal(err)
		}
		drv := newLabWith(t, sim).driver(t, "pw")
		ctx := context.Background()
		for _, a := range []bmc.PowerAction{bmc.PowerActionOn, bmc.PowerActionReset, bmc.PowerActionOff} {
			if err := drv.Power(ctx, a); err != nil {
				t.Fatalf("keep old state %v: power %s: %v", keep, a, err)
			}
		}
		if ps, err := drv.PowerState(ctx); err != nil || ps != bmc.PowerOff {
			t.Fatalf("keep old state %v: after off, PowerState = %s, %v", keep, ps, err)
		}
	}
}

// flashPower is a host whose boot is shorter than its BMC's power
// transition: after On it reads On for one read, then Off (a ramdisk that
// reported and powered itself off).
type flashPower struct {
	mu    sync.Mutex
	reads int // On reads left
}

func (p *flashPower) PowerState(context.Context) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reads > 0 {
		p.reads--
		return "On", nil
	}
	return "Off", nil
}

func (p *flashPower) Reset(_ context.Context, rt string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rt == "On" || rt == "ForceOn" {
		p.reads = 1
	}
	return nil
}

// TestPowerOnThroughTransitionShortBoot: the BMC reads PoweringOn (or the
// old Off) for longer than the host stays on, so On is never read; the
// power-on still counts, on the BMC's PoweringOn or on LastResetTime
// moving, instead of timing out.
func TestPowerOnThroughTransitionShortBoot(t *testing.T) {
	for _, keep := range []bool{false, true} {
		clk := &tickClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		sim, err := bmcsim.New(bmcsim.Config{Tree: loadTree(t, "dell-poweredge-r750-idrac9"), Username: "admin", Password: "pw",
			Power: &flashPower{}, Now: clk.now, SessionTimeout: -1,
			PowerTransition: time.Hour, PowerTransitionKeepsState: keep})
		if err != nil {
			t.Fatal(err)
		}
		l := newLabWith(t, sim)
		drv, err := redfish.New(redfish.Config{Endpoint: l.url, Username: "admin", Password: "pw",
			PollInterval: time.Millisecond, RetryBase: time.Millisecond, Timeout: 5 * time.Second, PowerTimeout: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = drv.Close(context.Background()) })
		if err := drv.Power(context.Background(), bmc.PowerActionOn); err != nil {
			t.Errorf("keep old state %v: power on of a host that booted and powered off within the transition: %v", keep, err)
		}
	}
}
