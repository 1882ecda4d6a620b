package reconciler

import (
	"context"
	"errors"
	"testing"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// TestExecutorAdoptsAndSkipsBMC runs the adopt step and a timeout on a
// server without a BMC through the executor: the record moves to the
// servers.yaml name, and the timeout fails the server without opening
// any driver.
func TestExecutorAdoptsAndSkipsBMC(t *testing.T) {
	st := openEnrolStore(t)
	opened := 0
	c, err := New(Config{Store: st, Drivers: driverFunc(func(context.Context, state.Server) (bmc.Driver, error) {
		opened++
		return nil, errors.New("no driver in this test")
	}), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"auto-525400aa0001", "auto-525400aa0002"} {
		mac := "52:54:00:aa:00:0" + n[len(n)-1:]
		if _, err := st.CreateServer(state.Server{Name: n, BootMAC: mac, Enrolled: &state.Enrolment{At: planT0}}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Transition(n, state.LifecycleNew, state.LifecycleCommissioning, "enrol"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.Transition("auto-525400aa0001", state.LifecycleCommissioning, state.LifecycleReady, "report"); err != nil {
		t.Fatal(err)
	}
	log := testLogger(t)
	if err := c.run(context.Background(), plan.Step{Server: "r9-n01", Action: plan.ActAdopt, From: "auto-525400aa0001"}, nil, log); err != nil {
		t.Fatal(err)
	}
	if s, err := st.Server("r9-n01"); err != nil || s.Lifecycle != state.LifecycleReady || s.BootMAC != "52:54:00:aa:00:01" {
		t.Errorf("adopted = %+v, %v", s, err)
	}
	if err := c.run(context.Background(), plan.Step{Server: "auto-525400aa0002", Action: plan.ActTimeout, Why: "no commissioning report within 30m0s"}, nil, log); err != nil {
		t.Fatal(err)
	}
	if s, _ := st.Server("auto-525400aa0002"); s.Lifecycle != state.LifecycleFailed || s.InFlight != nil {
		t.Errorf("timed out = %+v", s)
	}
	err = c.run(context.Background(), plan.Step{Server: "r9-n01", Action: plan.ActPowerCycle, Counter: 1}, nil, log)
	if !errors.Is(err, ErrNoBMC) {
		t.Errorf("power-cycle without a BMC = %v, want ErrNoBMC", err)
	}
	if opened != 0 {
		t.Errorf("opened %d drivers for servers without a BMC", opened)
	}
}

type driverFunc func(context.Context, state.Server) (bmc.Driver, error)

func (f driverFunc) Driver(ctx context.Context, s state.Server) (bmc.Driver, error) { return f(ctx, s) }
