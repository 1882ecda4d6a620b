package redfish_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/bmcsim"
)

// stuckPower accepts every ResetType and never changes: a BMC that answers
// 204 to ForceRestart and does nothing.
type stuckPower struct{}

func (stuckPower) PowerState(context.Context) (string, error) { return "On", nil }
func (stuckPower) Reset(context.Context, string) error        { return nil }

// dippingPower shows Off for a few reads after a restart, as real hosts do
// during a PowerCycle.
type dippingPower struct {
	mu  sync.Mutex
	off int
}

func (p *dippingPower) PowerState(context.Context) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.off > 0 {
		p.off--
		return "Off", nil
	}
	return "On", nil
}

func (p *dippingPower) Reset(_ context.Context, rt string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rt == "PowerCycle" || rt == "ForceRestart" {
		p.off = 2
	}
	return nil
}

// TestResetProvenByEvidence: a reset of a running machine counts only on
// evidence; waiting for On (true before the reset) proves nothing.
func TestResetProvenByEvidence(t *testing.T) {
	for _, tc := range []struct {
		name   string
		quirks bmcsim.Quirks
		power  bmcsim.PowerBackend
		fault  *bmcsim.Fault
		want   string // evidence, "" for ErrUnverified
	}{
		{"last-reset-time", bmcsim.DefaultQuirks("Dell"), bmcsim.NewMemoryPower(true), nil, "LastResetTime changed"},
		{"no-evidence", bmcsim.Quirks{NoLastResetTime: true}, stuckPower{}, nil, ""},
		{"no-lrt-stuck-host", bmcsim.Quirks{NoLastResetTime: true}, bmcsim.NewMemoryPower(true), nil, ""},
		{"power-off-observed", bmcsim.Quirks{NoLastResetTime: true}, &dippingPower{}, nil, "power-off observed"},
		{"task-completed", bmcsim.Quirks{NoLastResetTime: true}, stuckPower{}, &bmcsim.Fault{Method: "POST", PathSuffix: "/ComputerSystem.Reset", Kind: bmcsim.FaultAccepted, TaskPolls: 1}, "task completed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := loadTree(t, treeDell)
			l := newLabPower(t, tr, tc.quirks, tc.power)
			if tc.fault != nil {
				l.sim.Inject(*tc.fault)
			}
			err := l.drv.Power(context.Background(), bmc.PowerActionCycle)
			if tc.want == "" {
				var re *bmc.ResetError
				if !errors.As(err, &re) || !errors.Is(err, bmc.ErrUnverified) {
					t.Fatalf("Power(cycle) = %v, want *bmc.ResetError", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Power(cycle) = %v", err)
			}
			if got := l.drv.LastResetEvidence(); got != tc.want {
				t.Errorf("LastResetEvidence = %q, want %q", got, tc.want)
			}
		})
	}
}
