package reconciler

import (
	"context"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

type resumeDrivers struct{ drv *recordingDriver }

func (o resumeDrivers) Driver(context.Context, state.Server) (bmc.Driver, error) { return o.drv, nil }

// TestResumedNetbootReadsBackFirst: a commission journalled by another
// controller (a crashed process, or the leader before a failover) that
// had already sent its power action is resumed by reading the BMC back:
// on → no second reset, the entry completes; off → the netboot runs again
// (power on). Without the journal's PowerSent the resumed entry reset a
// machine that was already booting (checked: one PowerActionReset).
func TestResumedNetbootReadsBackFirst(t *testing.T) {
	for _, c := range []struct {
		name string
		on   bool
		want []bmc.PowerAction
	}{
		{"bmc reads on", true, nil},
		{"bmc reads off", false, []bmc.PowerAction{bmc.PowerActionOn}},
	} {
		t.Run(c.name, func(t *testing.T) {
			const name = "s1"
			st, inv := oneServerSite(t)
			sent := time.Now().Add(-20 * time.Second).UTC()
			// What the previous controller left: commissioning, the entry
			// journalled and its power on sent, no done.
			if _, err := st.Apply(state.Move{Server: name, From: state.LifecycleNew, To: state.LifecycleCommissioning, Update: func(s *state.Server) error {
				s.InFlight = &state.InFlight{Action: string(plan.ActCommission), Key: string(plan.ActCommission) + "/0", Started: sent, Attempt: 1, PowerSent: sent}
				return nil
			}}); err != nil {
				t.Fatal(err)
			}
			drv := &recordingDriver{on: c.on}
			ctl, err := New(Config{Store: st, Drivers: resumeDrivers{drv}})
			if err != nil {
				t.Fatal(err)
			}
			ctl.SetDesired(inv)
			ctl.Pass(context.Background()) // dispatches the journalled entry first
			ctl.wg.Wait()
			got := drv.actions()
			if len(got) != len(c.want) || (len(got) == 1 && got[0] != c.want[0]) {
				t.Fatalf("power actions %v, want %v", got, c.want)
			}
			srv, err := st.Server(name)
			if err != nil {
				t.Fatal(err)
			}
			if srv.InFlight != nil || srv.Lifecycle != state.LifecycleCommissioning {
				t.Fatalf("after the resume: lifecycle %s, in flight %+v; want commissioning, entry done", srv.Lifecycle, srv.InFlight)
			}
		})
	}
}
