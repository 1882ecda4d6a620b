package reconciler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/redact"
	"github.com/machina-metal/machina/state"
)

// Drivers opens the BMC driver of a server from its observed BMC facts
// (driver, address, credential name). Implementations own and cache the
// drivers (one Redfish session per BMC) and MUST be safe for concurrent use.
type Drivers interface {
	Driver(ctx context.Context, srv state.Server) (bmc.Driver, error)
}

// Config configures a Controller. Every zero value is usable.
type Config struct {
	// Store is the observed state. Required.
	Store *state.Store
	// Drivers opens BMC drivers. Required.
	Drivers Drivers
	// Logger receives Info lines for hardware actions and phase changes;
	// nil discards.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Workers bounds actions running at once; zero means 8.
	Workers int
	// PerBMC bounds actions at once against one BMC address (several
	// servers may share a chassis BMC); zero means 1.
	PerBMC int
	// PerRack bounds actions at once in one rack (power draw, switch
	// ports); zero means 4.
	PerRack int
	// BackoffBase is the first retry delay after a failed action; zero
	// means 10 s. Each further failure doubles it, with ±20% jitter.
	BackoffBase time.Duration
	// BackoffCap caps the retry delay; zero means 10 minutes.
	BackoffCap time.Duration
	// ActionTimeout bounds one action (all its BMC calls); zero means 5 minutes.
	ActionTimeout time.Duration
	// ShutdownGrace is how long the actions still running when Run's
	// context ends may go on to finish; then their contexts are cancelled
	// (cause ErrShutdown) and Run returns once they have, or
	// shutdownDrain later at most. An action cut off so is not a failure
	// of its server: nothing is recorded, its journal entry stays, and it
	// is resumed on the next start, as after a SIGKILL. Zero means 30 s;
	// negative cancels them at once.
	ShutdownGrace time.Duration
	// Interval is how often the controller plans without a trigger; zero
	// means 5 s.
	Interval time.Duration
	// MinRest is the least time from the end of one planning pass to the
	// start of the next (a pass that took d rests max(2d, MinRest), capped
	// at Interval), so that the store changes of many machines' reports
	// and finished actions arriving meanwhile are planned in one pass, not
	// one pass each; zero means 100 ms, negative means none.
	MinRest time.Duration
	// Plan holds the plan options (deadlines, brake share); Now and
	// Approved are filled by the controller.
	Plan plan.Options
	// ImageOf resolves a profile's image name to the image recorded on the
	// allocation; nil records the name as given.
	ImageOf func(profile string) string
	// DeployReady, when set, says whether a deploy with profile p can
	// start now (nil) or must wait (an error saying why, e.g. its image is
	// still being imported). A waiting deploy is not attempted and not
	// counted as a failure; it is planned again on the next pass. Without
	// it, a deploy started before its image is verified boots a ramdisk
	// that gets no plan and the server sits in deploying until the deadline.
	DeployReady func(p inventory.Profile) error
	// FirmwareTaskPoll is how often the firmware step reads a BMC task
	// it follows (an update, a Dell configuration job); zero means 5
	// seconds.
	FirmwareTaskPoll time.Duration
	// FirmwareImages offers the firmware catalog's files to BMCs (the
	// controller's /firmware/ handler); nil refuses every firmware
	// update (ErrFirmwareRefused), the other firmware changes still run.
	FirmwareImages FirmwareImages
	// ISOURL is the BIOS iPXE ISO's URL (machina-ipxe-bios.iso) for BMCs
	// without a PXE boot override (virtual media path), used for servers
	// whose bootMode is bios (or unset); "" disables that fallback for them.
	ISOURL string
	// UEFIISOURL is the UEFI iPXE ISO's URL (machina-ipxe-uefi.iso: an El
	// Torito EFI image), used instead of ISOURL for servers whose bootMode
	// is uefi; "" disables the virtual-media fallback for them (a BIOS ISO
	// does not boot on UEFI-only firmware).
	UEFIISOURL string
	// SBISOURL is the Secure Boot ISO's URL (machina-sb-uefi.iso from
	// scripts/metal/build-sb-iso.sh: shim, Debian's signed GRUB), used
	// instead of ISOURL and UEFIISOURL for servers whose profile sets
	// firmware.secureBoot: true; "" disables the virtual-media fallback
	// for them (the iPXE ISOs do not boot with Secure Boot on).
	SBISOURL string
	// BeforeNetboot, when set, is called with the server's name and boot
	// MAC right before the executor netboots it into the ramdisk
	// (commission, deploy, re-netboot, release wipe), after the new
	// lifecycle is recorded: the controller mints the boot script's token
	// then (ipxe.Handler.Prepare), seconds before the machine's firmware
	// asks for the script, so that a boot storm's script requests only
	// read. It must not block for long; the executor ignores
	// what it does (the script request mints a token itself when none was
	// prepared).
	BeforeNetboot func(ctx context.Context, server, bootMAC string)
	// OnPass, when set, is called after every planning pass with the plan
	// (for status write-back and metrics). It must not block for long.
	OnPass func(plan.Result)
	// Metrics, when set, counts actions and passes.
	Metrics *Metrics
	// Scope, when set, limits every pass to a controller group's zones
	// (machina serve --group/--zones): the plan, the resumed journal
	// entries and the metrics see only the group's servers and profiles
	// (Scope.Apply). nil plans the whole inventory, as before.
	Scope *plan.Scope
	// Claims returns every group's recorded zone claims (group → zones,
	// state.Store.ZoneClaims), read each pass with Scope set; an error
	// skips the pass (a group never plans without knowing who else claims
	// its zones). Required with Scope.
	Claims func() (map[string][]string, error)
}

// Controller is the executor: it plans desired against observed state and
// runs the steps with a bounded worker pool, one action at a time per
// server, per-BMC and per-rack limits, timeouts and per-server exponential
// backoff. Every outcome is an event in the store.
type Controller struct {
	cfg     Config
	log     *slog.Logger
	trigger chan struct{}

	mu       sync.Mutex
	desired  *inventory.Inventory
	busy     map[string]bool      // server → an action is running
	inflight map[string]plan.Step // server → the step running (for the plan's view of in-flight allocations)
	bmcUse   map[string]int       // BMC address → running actions
	fwUse    map[string]bool      // BMC address → a firmware step runs against it
	rackUse  map[string]int       // rack → running actions
	running  int
	last     plan.Result
	// holdDeploys is set while the newest inventory revision is invalid.
	holdDeploys bool
	// passMu is held by a planning pass from its snapshot to the end of
	// its dispatch, and by refill: steps start from one plan at a time,
	// and never between a pass's read of the running steps and its
	// dispatch (observe counts running allocations as done).
	passMu sync.Mutex
	// backlog (under passMu) is the last pass's steps not tried yet
	// because every worker was busy; refill starts them as workers free
	// up. nil when there are none, and dropped by the next pass.
	backlog     *backlog
	provisionMu sync.Mutex
	wg          sync.WaitGroup
	// stopping ends (cause ErrShutdown) when the shutdown grace has
	// passed: every running action's context is cancelled with it.
	stopping    context.Context
	stopActions context.CancelCauseFunc
	// machines, when set (tests), makes each step's Machine instead of
	// bmcMachine.
	machines func(drv bmc.Driver, obs state.Server, mode bmc.BootMode, log *slog.Logger) Machine
}

// New checks cfg and returns a Controller. It starts nothing; call Run.
func New(cfg Config) (*Controller, error) {
	if cfg.Store == nil || cfg.Drivers == nil {
		return nil, errors.New("reconciler: Config.Store and Config.Drivers are required")
	}
	if cfg.Scope != nil && cfg.Claims == nil {
		return nil, errors.New("reconciler: Config.Scope needs Config.Claims")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.FirmwareTaskPoll <= 0 {
		cfg.FirmwareTaskPoll = 5 * time.Second
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 8
	}
	if cfg.PerBMC <= 0 {
		cfg.PerBMC = 1
	}
	if cfg.PerRack <= 0 {
		cfg.PerRack = 4
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = 10 * time.Second
	}
	if cfg.BackoffCap <= 0 {
		cfg.BackoffCap = 10 * time.Minute
	}
	if cfg.ActionTimeout <= 0 {
		cfg.ActionTimeout = 5 * time.Minute
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = DefaultShutdownGrace
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Second
	}
	if cfg.MinRest == 0 {
		cfg.MinRest = defaultMinRest
	}
	stopping, stopActions := context.WithCancelCause(context.Background())
	return &Controller{
		cfg: cfg, log: cfg.Logger, trigger: make(chan struct{}, 1),
		busy: map[string]bool{}, inflight: map[string]plan.Step{},
		bmcUse: map[string]int{}, rackUse: map[string]int{}, fwUse: map[string]bool{},
		stopping: stopping, stopActions: stopActions,
	}, nil
}

// SetDesired installs a new valid inventory revision and plans at once.
// nil means "no valid revision yet": nothing is acted on.
func (c *Controller) SetDesired(inv *inventory.Inventory) {
	c.mu.Lock()
	c.desired = inv
	c.mu.Unlock()
	c.Trigger()
}

// Desired returns the inventory the controller acts on, or nil.
func (c *Controller) Desired() *inventory.Inventory {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.desired
}

// Trigger asks for a planning pass now. Never blocks.
func (c *Controller) Trigger() {
	select {
	case c.trigger <- struct{}{}:
	default:
	}
}

// LastPlan returns the plan of the latest pass.
func (c *Controller) LastPlan() plan.Result {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// defaultMinRest is Config.MinRest's default: at 1,000 servers a pass
// takes a few milliseconds, so without a floor a busy fleet planned about
// once per lifecycle transition; 100 ms adds at most that to a step's
// start and plans the changes of everything that reported meanwhile
// together.
const defaultMinRest = 100 * time.Millisecond

// Run plans and executes until ctx is done, then stops (drain): the
// actions still running get Config.ShutdownGrace to finish, after which
// their contexts are cancelled and Run returns once they have returned
// (shutdownDrain at most); it returns nil. Store changes (a report moving
// a server to ready, say) trigger a pass. Planning takes at most a third
// of one CPU: a pass that took d is followed by at least max(2d, MinRest)
// (capped at Interval) before the next, so on a busy fleet (plan.Compute
// of 10,000 servers: BenchmarkPlan10k) the changes of many reports are
// planned in one pass instead of one pass each.
func (c *Controller) Run(ctx context.Context) error {
	notify, stop := c.cfg.Store.Notify()
	defer stop()
	tick := time.NewTicker(c.cfg.Interval)
	defer tick.Stop()
	for {
		t0 := time.Now()
		c.Pass(ctx)
		end := time.Now()
		rest := c.restAfter(end.Sub(t0))
		select {
		case <-ctx.Done():
			c.drain()
			return nil
		case <-tick.C:
		case <-c.trigger:
		case <-notify:
		}
		if wait := time.Until(end.Add(rest)); wait > 0 {
			select {
			case <-ctx.Done():
				c.drain()
				return nil
			case <-time.After(wait):
			}
		}
	}
}

// DefaultShutdownGrace is Config.ShutdownGrace's default: long enough for
// a BMC call in flight and the short waits after it (a boot override read
// back, a power state seen), well inside systemd's 90 s stop timeout; a
// power wait of a machine that never reads on (5 minutes at most) is not
// waited for.
const DefaultShutdownGrace = 30 * time.Second

// shutdownDrain bounds how long Run waits, after cancelling the running
// actions, for them to return: a BMC call that ignores its context must
// not hold the process. What it still does then reaches a store that is
// being closed.
const shutdownDrain = 10 * time.Second

// ErrShutdown is the cause of a running action's context cancelled
// because the controller stopped (Config.ShutdownGrace passed).
var ErrShutdown = errors.New("controller shutting down")

// drain waits for the running actions: ShutdownGrace, then cancels their
// contexts (ErrShutdown) and waits shutdownDrain more at most.
func (c *Controller) drain() {
	done := make(chan struct{})
	go func() {
		c.wg.Wait()
		close(done)
	}()
	running := func() []string {
		c.mu.Lock()
		defer c.mu.Unlock()
		return slices.Sorted(maps.Keys(c.inflight))
	}
	if grace := c.cfg.ShutdownGrace; grace > 0 {
		if names := running(); len(names) > 0 {
			c.log.Info("stopping: waiting for running actions", "grace", grace, "machines", names)
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-done:
			c.stopActions(ErrShutdown)
			return
		case <-t.C:
		}
	}
	if names := running(); len(names) > 0 {
		c.log.Info("stopping: shutdown grace passed, interrupting running actions", "grace", c.cfg.ShutdownGrace, "machines", names)
	}
	c.stopActions(ErrShutdown)
	t := time.NewTimer(shutdownDrain)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		c.log.Warn("stopping: actions did not return after their contexts were cancelled; not waiting for them", "waited", shutdownDrain, "machines", running())
	}
}

// restAfter is the rest after a planning pass that took d: twice d, at
// least MinRest, at most Interval.
func (c *Controller) restAfter(d time.Duration) time.Duration {
	return min(max(2*d, c.cfg.MinRest), c.cfg.Interval)
}

// Pass runs one planning pass: snapshot, plan, dispatch what can start now.
// Exported for tests that step the controller by hand.
func (c *Controller) Pass(ctx context.Context) plan.Result {
	res, ok := c.planAndDispatch(ctx)
	if !ok {
		return res
	}
	// Steps that finished while the pass held passMu could not refill
	// their workers (refill returned at once): do it for them now.
	c.refill()
	if c.cfg.OnPass != nil {
		c.cfg.OnPass(res)
	}
	return res
}

// planAndDispatch is Pass under passMu: snapshot, plan, dispatch. It
// reports false when the pass was skipped (the snapshot or the zone
// claims could not be read: logged here).
func (c *Controller) planAndDispatch(ctx context.Context) (plan.Result, bool) {
	c.passMu.Lock()
	defer c.passMu.Unlock()
	c.backlog = nil // this pass plans again what the last one left
	start := time.Now()
	snap, err := c.observe()
	if err != nil {
		c.log.Error("snapshot", "err", err)
		return plan.Result{}, false
	}
	desired := c.Desired()
	var scoped []plan.Condition
	if sc := c.cfg.Scope; sc != nil {
		claims, err := c.cfg.Claims()
		if err != nil {
			c.log.Error("zone claims: pass skipped", "group", sc.Group, "err", err)
			return plan.Result{}, false
		}
		desired, snap, scoped = sc.Apply(claims, desired, snap)
	}
	res, waits := c.plan(desired, snap)
	if len(scoped) > 0 {
		res.Conditions = append(res.Conditions, scoped...)
		plan.SortConditions(res.Conditions)
	}
	c.mu.Lock()
	c.last = res
	c.mu.Unlock()
	if c.cfg.Metrics != nil {
		c.cfg.Metrics.observePass(snap, time.Since(start))
	}
	c.dispatch(ctx, res, snap, desired, waits)
	return res, true
}

// observe takes the store's snapshot with the allocations still being
// written counted as done: they may not be in the snapshot yet, and a
// server that became ready meanwhile would be allocated too and the
// profile would end up over its count. The running steps are read before
// the snapshot (no step starts between the two: passes run one at a
// time and refill waits for the pass, passMu), so a step that finished
// in between is in the snapshot.
func (c *Controller) observe() (state.Snapshot, error) {
	allocating := map[string]plan.Step{}
	c.mu.Lock()
	for name, st := range c.inflight {
		if st.Action == plan.ActAllocate {
			allocating[name] = st
		}
	}
	c.mu.Unlock()
	snap, err := c.cfg.Store.Snapshot()
	if err != nil {
		return snap, err
	}
	for name, st := range allocating {
		if shared, ok := snap.Servers[name]; ok && shared.Lifecycle == state.LifecycleReady {
			s := *shared // the snapshot's record is the store's: change a copy
			s.Lifecycle = state.LifecycleAllocated
			s.Allocation = &state.Allocation{Profile: st.Profile, Reason: st.AllocReason, At: c.cfg.Now().UTC()}
			snap.Servers[name] = &s
		}
	}
	return snap, nil
}

// plan runs plan.Compute with the controller's options and marks the deploys that
// cannot start yet (DeployReady: their image is not verified, still
// importing or failed): the step says why and its server gets an
// ImageNotReady condition, so status names it instead of it sitting in
// allocated silently. waits holds those reasons by server.
func (c *Controller) plan(desired *inventory.Inventory, snap state.Snapshot) (res plan.Result, waits map[string]error) {
	opts := c.cfg.Plan
	opts.Now = c.cfg.Now()
	if desired != nil {
		if ok, err := c.cfg.Store.Approved(desired.Digest); err == nil {
			opts.Approved = ok
		}
	}
	res = plan.Compute(desired, snap, opts)
	waits = map[string]error{}
	if c.cfg.DeployReady == nil || desired == nil {
		return res, waits
	}
	for i, s := range res.Steps {
		if s.Action != plan.ActDeploy {
			continue
		}
		if p := desired.Profile(s.Profile); p != nil {
			if err := c.cfg.DeployReady(*p); err != nil {
				waits[s.Server] = err
				res.Steps[i].Waits = err.Error()
				res.Conditions = append(res.Conditions, plan.Condition{Subject: "server/" + s.Server, Type: plan.CondImageNotReady, Reason: plan.CondImageNotReady,
					Message: fmt.Sprintf("deploy of profile %s waits: %v", p.Name, err)})
			}
		}
	}
	if len(waits) > 0 {
		plan.SortConditions(res.Conditions)
	}
	return res, waits
}

// firstSteps picks one step per server: an action in flight (resumed
// after a restart or a failure) comes before anything the plan says. A
// stalled server keeps its journal: the action is resumed once the stall
// is cleared (its credential set again, its BMC settings changed), so a
// deploy that failed on a refused login after the move to deploying boots
// when the secret is fixed instead of waiting for the deploy deadline.
// While stalled, only a plan step for another desired state (a different
// stepKey) runs.
//
// The steps come back in dispatch order: the resumed ones by server
// name, then the plan's in the plan's order. Only the servers already
// taken are kept in a set, not a map of whole steps besides the ordered
// list: a pass at 10,000 servers plans thousands of steps, and that map
// was 0.8 of the 16.8 GB a 10,000-server bench/scale run allocated.
func firstSteps(res plan.Result, snap state.Snapshot) []plan.Step {
	// The servers with a journal entry to resume, in name order: found
	// in one walk of the map and only they sorted (not the whole fleet's
	// names each pass).
	var resumed []string
	for name, srv := range snap.Servers {
		if srv.InFlight != nil && srv.Stalled == "" {
			resumed = append(resumed, name)
		}
	}
	slices.Sort(resumed)
	out := make([]plan.Step, 0, len(resumed)+len(res.Steps))
	taken := make(map[string]struct{}, len(resumed)+len(res.Steps))
	for _, name := range resumed {
		f := snap.Servers[name].InFlight
		out = append(out, plan.Step{Server: name, Action: plan.Action(f.Action), Counter: f.Counter, Why: "resume " + f.Action})
		taken[name] = struct{}{}
	}
	for _, s := range res.Steps {
		if _, ok := taken[s.Server]; ok {
			continue
		}
		taken[s.Server] = struct{}{}
		out = append(out, s)
	}
	return out
}

// dispatch starts, in order, every server's first step that nothing holds
// back (held) and that the limits admit. The steps left untried because
// every worker was busy become the backlog refill works through (not for
// a scoped controller: its zone claims are read once a pass, and a step
// must not start after the pass that read them).
func (c *Controller) dispatch(ctx context.Context, res plan.Result, snap state.Snapshot, desired *inventory.Inventory, waits map[string]error) {
	b := &backlog{ctx: ctx, steps: firstSteps(res, snap), snap: snap, desired: desired, waits: waits}
	c.startSteps(b)
	if len(b.steps) > 0 && c.cfg.Scope == nil {
		c.backlog = b
	}
}

// backlog is a pass's dispatch state: the steps not tried yet (in
// dispatch order) with what the pass planned them from.
type backlog struct {
	ctx     context.Context
	steps   []plan.Step
	snap    state.Snapshot // read-only: shared with the store's cache
	desired *inventory.Inventory
	waits   map[string]error
}

// startSteps tries b's steps in order and removes each one tried: it
// starts it, or drops it when held, refused by its server's limits
// (busy, backoff, per-BMC, per-rack) or stale. It stops at the first
// step that finds every worker busy (that step stays first) or when the
// controller stops (nothing stays).
func (c *Controller) startSteps(b *backlog) {
	now := c.cfg.Now()
	hold := c.deploysHeld()
	var none state.Server // what a step without a record sees: read-only
	for len(b.steps) > 0 {
		step := b.steps[0]
		name := step.Server
		if b.ctx.Err() != nil || c.stopping.Err() != nil {
			b.steps = nil
			return // stopping: nothing new starts
		}
		obs, known := b.snap.Servers[name] // shared with the store's cache: read-only
		if !known {
			obs = &none
		}
		if c.held(step, obs, b.desired, hold, b.waits[name]) {
			b.steps = b.steps[1:]
			continue
		}
		switch c.tryStart(step, obs, now) {
		case workersBusy:
			return
		case refused:
			b.steps = b.steps[1:]
			continue
		}
		b.steps = b.steps[1:]
		if known {
			// The plan is only as fresh as the snapshot: an action on this
			// server that finished after the snapshot (its lifecycle moved,
			// its journal cleared) makes the step stale, and running it
			// again would, say, reset a machine that is already writing
			// its image. Replan from the current record instead.
			if cur, err := c.cfg.Store.Server(name); err != nil || cur.Revision != obs.Revision {
				c.unreserve(step, obs)
				c.Trigger()
				continue
			}
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.execute(b.ctx, step, b.desired)
		}()
	}
}

// refill starts the last pass's backlog on the workers that are free,
// called when a step finishes: at 10,000 servers a pass plans thousands
// of steps and takes tens of milliseconds plus its rest, and an action
// against a quick BMC takes less, so without it most workers sat idle
// until the next pass. A step starts from its pass's plan only while
// that plan's inventory revision is still the one acted on and its
// server's record is unchanged since the pass's snapshot (startSteps'
// revision check, as in the pass itself). A pass running now (passMu
// taken) makes refill return at once: that pass dispatches, and refills
// once more after it lets passMu go.
func (c *Controller) refill() {
	if !c.passMu.TryLock() {
		return
	}
	defer c.passMu.Unlock()
	b := c.backlog
	if b == nil {
		return
	}
	if c.Desired() != b.desired {
		c.backlog = nil // a new revision: the next pass plans it
		return
	}
	c.startSteps(b)
	if len(b.steps) == 0 {
		c.backlog = nil
	}
}

// held reports whether step must not start in this pass: a new deploy or
// allocation while the newest revision is invalid (no new disk write
// starts), a deploy whose image is not ready (wait, the reason planned in
// this pass, if any), a firmware step whose catalog files are not
// imported yet, or a step for the desired state the server is stalled
// on.
func (c *Controller) held(step plan.Step, obs *state.Server, desired *inventory.Inventory, hold bool, wait error) bool {
	if hold && (step.Action == plan.ActDeploy || step.Action == plan.ActAllocate) && !strings.HasPrefix(step.Why, "resume") {
		return true
	}
	if step.Action == plan.ActFirmware && c.cfg.FirmwareImages != nil && desired != nil {
		// The catalog files it may offer must be imported first: a
		// failed firmware step stalls the server.
		if p := desired.Profile(step.Profile); p != nil && p.Firmware != nil {
			for _, v := range p.Firmware.Versions {
				if err := c.cfg.FirmwareImages.Ready(v.Image); err != nil {
					c.log.Debug("firmware waits", "machine", step.Server, "image", v.Image, "reason", err)
					return true
				}
			}
		}
	}
	if step.Action == plan.ActDeploy && c.cfg.DeployReady != nil && desired != nil {
		if p := desired.Profile(step.Profile); p != nil {
			err := wait
			if err == nil {
				err = c.cfg.DeployReady(*p)
			}
			if err != nil {
				c.log.Debug("deploy waits", "machine", step.Server, "profile", p.Name, "reason", err)
				return true
			}
		}
	}
	return obs.Stalled != "" && obs.Stalled == stepKey(step, desired)
}

// startResult is tryStart's answer.
type startResult int

const (
	started     startResult = iota // the limits are reserved: run the step
	refused                        // not this server now: busy, backoff, per-BMC or per-rack limit
	workersBusy                    // every worker is busy (Config.Workers)
)

// tryStart reserves the limits for step, or reports why not: the server
// is busy, its backoff after a failure (obs.RetryAt, kept on the record)
// has not passed, or a per-BMC or per-rack limit is reached (refused),
// or every worker is busy (workersBusy).
func (c *Controller) tryStart(step plan.Step, obs *state.Server, now time.Time) startResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.busy[step.Server] || now.Before(obs.RetryAt) {
		return refused
	}
	if c.running >= c.cfg.Workers {
		return workersBusy
	}
	addr, rack := obs.BMC.Address, obs.Rack
	if !info(step.Action).Unlimited {
		if addr != "" && c.bmcUse[addr] >= c.cfg.PerBMC {
			return refused
		}
		// One firmware step per BMC whatever PerBMC allows: a BMC runs
		// one update at a time and restarts after it (servers sharing a
		// chassis BMC share its UpdateService).
		if step.Action == plan.ActFirmware && addr != "" && c.fwUse[addr] {
			return refused
		}
		if rack != "" && c.rackUse[rack] >= c.cfg.PerRack {
			return refused
		}
	}
	c.busy[step.Server] = true
	c.inflight[step.Server] = step
	c.running++
	if !info(step.Action).Unlimited {
		c.bmcUse[addr]++
		if step.Action == plan.ActFirmware && addr != "" {
			c.fwUse[addr] = true
		}
		c.rackUse[rack]++
	}
	return started
}

// unreserve gives back what tryStart reserved for a step that did not run.
func (c *Controller) unreserve(step plan.Step, obs *state.Server) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.busy, step.Server)
	delete(c.inflight, step.Server) // or the next pass plans as if this step ran
	c.running--
	if !info(step.Action).Unlimited {
		c.bmcUse[obs.BMC.Address]--
		if step.Action == plan.ActFirmware {
			delete(c.fwUse, obs.BMC.Address)
		}
		c.rackUse[obs.Rack]--
	}
}

// finish gives back what tryStart reserved for a step that ran. Its
// outcome is on the record already (recordFailure, or done and
// clearBackoff), so a next pass that starts at once sees the backoff.
func (c *Controller) finish(step plan.Step, obs state.Server) {
	c.unreserve(step, &obs)
}

// stepKey identifies the desired state a step serves; a stalled server is
// retried only when it changes (a counter bump, another want or profile).
func stepKey(s plan.Step, desired *inventory.Inventory) string {
	key := fmt.Sprintf("%s/%d/%s", s.Action, s.Counter, s.Profile)
	if desired != nil {
		if ws := desired.Server(s.Server); ws != nil {
			key += fmt.Sprintf("/%s/%s/%s", ws.Want, ws.Profile, ws.BMC.Credentials)
		}
		if s.Action == plan.ActFirmware {
			// A failed firmware step is retried once the profile's
			// firmware block (or a catalog file it names) changes.
			key += "/" + firmwareDigest(desired, s.Profile)
		}
	}
	return key
}

// execute runs one step with its timeout and records the outcome on the
// server's record before it gives the limits back: a failure's error,
// event and backoff in one transaction (recordFailure), a success by
// clearing the backoff; the metric is counted after that write. The
// step's context outlives the pass's (a stopping controller lets it
// finish) until the shutdown grace passes (stopping); a step cut off
// there records nothing (interrupted).
func (c *Controller) execute(ctx context.Context, step plan.Step, desired *inventory.Inventory) {
	obs, _ := c.cfg.Store.Server(step.Server)
	if obs.Fenced != nil && step.Action.PowersOn() {
		// Fenced after this pass planned: the plan drops such steps, and
		// the record read now is the last word.
		c.log.Info("step skipped: the server is fenced", "machine", step.Server, "action", string(step.Action))
		c.finish(step, obs) // give the worker and the server back
		c.refill()
		return
	}
	base, cancelBase := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelBase(nil)
	unhook := context.AfterFunc(c.stopping, func() { cancelBase(context.Cause(c.stopping)) })
	defer unhook()
	ctx, cancel := context.WithTimeout(base, c.cfg.ActionTimeout)
	defer cancel()
	log := c.log.With("machine", step.Server, "action", string(step.Action))
	err := c.run(ctx, step, desired, log)
	switch {
	case err == nil:
		c.clearBackoff(step, obs, log)
	case interrupted(ctx):
		// The controller stopped, the server did not fail: nothing is
		// written. The journal entry (InFlight, with PowerSent once its
		// power action went out) stays as a SIGKILL would leave it, and
		// the next start resumes it, reading the BMC back first.
		log.Info("action interrupted by shutdown; resumed on the next start", "grace", c.cfg.ShutdownGrace, "err", redact.String(err.Error()))
	default:
		c.recordFailure(step, desired, err, log)
	}
	c.finish(step, obs)
	if c.cfg.Metrics != nil {
		c.cfg.Metrics.observeAction(step.Action, err, interrupted(ctx))
	}
	c.refill()
}

// interrupted reports whether a step's context was cancelled by the
// controller's shutdown (ErrShutdown), not by the step's own timeout.
func interrupted(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), ErrShutdown)
}

// SetHoldDeploys stops (true) or allows (false) new disk-writing operations:
// the Git source sets it while the newest inventory revision is invalid, so
// the controller keeps acting on the last good revision but starts no deploy.
func (c *Controller) SetHoldDeploys(hold bool) {
	c.mu.Lock()
	changed := c.holdDeploys != hold
	c.holdDeploys = hold
	c.mu.Unlock()
	if changed {
		c.Trigger()
	}
}

func (c *Controller) deploysHeld() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.holdDeploys
}

// ErrNoBMC: a step that needs the BMC reached a server that has none (an
// auto-enrolled server before `machinactl server bmc-set`). plan.Compute does not
// plan such steps; this guards the executor.
var ErrNoBMC = errors.New("server has no BMC")

// ErrNoCapacity: a provision request asked for more servers than fit.
var ErrNoCapacity = errors.New("not enough ready servers fit the profile")

// Provision allocates n ready servers to profile at once (reason
// "provision", POST /api/v1/provision) and returns their names; the deploys
// follow in the next passes. It allocates nothing when fewer than n fit
// (ErrNoCapacity, with how many do), so a request never half-succeeds.
func (c *Controller) Provision(profile string, n int, actor string) ([]string, error) {
	desired := c.Desired()
	if desired == nil {
		return nil, errors.New("reconciler: no valid inventory revision yet")
	}
	p := desired.Profile(profile)
	if p == nil {
		return nil, fmt.Errorf("reconciler: profile %q is not in profiles.yaml", profile)
	}
	if n <= 0 || n > 1000 {
		return nil, fmt.Errorf("reconciler: count %d: want 1 to 1000", n)
	}
	c.provisionMu.Lock()
	defer c.provisionMu.Unlock()
	snap, err := c.cfg.Store.Snapshot()
	if err != nil {
		return nil, err
	}
	if sc := c.cfg.Scope; sc != nil {
		// A group provisions only from its own, uncontested zones.
		claims, err := c.cfg.Claims()
		if err != nil {
			return nil, fmt.Errorf("reconciler: zone claims: %w", err)
		}
		desired, snap, _ = sc.Apply(claims, desired, snap)
		if p = desired.Profile(profile); p == nil {
			return nil, fmt.Errorf("reconciler: profile %q is not planned by controller group %s (its zone is not one of %s, or another group claims it too)", profile, sc.Group, strings.Join(sc.Zones, ", "))
		}
	}
	cands := plan.Candidates(*p, desired, snap, map[string]string{})
	if len(cands) < n {
		return nil, fmt.Errorf("reconciler: profile %s: %d wanted, %d fit (zone %s): %w", profile, n, len(cands), cmp.Or(p.Zone, "any"), ErrNoCapacity)
	}
	now := c.cfg.Now().UTC()
	var names []string
	for _, s := range cands[:n] {
		_, err := c.cfg.Store.ApplyClaiming(state.Move{Server: s.Name, From: state.LifecycleReady, To: state.LifecycleAllocated, Actor: actor,
			Reason: fmt.Sprintf("provision %s (%d requested)", profile, n),
			Update: func(srv *state.Server) error {
				srv.Allocation = &state.Allocation{Profile: profile, Image: p.Image, At: now, Reason: plan.ReasonProvision, Deploy: string(p.Deploy), Erase: string(p.Erase),
					EraseDisks: plan.EraseDisks(p, srv.Hardware)}
				return nil
			}}, profile, plan.Claims(desired, p, plan.Step{}))
		if err != nil {
			// Undo what this call allocated, so the request does not
			// half-succeed (its pool addresses go back too).
			for _, done := range names {
				_, _ = c.cfg.Store.ApplyReleasing(state.Move{Server: done, From: state.LifecycleAllocated, To: state.LifecycleReady, Actor: actor,
					Reason: "provision rolled back", Update: func(srv *state.Server) error { srv.Allocation = nil; return nil }}, nil)
			}
			return nil, fmt.Errorf("reconciler: provision %s: allocate %s: %w", profile, s.Name, err)
		}
		names = append(names, s.Name)
	}
	c.Trigger()
	return names, nil
}
