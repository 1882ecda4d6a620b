package reconciler

import (
	"time"

	"context"
	"errors"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// fakeMachine is a Machine that records the verbs called (metal3's
// provisioner fixture); err, when set, is what every verb returns.
type fakeMachine struct {
	mu    sync.Mutex
	calls []string
	err   error
	power bmc.PowerState // what PowerState reads
}

func (m *fakeMachine) record(v string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, v)
	return m.err
}

func (m *fakeMachine) Netboot(context.Context) error  { return m.record("netboot") }
func (m *fakeMachine) BootDisk(context.Context) error { return m.record("boot-disk") }
func (m *fakeMachine) Power(_ context.Context, a bmc.PowerAction) error {
	return m.record("power-" + strings.ToLower(string(a)))
}
func (m *fakeMachine) Restart(ctx context.Context, a bmc.PowerAction) error { return m.Power(ctx, a) }
func (m *fakeMachine) PowerState(context.Context) (bmc.PowerState, error) {
	return m.power, m.record("power-state")
}

func (m *fakeMachine) got() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.calls)
}

// TestEveryActionHasHandler: each action kind of the plan's table
// (plan.Actions; plan's TestEveryActionHasRow checks the table against the
// Action constants) has a handler, and the handler table has an entry for
// nothing else.
func TestEveryActionHasHandler(t *testing.T) {
	acts := plan.Actions()
	if len(acts) < 17 {
		t.Fatalf("plan.Actions() = %d actions: the table lost rows", len(acts))
	}
	for _, a := range acts {
		if handlers[a] == nil {
			t.Errorf("action %s has no handler", a)
		}
	}
	for a := range handlers {
		if !slices.Contains(acts, a) {
			t.Errorf("handler %s is not an action of plan.Actions()", a)
		}
	}
}

// countingDrivers counts the drivers opened and hands out d.
type countingDrivers struct {
	mu     sync.Mutex
	opened int
	d      bmc.Driver
}

func (c *countingDrivers) Driver(context.Context, state.Server) (bmc.Driver, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.opened++
	return c.d, nil
}

// TestUnknownActionRefusedFirst: a step whose action this build does not
// know (a journal from another version) is refused with ErrUnknownAction
// before it is journalled or its BMC opened, and it stalls the server
// instead of resuming on every pass. Before the executor's restructuring it was journalled
// and its driver opened, then refused by the switch's default.
func TestUnknownActionRefusedFirst(t *testing.T) {
	st := openEnrolStore(t)
	if _, err := st.CreateServer(state.Server{Name: "s1", BootMAC: "52:54:00:25:00:01", BMC: state.BMCFacts{Driver: "redfish", Address: "https://b1", Credentials: "c"}}); err != nil {
		t.Fatal(err)
	}
	drv := &countingDrivers{d: &recordingDriver{}}
	c, err := New(Config{Store: st, Drivers: drv, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	step := plan.Step{Server: "s1", Action: "frobnicate", Counter: 1}
	err = c.run(context.Background(), step, nil, testLogger(t))
	if !errors.Is(err, ErrUnknownAction) {
		t.Fatalf("run = %v, want ErrUnknownAction", err)
	}
	s, _ := st.Server("s1")
	if s.InFlight != nil || drv.opened != 0 {
		t.Errorf("unknown action: journal %+v, drivers opened %d; want none of either", s.InFlight, drv.opened)
	}
	c.execute(context.Background(), step, nil)
	if s, _ = st.Server("s1"); s.Stalled == "" || !strings.Contains(s.LastError, "unknown action") {
		t.Errorf("after execute: stalled %q, last error %q; want stalled on the unknown action", s.Stalled, s.LastError)
	}
}

// serverAt creates server name in lifecycle lc through allowed moves.
func serverAt(t *testing.T, st *state.Store, name string, lc state.Lifecycle, mod func(*state.Server)) {
	t.Helper()
	srv := state.Server{Name: name, Zone: "zone-a", BootMAC: "52:54:00:25:01:01", BMC: state.BMCFacts{Driver: "redfish", Address: "https://b", Credentials: "c"}}
	if _, err := st.CreateServer(srv); err != nil {
		t.Fatal(err)
	}
	paths := map[state.Lifecycle][]state.Lifecycle{
		state.LifecycleNew:           nil,
		state.LifecycleCommissioning: {state.LifecycleCommissioning},
		state.LifecycleReady:         {state.LifecycleCommissioning, state.LifecycleReady},
		state.LifecycleRetired:       {state.LifecycleCommissioning, state.LifecycleReady, state.LifecycleRetired},
		state.LifecycleAllocated:     {state.LifecycleCommissioning, state.LifecycleReady, state.LifecycleAllocated},
		state.LifecycleDeploying:     {state.LifecycleCommissioning, state.LifecycleReady, state.LifecycleAllocated, state.LifecycleDeploying},
		state.LifecycleDeployed:      {state.LifecycleCommissioning, state.LifecycleReady, state.LifecycleAllocated, state.LifecycleDeploying, state.LifecycleDeployed},
	}
	from := state.LifecycleNew
	for _, to := range paths[lc] {
		m := state.Move{Server: name, From: from, To: to}
		if to == state.LifecycleAllocated {
			m.Update = func(s *state.Server) error { s.Allocation = &state.Allocation{Profile: "hypervisor"}; return nil }
		}
		if _, err := st.Apply(m); err != nil {
			t.Fatal(err)
		}
		from = to
	}
	if mod != nil {
		if _, err := st.UpdateServer(name, func(s *state.Server) error { mod(s); return nil }); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHandlers runs every handler on its own against a real store and a
// fakeMachine: the Machine verbs it calls and what it leaves on the record.
func TestHandlers(t *testing.T) {
	inv := exampleInventory(t)
	ws := inv.Servers[0]
	inv.Profile("hypervisor").Erase = inventory.EraseZero
	inv.Profile("hypervisor").EraseOverrides = []inventory.EraseOverride{{Disks: inventory.DiskMatch{Transport: "nvme"}, Method: inventory.EraseSecure}}
	tests := []struct {
		action plan.Action
		at     state.Lifecycle // "" creates no record
		mod    func(*state.Server)
		step   plan.Step
		noBMC  bool
		calls  []string
		check  func(t *testing.T, s state.Server, st *state.Store)
	}{
		{action: plan.ActRegister, step: plan.Step{Server: ws.Name}, check: func(t *testing.T, s state.Server, _ *state.Store) {
			if s.Lifecycle != state.LifecycleNew || s.BootMAC != ws.BootMAC {
				t.Errorf("registered %+v", s)
			}
		}},
		{action: plan.ActUpdateIdentity, at: state.LifecycleReady, mod: func(s *state.Server) { s.Zone, s.Stalled = "old", "x" }, step: plan.Step{Server: ws.Name},
			check: func(t *testing.T, s state.Server, _ *state.Store) {
				if s.Zone != ws.Zone || s.Stalled != "" || s.BMC.Address != ws.BMC.Address {
					t.Errorf("identity %+v", s)
				}
			}},
		// Another BMC forgets what was learned from the old one.
		{action: plan.ActUpdateIdentity, at: state.LifecycleReady, mod: func(s *state.Server) {
			s.BMC.Address, s.BMC.Quirks, s.BMC.Security = "old-bmc:623", []string{"bootModeIgnored"}, "cipher suite 3 (x)"
		}, step: plan.Step{Server: ws.Name},
			check: func(t *testing.T, s state.Server, _ *state.Store) {
				if s.BMC.Address != ws.BMC.Address || s.BMC.Quirks != nil || s.BMC.Security != "" {
					t.Errorf("after a BMC change: %+v, want no quirks or security", s.BMC)
				}
			}},
		// The same BMC keeps them.
		{action: plan.ActUpdateIdentity, at: state.LifecycleReady, mod: func(s *state.Server) {
			s.Zone, s.BMC.Quirks = "old", []string{"bootModeIgnored"}
			s.BMC.Driver, s.BMC.Address, s.BMC.SystemID = string(ws.BMC.Driver), ws.BMC.Address, ws.BMC.SystemID
		}, step: plan.Step{Server: ws.Name},
			check: func(t *testing.T, s state.Server, _ *state.Store) {
				if s.Zone != ws.Zone || len(s.BMC.Quirks) != 1 {
					t.Errorf("same BMC: %+v, want its quirks kept", s.BMC)
				}
			}},
		// The allocation fixes each commissioned disk's erase method:
		// the profile's NVMe override (secure), else its erase (zero).
		{action: plan.ActAllocate, at: state.LifecycleReady, mod: func(s *state.Server) {
			s.Hardware = &state.Hardware{Disks: []state.Disk{
				{Name: "nvme0n1", SizeBytes: 960 << 30, ByPath: "pci-0000:3b:00.0-nvme-1", Transport: "nvme"},
				{Name: "sda", SizeBytes: 480 << 30, Serial: "ZC1ABCDE", Transport: "sata"},
			}}
		}, step: plan.Step{Server: ws.Name, Profile: "hypervisor", AllocReason: plan.ReasonCount},
			check: func(t *testing.T, s state.Server, _ *state.Store) {
				if s.Lifecycle != state.LifecycleAllocated || s.Allocation == nil || s.Allocation.Image != inv.Profile("hypervisor").Image || s.Allocation.Erase != "zero" {
					t.Errorf("allocated %+v", s.Allocation)
				}
				want := []state.EraseDisk{{Name: "nvme0n1", ByPath: "pci-0000:3b:00.0-nvme-1", SizeBytes: 960 << 30, Method: "secure"}, {Name: "sda", Serial: "ZC1ABCDE", SizeBytes: 480 << 30, Method: "zero"}}
				if s.Allocation != nil && !reflect.DeepEqual(s.Allocation.EraseDisks, want) {
					t.Errorf("allocation's erase per disk %+v, want %+v", s.Allocation.EraseDisks, want)
				}
			}},
		{action: plan.ActUnretire, at: state.LifecycleRetired, step: plan.Step{Server: ws.Name}, check: lifecycleIs(state.LifecycleNew)},
		{action: plan.ActCommission, at: state.LifecycleNew, step: plan.Step{Server: ws.Name}, calls: []string{"prepare:commissioning", "netboot"}, check: lifecycleIs(state.LifecycleCommissioning)},
		{action: plan.ActDeploy, at: state.LifecycleAllocated, step: plan.Step{Server: ws.Name}, calls: []string{"prepare:deploying", "netboot"}, check: lifecycleIs(state.LifecycleDeploying)},
		{action: plan.ActRenetboot, at: state.LifecycleCommissioning, step: plan.Step{Server: ws.Name, Why: "silent"}, calls: []string{"prepare:commissioning", "netboot"},
			check: func(t *testing.T, s state.Server, _ *state.Store) {
				if s.Renetboots != 1 || s.Power.State != state.PowerOn {
					t.Errorf("renetboots %d power %s", s.Renetboots, s.Power.State)
				}
			}},
		{action: plan.ActFinishDeploy, at: state.LifecycleDeployed, mod: func(s *state.Server) { s.FinishDeploy, s.BMC.RestoreDisk = true, true },
			step: plan.Step{Server: ws.Name}, calls: []string{"boot-disk"}, check: func(t *testing.T, s state.Server, _ *state.Store) {
				if s.FinishDeploy || s.BMC.RestoreDisk {
					t.Errorf("finish %v restore %v", s.FinishDeploy, s.BMC.RestoreDisk)
				}
			}},
		{action: plan.ActRestoreDisk, at: state.LifecycleReady, mod: func(s *state.Server) { s.BMC.RestoreDisk = true }, step: plan.Step{Server: ws.Name},
			calls: []string{"boot-disk"}, check: func(t *testing.T, s state.Server, st *state.Store) {
				evs, _ := st.Events(state.EventQuery{Server: ws.Name})
				if s.BMC.RestoreDisk || !slices.ContainsFunc(evs, func(e state.Event) bool { return e.Kind == "boot.disk_restored" }) {
					t.Errorf("restore %v events %+v", s.BMC.RestoreDisk, evs)
				}
			}},
		{action: plan.ActRelease, at: state.LifecycleDeployed, mod: func(s *state.Server) {
			s.Allocation = &state.Allocation{Profile: "hypervisor", Erase: "zero", EraseDisks: []state.EraseDisk{{Name: "nvme0n1", ByPath: "pci-0000:3b:00.0-nvme-1", Method: "secure"}}}
		},
			step: plan.Step{Server: ws.Name}, calls: []string{"power-off"},
			check: func(t *testing.T, s state.Server, _ *state.Store) {
				if s.Lifecycle != state.LifecycleReady || !s.NeedsWipe || s.Power.State != state.PowerOff || s.WipeErase != "zero" || s.Allocation != nil ||
					len(s.WipeEraseDisks) != 1 || s.WipeEraseDisks[0].Method != "secure" || s.WipeEraseDisks[0].ByPath != "pci-0000:3b:00.0-nvme-1" {
					t.Errorf("released %s wipe %v (erase %q, per disk %+v) power %s", s.Lifecycle, s.NeedsWipe, s.WipeErase, s.WipeEraseDisks, s.Power.State)
				}
			}},
		{action: plan.ActWipe, at: state.LifecycleReady, mod: func(s *state.Server) { s.NeedsWipe = true }, step: plan.Step{Server: ws.Name}, calls: []string{"prepare:ready", "netboot"},
			check: func(t *testing.T, s state.Server, _ *state.Store) {
				if s.WipeStartedAt.IsZero() {
					t.Error("wipe not marked as started")
				}
			}},
		{action: plan.ActWipe, at: state.LifecycleReady, step: plan.Step{Server: ws.Name}, check: lifecycleIs(state.LifecycleReady)}, // no wipe pending: no boot
		{action: plan.ActRetire, at: state.LifecycleReady, step: plan.Step{Server: ws.Name}, calls: []string{"power-off"}, check: lifecycleIs(state.LifecycleRetired)},
		{action: plan.ActRetire, at: state.LifecycleReady, noBMC: true, step: plan.Step{Server: ws.Name}, check: lifecycleIs(state.LifecycleRetired)},
		{action: plan.ActTimeout, at: state.LifecycleCommissioning, step: plan.Step{Server: ws.Name, Why: "deadline"}, calls: []string{"power-off"},
			check: func(t *testing.T, s state.Server, _ *state.Store) {
				if s.Lifecycle != state.LifecycleFailed || s.LastError != "deadline" {
					t.Errorf("timed out %s %q", s.Lifecycle, s.LastError)
				}
			}},
		{action: plan.ActPowerOn, at: state.LifecycleReady, step: plan.Step{Server: ws.Name}, calls: []string{"power-on"}, check: powerIs(state.PowerOn)},
		{action: plan.ActPowerOff, at: state.LifecycleReady, step: plan.Step{Server: ws.Name}, calls: []string{"power-off"}, check: powerIs(state.PowerOff)},
		{action: plan.ActPowerCycle, at: state.LifecycleReady, step: plan.Step{Server: ws.Name}, calls: []string{"power-cycle"}, check: powerIs(state.PowerOn)},
	}
	for _, tt := range tests {
		t.Run(string(tt.action), func(t *testing.T) {
			st := openEnrolStore(t)
			m := &fakeMachine{}
			// BeforeNetboot (the boot script's token is minted
			// then) runs before every netboot, once the new lifecycle is
			// recorded: it is recorded as prepare:<lifecycle then>.
			before := func(_ context.Context, server, mac string) {
				s, _ := st.Server(server)
				if mac != s.BootMAC {
					t.Errorf("BeforeNetboot(%s, %s): the server's boot MAC is %s", server, mac, s.BootMAC)
				}
				_ = m.record("prepare:" + string(s.Lifecycle))
			}
			c, err := New(Config{Store: st, Drivers: driverFunc(nil), Logger: testLogger(t), BeforeNetboot: before})
			if err != nil {
				t.Fatal(err)
			}
			if tt.at != "" {
				serverAt(t, st, ws.Name, tt.at, tt.mod)
			}
			tt.step.Action = tt.action
			x := &stepCtx{step: tt.step, desired: inv, ws: inv.Server(ws.Name), log: testLogger(t)}
			x.obs, _ = st.Server(ws.Name)
			if !tt.noBMC {
				x.m = m
			}
			if err := handlers[tt.action](c, context.Background(), x); err != nil {
				t.Fatalf("%s: %v", tt.action, err)
			}
			if got := m.got(); !slices.Equal(got, tt.calls) {
				t.Errorf("%s called %v, want %v", tt.action, got, tt.calls)
			}
			s, err := st.Server(ws.Name)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, s, st)
		})
	}
}

// TestAdoptHandler: adopt moves an auto-enrolled record to the
// servers.yaml name; resumed after that, it is a no-op.
func TestAdoptHandler(t *testing.T) {
	st := openEnrolStore(t)
	c, err := New(Config{Store: st, Drivers: driverFunc(nil), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateServer(state.Server{Name: "auto-525400250201", BootMAC: "52:54:00:25:02:01", Enrolled: &state.Enrolment{At: planT0}}); err != nil {
		t.Fatal(err)
	}
	x := &stepCtx{step: plan.Step{Server: "r9-n01", Action: plan.ActAdopt, From: "auto-525400250201"}, log: testLogger(t)}
	for range 2 {
		if err := c.adopt(context.Background(), x); err != nil {
			t.Fatal(err)
		}
	}
	if s, err := st.Server("r9-n01"); err != nil || s.BootMAC != "52:54:00:25:02:01" {
		t.Errorf("adopted %+v, %v", s, err)
	}
}

// TestTimeoutHandlerPowerFails: a BMC that cannot power off does not keep
// a server past its deadline from failing.
func TestTimeoutHandlerPowerFails(t *testing.T) {
	st := openEnrolStore(t)
	c, err := New(Config{Store: st, Drivers: driverFunc(nil), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	serverAt(t, st, "s1", state.LifecycleDeploying, nil)
	obs, _ := st.Server("s1")
	m := &fakeMachine{err: errors.New("bmc down")}
	x := &stepCtx{step: plan.Step{Server: "s1", Action: plan.ActTimeout, Why: "deploy deadline"}, obs: obs, m: m, log: testLogger(t)}
	if err := c.timeout(context.Background(), x); err != nil {
		t.Fatal(err)
	}
	if s, _ := st.Server("s1"); s.Lifecycle != state.LifecycleFailed || s.Power.State == state.PowerOff {
		t.Errorf("after a failed power off: %s, power %s; want failed and power not recorded off", s.Lifecycle, s.Power.State)
	}
}

// TestRunUsesMachine: run opens the server's Machine for a BMC step,
// journals the step before the handler and clears the journal after it,
// recording the action counter; a store-only step opens nothing.
func TestRunUsesMachine(t *testing.T) {
	st := openEnrolStore(t)
	drv := &countingDrivers{d: &recordingDriver{}}
	c, err := New(Config{Store: st, Drivers: drv, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	m := &fakeMachine{}
	c.machines = func(bmc.Driver, state.Server, bmc.BootMode, *slog.Logger) Machine { return m }
	serverAt(t, st, "s1", state.LifecycleReady, nil)
	if err := c.run(context.Background(), plan.Step{Server: "s1", Action: plan.ActPowerCycle, Counter: 3}, nil, testLogger(t)); err != nil {
		t.Fatal(err)
	}
	s, _ := st.Server("s1")
	if got := m.got(); !slices.Equal(got, []string{"power-cycle"}) || s.InFlight != nil || s.Actions["powerCycle"] != 3 {
		t.Errorf("calls %v, journal %+v, counters %v", got, s.InFlight, s.Actions)
	}
	if err := c.run(context.Background(), plan.Step{Server: "s1", Action: plan.ActAllocate, Profile: "p"}, &inventory.Inventory{}, testLogger(t)); err != nil {
		t.Fatal(err)
	}
	if drv.opened != 1 {
		t.Errorf("drivers opened %d, want 1 (the store-only allocate opens none)", drv.opened)
	}
}

func lifecycleIs(lc state.Lifecycle) func(*testing.T, state.Server, *state.Store) {
	return func(t *testing.T, s state.Server, _ *state.Store) {
		if s.Lifecycle != lc {
			t.Errorf("lifecycle %s, want %s", s.Lifecycle, lc)
		}
	}
}

func powerIs(p state.Power) func(*testing.T, state.Server, *state.Store) {
	return func(t *testing.T, s state.Server, _ *state.Store) {
		if s.Power.State != p {
			t.Errorf("power %s, want %s", s.Power.State, p)
		}
	}
}

// TestConfirmOff: the confirm-off step reads the power from the BMC; a
// machine the ramdisk said it powers off but that is still on (its kernel
// hung on the way down, as a VM lab guest did) is powered off with a
// power.forced_off event; one that is off only gets its power recorded
// as read from the BMC; a server whose power a command moved on since the
// plan (no longer the agent's word) is left alone. A BMC sweep that read
// the machine on after the ramdisk's word (within the minute before
// confirm-off runs) settles nothing: confirm-off reads the BMC itself and
// powers the machine off.
func TestConfirmOff(t *testing.T) {
	for _, tc := range []struct {
		name      string
		source    state.PowerSource
		sweep     state.Power // what the BMC sweep read after it, "" for no sweep
		bmcReads  bmc.PowerState
		wantCalls []string
		wantEvent bool
	}{
		{"hung on", state.PowerSourceAgent, "", bmc.PowerOn, []string{"power-state", "power-off"}, true},
		{"off", state.PowerSourceAgent, "", bmc.PowerOff, []string{"power-state"}, false},
		{"moved on", state.PowerSourceCommand, "", bmc.PowerOn, nil, false},
		{"sweep read on", state.PowerSourceAgent, state.PowerOn, bmc.PowerOn, []string{"power-state", "power-off"}, true},
		{"sweep read on, off by now", state.PowerSourceAgent, state.PowerOn, bmc.PowerOff, []string{"power-state"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := openEnrolStore(t)
			serverAt(t, st, "s1", state.LifecycleReady, nil)
			if _, err := st.SetPower("s1", state.PowerOff, tc.source); err != nil {
				t.Fatal(err)
			}
			if tc.sweep != "" {
				if _, err := st.ObserveBMC("s1", time.Now().Add(time.Second), tc.sweep, "OK"); err != nil {
					t.Fatal(err)
				}
				if s, _ := st.Server("s1"); s.Power.State != tc.sweep || s.Power.Source != state.PowerSourceBMC {
					t.Fatalf("power after the sweep = %+v, want %s from the BMC", s.Power, tc.sweep)
				}
			}
			c, err := New(Config{Store: st, Drivers: &countingDrivers{d: &recordingDriver{}}, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			m := &fakeMachine{power: tc.bmcReads}
			obs, _ := st.Server("s1")
			x := &stepCtx{step: plan.Step{Server: "s1", Action: plan.ActConfirmOff}, obs: obs, m: m, log: testLogger(t)}
			if err := c.confirmOff(context.Background(), x); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantCalls, m.got()); diff != "" {
				t.Errorf("machine calls (-want +got):\n%s", diff)
			}
			s, _ := st.Server("s1")
			if tc.source == state.PowerSourceAgent && (s.Power.State != state.PowerOff || s.Power.Source != state.PowerSourceBMC || !s.Power.OffClaimedAt.IsZero()) {
				t.Errorf("power after confirm-off = %+v, want off read from the BMC, no claim pending", s.Power)
			}
			evs, err := st.Events(state.EventQuery{Server: "s1"})
			if err != nil {
				t.Fatal(err)
			}
			forced := false
			for _, e := range evs {
				forced = forced || e.Kind == "power.forced_off"
			}
			if forced != tc.wantEvent {
				t.Errorf("power.forced_off event %v, want %v", forced, tc.wantEvent)
			}
		})
	}
}
