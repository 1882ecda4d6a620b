package sim_test

import (
	"testing"
	"time"

	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/state"
)

// TestPowerTransitionEndToEnd runs the example site with every Redfish BMC
// taking 2 s per power change (PowerState reads PoweringOn/PoweringOff, or
// the old state, meanwhile, as real BMCs do): the controller's power
// actions and read-backs still commission the site and deploy and join
// three servers, with no server failed. The machines boot at once
// (commissioning ends while the BMC still reads PoweringOn: the driver
// takes PoweringOn as the power-on); with the old state kept, a BMC without
// LastResetTime (iLO 5, XCC trees) shows nothing of a host that came and
// went within the transition, so there the firmware takes 3 s before the
// network boot, as real POST takes longer than a BMC's power transition.
func TestPowerTransitionEndToEnd(t *testing.T) {
	for _, keep := range []bool{false, true} {
		name := "powering"
		if keep {
			name = "keeps-old-state"
		}
		t.Run(name, func(t *testing.T) {
			cfg := sim.Config{PowerTransition: 2 * time.Second, PowerTransitionKeepsState: keep}
			if keep {
				cfg.BootDelay = 3 * time.Second
			}
			r := startRig(t, rigOptions{lab: cfg})
			snap := r.steady()
			for n, srv := range snap.Servers {
				if srv.Lifecycle == state.LifecycleFailed {
					t.Errorf("%s failed: %s", n, srv.LastError)
				}
			}
		})
	}
}
