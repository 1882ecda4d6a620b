package reconciler

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// hangingDriver is a BMC whose machine never reads on after a power-on:
// Power sends the action (recorded) and then waits, as a driver's power
// wait does, until its context ends, returning that error the way the
// drivers wrap it.
type hangingDriver struct {
	recordingDriver
	waiting chan struct{} // closed when the first power wait starts
}

func (d *hangingDriver) Power(ctx context.Context, a bmc.PowerAction) error {
	d.mu.Lock()
	d.power = append(d.power, a)
	first := len(d.power) == 1
	d.mu.Unlock()
	if first {
		close(d.waiting)
	}
	<-ctx.Done()
	return fmt.Errorf("redfish: power %s: wait for On: %w", a, ctx.Err())
}

// TestShutdownInterruptsRunningAction: Run's context ends while a
// commission's power wait never completes (a machine that never reads on).
// Run returns after ShutdownGrace (200 ms here) plus the time the
// cancelled wait takes to return, not after ActionTimeout (5 minutes),
// and the server's record shows no failure: no LastError, no failure
// count or backoff, not stalled, no action.failed or action.stalled
// event. Its journal entry stays (commission in flight, its power action
// marked sent), as a SIGKILL would leave it, so the next start resumes
// it. Without the grace Run waited for the action's 5-minute timeout and
// then recorded "context deadline exceeded" as the commission's failure,
// stalling the server (checked: this test failed at its 30 s deadline).
func TestShutdownInterruptsRunningAction(t *testing.T) {
	const name = "s1"
	st, inv := oneServerSite(t)
	drv := &hangingDriver{waiting: make(chan struct{})}
	ctl, err := New(Config{Store: st, Drivers: oneDriver{drv}, ShutdownGrace: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctl.SetDesired(inv)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- ctl.Run(ctx) }()
	select {
	case <-drv.waiting:
	case <-time.After(30 * time.Second):
		t.Fatal("the commission's power-on was not sent within 30 s")
	}
	cancel()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30 s of its context ending (grace 200 ms)")
	}

	srv, err := st.Server(name)
	if err != nil {
		t.Fatal(err)
	}
	if srv.LastError != "" || srv.Failures != 0 || !srv.RetryAt.IsZero() || srv.Stalled != "" {
		t.Errorf("after the shutdown: LastError %q, failures %d, retry at %v, stalled %q; want no failure recorded",
			srv.LastError, srv.Failures, srv.RetryAt, srv.Stalled)
	}
	for _, kind := range []string{"action.failed", "action.stalled"} {
		if n := countEvents(t, st, kind); n != 0 {
			t.Errorf("%d %s events, want none", n, kind)
		}
	}
	if srv.InFlight == nil || srv.InFlight.Action != string(plan.ActCommission) || srv.InFlight.PowerSent.IsZero() {
		t.Errorf("journal after the shutdown: %+v; want the commission in flight with its power action marked sent", srv.InFlight)
	}
	if srv.Lifecycle != state.LifecycleCommissioning {
		t.Errorf("lifecycle %s, want commissioning (the move before the netboot stays)", srv.Lifecycle)
	}
	if got := drv.actions(); len(got) != 1 || got[0] != bmc.PowerActionOn {
		t.Errorf("power actions %v, want one power on", got)
	}
}
