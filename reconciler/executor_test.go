package reconciler

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// gatedDrivers hands out one recording driver; the first Driver call blocks
// until gate is closed, after signalling entered.
type gatedDrivers struct {
	entered chan struct{}
	gate    chan struct{}
	once    sync.Once
	drv     *recordingDriver
}

func (g *gatedDrivers) Driver(ctx context.Context, _ state.Server) (bmc.Driver, error) {
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.entered)
		<-g.gate
	}
	return g.drv, nil
}

// recordingDriver is an in-memory BMC that records power actions.
type recordingDriver struct {
	mu    sync.Mutex
	on    bool
	power []bmc.PowerAction
}

func (d *recordingDriver) PowerState(context.Context) (bmc.PowerState, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.on {
		return bmc.PowerOn, nil
	}
	return bmc.PowerOff, nil
}

func (d *recordingDriver) Power(_ context.Context, a bmc.PowerAction) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.power = append(d.power, a)
	d.on = a != bmc.PowerActionOff
	return nil
}

func (d *recordingDriver) actions() []bmc.PowerAction {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]bmc.PowerAction(nil), d.power...)
}

func (d *recordingDriver) SetBootOverride(context.Context, bmc.BootOverride) error { return nil }
func (d *recordingDriver) BootOverride(context.Context) (bmc.BootOverride, error) {
	return bmc.BootOverride{}, nil
}
func (d *recordingDriver) InsertMedia(context.Context, string) error { return nil }
func (d *recordingDriver) EjectMedia(context.Context) error          { return nil }
func (d *recordingDriver) Info(context.Context) (*bmc.Info, error)   { return &bmc.Info{}, nil }
func (d *recordingDriver) Close(context.Context) error               { return nil }

// oneServerSite opens a state file in t's temporary folder holding the
// record of server s1 (Redfish BMC, zone z, UEFI, want ready) and returns
// it with the inventory naming s1 and profiles; the store is closed when
// the test ends.
func oneServerSite(t *testing.T, profiles ...inventory.Profile) (*state.Store, *inventory.Inventory) {
	t.Helper()
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	inv := &inventory.Inventory{
		Servers: []inventory.Server{{Name: "s1", Zone: "z", BootMAC: "52:54:00:00:00:01", BootMode: inventory.BootUEFI, Want: inventory.WantReady,
			BMC: inventory.BMC{Driver: inventory.DriverRedfish, Address: "https://bmc.invalid", Credentials: "c"}}},
		Profiles: profiles,
		Digest:   "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
	}
	ws := inv.Servers[0]
	if _, err := st.CreateServer(plan.Record(&ws)); err != nil {
		t.Fatal(err)
	}
	return st, inv
}

// TestStaleStepNotRunAgain: a pass whose snapshot was taken while a deploy
// action was still running, and which reaches dispatch after that action
// finished, must not run the deploy again (a second netboot would reset a
// machine that is already writing its image). Found by the simulated
// lab's end-to-end tests, where it failed deploys with "context canceled".
func TestStaleStepNotRunAgain(t *testing.T) {
	const name = "s1"
	st, inv := oneServerSite(t, inventory.Profile{Name: "p", Image: "img", Zone: "z", Count: 1})
	for _, m := range []state.Move{{Server: name, From: state.LifecycleNew, To: state.LifecycleCommissioning},
		{Server: name, From: state.LifecycleCommissioning, To: state.LifecycleReady},
		{Server: name, From: state.LifecycleReady, To: state.LifecycleAllocated, Update: func(s *state.Server) error {
			s.Allocation = &state.Allocation{Profile: "p", Image: "img", At: time.Now(), Reason: plan.ReasonCount}
			return nil
		}}} {
		if _, err := st.Apply(m); err != nil {
			t.Fatal(err)
		}
	}

	drivers := &gatedDrivers{entered: make(chan struct{}), gate: make(chan struct{}), drv: &recordingDriver{}}
	var c *Controller
	var mu sync.Mutex
	var hook func()
	calls := 0
	now := func() time.Time {
		mu.Lock()
		calls++
		h := hook
		if h != nil && calls == 2 {
			hook = nil
		} else {
			h = nil
		}
		mu.Unlock()
		if h != nil {
			h()
		}
		return time.Now()
	}
	c, err := New(Config{Store: st, Drivers: drivers, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	c.SetDesired(inv)
	ctx := context.Background()

	// Pass A dispatches the deploy; it blocks opening the BMC driver, after
	// journaling, before the lifecycle moves.
	res := c.Pass(ctx)
	if len(res.Steps) != 1 || res.Steps[0].Action != plan.ActDeploy {
		t.Fatalf("plan %v, want one deploy", res.Steps)
	}
	<-drivers.entered

	// Pass B takes its snapshot now (allocated, deploy in flight); when it
	// reaches dispatch (its second clock read), the deploy is let go and
	// has finished.
	mu.Lock()
	calls = 0
	hook = func() {
		close(drivers.gate)
		for {
			c.mu.Lock()
			busy := c.busy[name]
			c.mu.Unlock()
			if !busy {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	mu.Unlock()
	c.Pass(ctx)
	c.wg.Wait()

	if got := drivers.drv.actions(); len(got) != 1 || got[0] != bmc.PowerActionOn {
		t.Errorf("power actions %v, want one power on (one netboot)", got)
	}
	srv, err := st.Server(name)
	if err != nil {
		t.Fatal(err)
	}
	if srv.Lifecycle != state.LifecycleDeploying || srv.InFlight != nil {
		t.Errorf("lifecycle %s in flight %v, want deploying and nothing in flight", srv.Lifecycle, srv.InFlight)
	}
	// A fresh pass plans nothing more for the deploying server.
	if res := c.Pass(ctx); len(res.Steps) != 0 {
		t.Errorf("plan after the deploy: %v", res.Steps)
	}
	c.wg.Wait()
	if got := drivers.drv.actions(); len(got) != 1 {
		t.Errorf("power actions %v after another pass, want 1", got)
	}
}

// TestTimeoutKeepsReason: a server failed by the commissioning deadline
// keeps the deadline as its LastError (the action's completion must not
// clear the failure it records); found by the simulated lab's restart test.
func TestTimeoutKeepsReason(t *testing.T) {
	st, inv := oneServerSite(t)
	if _, err := st.Transition("s1", state.LifecycleNew, state.LifecycleCommissioning, "test"); err != nil {
		t.Fatal(err)
	}
	drv := &recordingDriver{on: true}
	later := func() time.Time { return time.Now().Add(time.Hour) }
	c, err := New(Config{Store: st, Drivers: oneDriver{drv}, Now: later})
	if err != nil {
		t.Fatal(err)
	}
	c.SetDesired(inv)
	if res := c.Pass(context.Background()); len(res.Steps) != 1 || res.Steps[0].Action != plan.ActTimeout {
		t.Fatalf("plan %v, want a timeout", res.Steps)
	}
	c.wg.Wait()
	srv, err := st.Server("s1")
	if err != nil {
		t.Fatal(err)
	}
	if srv.Lifecycle != state.LifecycleFailed || srv.InFlight != nil {
		t.Errorf("lifecycle %s in flight %v, want failed, nothing in flight", srv.Lifecycle, srv.InFlight)
	}
	if srv.LastError == "" || !strings.Contains(srv.LastError, "no commissioning report") {
		t.Errorf("LastError %q, want the deadline", srv.LastError)
	}
	if got := drv.actions(); len(got) != 1 || got[0] != bmc.PowerActionOff {
		t.Errorf("power actions %v, want one power off", got)
	}
}

// oneDriver hands out the same driver for every server.
type oneDriver struct{ d bmc.Driver }

func (o oneDriver) Driver(context.Context, state.Server) (bmc.Driver, error) { return o.d, nil }

// TestDeployWaitsForImage: a deploy whose profile's image is not ready
// (DeployReady answers an error) is not started, not failed and not
// backed off; it starts on the first pass after the image is ready.
func TestDeployWaitsForImage(t *testing.T) {
	st, inv := oneServerSite(t, inventory.Profile{Name: "p", Image: "img", Zone: "z", Count: 1, Deploy: inventory.DeployImage})
	for _, m := range []state.Move{{Server: "s1", From: state.LifecycleNew, To: state.LifecycleCommissioning},
		{Server: "s1", From: state.LifecycleCommissioning, To: state.LifecycleReady},
		{Server: "s1", From: state.LifecycleReady, To: state.LifecycleAllocated, Update: func(s *state.Server) error {
			s.Allocation = &state.Allocation{Profile: "p", Image: "img", At: time.Now(), Reason: plan.ReasonCount}
			return nil
		}}} {
		if _, err := st.Apply(m); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	ready := errors.New("image img is pending, not verified yet")
	drv := &recordingDriver{}
	c, err := New(Config{Store: st, Drivers: oneDriver{drv}, DeployReady: func(p inventory.Profile) error {
		mu.Lock()
		defer mu.Unlock()
		if p.Name != "p" {
			t.Errorf("DeployReady(%s)", p.Name)
		}
		return ready
	}})
	if err != nil {
		t.Fatal(err)
	}
	c.SetDesired(inv)
	res := c.Pass(context.Background())
	if len(res.Steps) != 1 || res.Steps[0].Action != plan.ActDeploy {
		t.Fatalf("plan %v, want a deploy", res.Steps)
	}
	// The plan says why the deploy waits, and the server carries an
	// ImageNotReady condition with the reason (it sat in
	// allocated with nothing in status or Attention).
	if res.Steps[0].Waits != ready.Error() {
		t.Errorf("deploy step waits %q, want %q", res.Steps[0].Waits, ready)
	}
	var cond *plan.Condition
	for _, pc := range c.LastPlan().Conditions {
		if pc.Subject == "server/s1" && pc.Type == plan.CondImageNotReady {
			cond = &pc
		}
	}
	if cond == nil || !strings.Contains(cond.Message, ready.Error()) {
		t.Errorf("LastPlan conditions %+v, want an ImageNotReady condition on server/s1 with %q", c.LastPlan().Conditions, ready)
	}
	c.wg.Wait()
	if srv, _ := st.Server("s1"); srv.Lifecycle != state.LifecycleAllocated || srv.InFlight != nil || len(drv.actions()) != 0 {
		t.Fatalf("deploy started before the image was ready: %s, in flight %v, power %v", srv.Lifecycle, srv.InFlight, drv.actions())
	}
	mu.Lock()
	ready = nil
	mu.Unlock()
	res = c.Pass(context.Background())
	c.wg.Wait()
	for _, pc := range res.Conditions {
		if pc.Type == plan.CondImageNotReady {
			t.Errorf("ImageNotReady condition %+v after the image became ready", pc)
		}
	}
	if srv, _ := st.Server("s1"); srv.Lifecycle != state.LifecycleDeploying || len(drv.actions()) != 1 {
		t.Errorf("after the image is ready: %s, power %v; want deploying after one power on", srv.Lifecycle, drv.actions())
	}
}
