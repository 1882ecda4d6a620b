package reconciler

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// refusingDriver fails every power action (a BMC that answers with an
// error the controller retries with backoff).
type refusingDriver struct{ recordingDriver }

func (*refusingDriver) Power(context.Context, bmc.PowerAction) error {
	return errors.New("chassis control refused")
}

// TestBackoffSurvivesRestart: a failing step's error, event and retry time
// are on the server's record, so a controller restarted on the same state
// does not retry it at once (before the executor's restructuring the backoff lived in the old
// controller's memory and the new one resumed the journalled step on its
// first pass); once the backoff has passed it is retried, and the
// failure count grows the next delay.
func TestBackoffSurvivesRestart(t *testing.T) {
	st := openEnrolStore(t)
	serverAt(t, st, "s1", state.LifecycleReady, nil)
	drv := &countingDrivers{d: &refusingDriver{}}
	var clk atomic.Int64 // Config.Now, in Unix nanoseconds
	clk.Store(planT0.UnixNano())
	now := func() time.Time { return time.Unix(0, clk.Load()).UTC() }
	cfg := Config{Store: st, Drivers: drv, Logger: testLogger(t), Now: now, BackoffBase: time.Minute, BackoffCap: time.Hour}
	first, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	first.execute(context.Background(), plan.Step{Server: "s1", Action: plan.ActPowerOn, Counter: 1}, nil)
	s, _ := st.Server("s1")
	if s.Failures != 1 || !s.RetryAt.After(planT0.Add(40*time.Second)) || s.InFlight == nil || !strings.Contains(s.LastError, "chassis control refused") {
		t.Fatalf("after the failure: failures %d, retry at %v, journal %+v, last error %q", s.Failures, s.RetryAt, s.InFlight, s.LastError)
	}
	evs, _ := st.Events(state.EventQuery{Server: "s1"})
	if last := evs[len(evs)-1]; last.Kind != "action.failed" || last.Message != s.LastError {
		t.Errorf("last event %+v, want action.failed with the record's error", last)
	}

	// A new controller on the same state: the journalled step is not
	// resumed inside its backoff.
	second, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	second.Pass(context.Background())
	second.wg.Wait()
	if drv.opened != 1 {
		t.Fatalf("the restarted controller opened the BMC %d times, want 1 (no retry inside the backoff)", drv.opened)
	}
	// Past the backoff it is retried, fails again, and waits longer.
	clk.Add(int64(2 * time.Minute))
	second.Pass(context.Background())
	second.wg.Wait()
	s, _ = st.Server("s1")
	if drv.opened != 2 || s.Failures != 2 || !s.RetryAt.After(now().Add(90*time.Second)) {
		t.Errorf("after the backoff: opened %d, failures %d, retry at %v (now %v); want a retry and a doubled delay", drv.opened, s.Failures, s.RetryAt, now())
	}
}

// TestSuccessClearsBackoff: the next step that succeeds clears the
// failure count and the retry time (done for a BMC step, clearBackoff for
// a store-only one).
func TestSuccessClearsBackoff(t *testing.T) {
	st := openEnrolStore(t)
	serverAt(t, st, "s1", state.LifecycleRetired, func(s *state.Server) { s.Failures, s.RetryAt = 3, planT0 })
	c, err := New(Config{Store: st, Drivers: driverFunc(nil), Logger: testLogger(t), Now: func() time.Time { return planT0.Add(time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	c.execute(context.Background(), plan.Step{Server: "s1", Action: plan.ActUnretire}, nil)
	if s, _ := st.Server("s1"); s.Lifecycle != state.LifecycleNew || s.Failures != 0 || !s.RetryAt.IsZero() {
		t.Errorf("after a successful step: %s, failures %d, retry at %v", s.Lifecycle, s.Failures, s.RetryAt)
	}
}
