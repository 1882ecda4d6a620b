package reconciler

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// gatePerServer is a BMC driver source whose Driver call for a server
// reports the server on entered and blocks until that server's gate is
// released: each step of the test's servers runs only when the test lets
// it.
type gatePerServer struct {
	entered chan string
	mu      sync.Mutex
	gates   map[string]chan struct{}
	drv     *recordingDriver
}

func (g *gatePerServer) gate(name string) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	ch, ok := g.gates[name]
	if !ok {
		ch = make(chan struct{})
		g.gates[name] = ch
	}
	return ch
}

func (g *gatePerServer) Driver(ctx context.Context, s state.Server) (bmc.Driver, error) {
	g.entered <- s.Name
	select {
	case <-g.gate(s.Name):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.drv, nil
}

// threeServerSite is oneServerSite with servers s1, s2 and s3 in three
// racks under three BMCs (no limit but Workers holds them back).
func threeServerSite(t *testing.T) (*state.Store, *inventory.Inventory) {
	t.Helper()
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	inv := &inventory.Inventory{Digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
	for i := 1; i <= 3; i++ {
		ws := inventory.Server{Name: fmt.Sprintf("s%d", i), Zone: "z", Rack: fmt.Sprintf("r%d", i), BootMAC: fmt.Sprintf("52:54:00:00:00:0%d", i),
			BootMode: inventory.BootUEFI, Want: inventory.WantReady,
			BMC: inventory.BMC{Driver: inventory.DriverRedfish, Address: fmt.Sprintf("https://bmc%d.invalid", i), Credentials: "c"}}
		inv.Servers = append(inv.Servers, ws)
		if _, err := st.CreateServer(plan.Record(&ws)); err != nil {
			t.Fatal(err)
		}
	}
	return st, inv
}

// waitEntered returns the next server whose step reached its BMC, or
// fails after 10 s.
func waitEntered(t *testing.T, g *gatePerServer) string {
	t.Helper()
	select {
	case n := <-g.entered:
		return n
	case <-time.After(10 * time.Second):
		t.Fatal("no step reached its BMC within 10 s")
		return ""
	}
}

// noneEntered fails when a step reaches its BMC within 300 ms.
func noneEntered(t *testing.T, g *gatePerServer, why string) {
	t.Helper()
	select {
	case n := <-g.entered:
		t.Fatalf("%s: a step of %s started", why, n)
	case <-time.After(300 * time.Millisecond):
	}
}

// oneWorkerPass runs one pass of a one-worker controller over
// threeServerSite, its BMCs gated (gatePerServer), and checks that it
// planned a step for each server.
func oneWorkerPass(t *testing.T) (*Controller, *gatePerServer, plan.Result, *state.Store, *inventory.Inventory) {
	t.Helper()
	st, inv := threeServerSite(t)
	g := &gatePerServer{entered: make(chan string, 3), gates: map[string]chan struct{}{}, drv: &recordingDriver{}}
	c, err := New(Config{Store: st, Drivers: g, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	c.SetDesired(inv)
	res := c.Pass(context.Background())
	if len(res.Steps) != 3 {
		t.Fatalf("plan %v, want a step for each of 3 servers", res.Steps)
	}
	return c, g, res, st, inv
}

// TestRefillStartsBacklogWhenWorkerFrees: with one worker, one pass
// plans a step for each of three servers and starts the first; each
// step that finishes starts the next from that pass's plan without
// another pass (the controller runs no Run loop here, so only refill can
// start them), in the plan's order.
func TestRefillStartsBacklogWhenWorkerFrees(t *testing.T) {
	c, g, res, _, _ := oneWorkerPass(t)
	var order []string
	for i := range 3 {
		n := waitEntered(t, g)
		order = append(order, n)
		if i < 2 {
			noneEntered(t, g, "one worker, busy")
		}
		close(g.gate(n))
	}
	c.wg.Wait()
	want := []string{res.Steps[0].Server, res.Steps[1].Server, res.Steps[2].Server}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Errorf("steps ran in order %v, want the plan's %v", order, want)
	}
	c.passMu.Lock()
	left := c.backlog
	c.passMu.Unlock()
	if left != nil {
		t.Errorf("backlog %v after every step ran", left.steps)
	}
}

// TestRefillDropsStaleAndOldRevision: a backlog step whose server's
// record changed after the pass's snapshot does not start (the next
// pass replans it), and a new inventory revision drops the backlog.
func TestRefillDropsStaleAndOldRevision(t *testing.T) {
	c, g, res, st, inv := oneWorkerPass(t)
	first := waitEntered(t, g)
	second, third := res.Steps[1].Server, res.Steps[2].Server
	// The second server's record changes after the snapshot.
	if _, err := st.UpdateServer(second, func(s *state.Server) error { s.Rack = "moved"; return nil }); err != nil {
		t.Fatal(err)
	}
	close(g.gate(first))
	if n := waitEntered(t, g); n != third {
		t.Fatalf("%s started, want %s (the stale %s skipped)", n, third, second)
	}
	// A new revision while the third runs: nothing more starts.
	c.passMu.Lock()
	c.backlog = &backlog{ctx: context.Background(), steps: []plan.Step{res.Steps[1]}, snap: state.Snapshot{Servers: map[string]*state.Server{}}, desired: inv}
	c.passMu.Unlock()
	next := *inv
	c.SetDesired(&next)
	close(g.gate(third))
	noneEntered(t, g, "after a new revision")
	c.wg.Wait()
	c.passMu.Lock()
	defer c.passMu.Unlock()
	if c.backlog != nil {
		t.Error("the backlog of the old revision was kept")
	}
}

// TestFencedSkipGivesWorkerBack: a step that powers on, planned before
// its server was fenced, is skipped when it starts; the skip gives the
// worker and the server back (it kept both: the server was never planned
// again and the worker was lost until a restart).
func TestFencedSkipGivesWorkerBack(t *testing.T) {
	st, inv := oneServerSite(t)
	c, err := New(Config{Store: st, Drivers: driverFunc(func(context.Context, state.Server) (bmc.Driver, error) {
		t.Error("a fenced server's BMC was opened")
		return &recordingDriver{}, nil
	}), Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	c.SetDesired(inv)
	obs, err := st.UpdateServer("s1", func(s *state.Server) error {
		s.Fenced = &state.Fencing{}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	step := plan.Step{Server: "s1", Action: plan.ActCommission, Counter: 1}
	if c.tryStart(step, &obs, time.Now()) != started {
		t.Fatal("tryStart refused an idle server")
	}
	c.execute(context.Background(), step, inv)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.busy["s1"] || c.running != 0 || len(c.inflight) != 0 {
		t.Errorf("after the fenced skip: busy %v, running %d, in flight %v", c.busy, c.running, c.inflight)
	}
}
