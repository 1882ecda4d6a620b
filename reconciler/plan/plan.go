package plan

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// Allocation reasons recorded in state.Allocation.Reason.
const (
	ReasonPinned    = "pinned"    // want: deployed with a profile
	ReasonCount     = "count"     // a profile's count
	ReasonProvision = "provision" // POST /api/v1/provision
)

// Step is one action on one server.
type Step struct {
	Server string `json:"server"`
	Action Action `json:"action"`
	// Profile is the profile for ActAllocate and ActDeploy.
	Profile string `json:"profile,omitempty"`
	// AllocReason is the allocation reason for ActAllocate.
	AllocReason string `json:"allocReason,omitempty"`
	// Counter is the desired action counter for the counter-driven actions
	// (ActCommission when recommissioning, ActPower*); the executor records
	// it as observed once the action finished.
	Counter int64 `json:"counter,omitempty"`
	// CounterName is the inventory counter the step satisfies ("commission",
	// "powerCycle", ...), or "".
	CounterName string `json:"counterName,omitempty"`
	// From is the auto-enrolled server's current name for ActAdopt.
	From string `json:"from,omitempty"`
	// Why is a short human reason, shown in plans and events.
	Why string `json:"why"`
	// Waits, set by the controller on a deploy that cannot start yet
	// (Config.DeployReady refused it, e.g. its image failed to import),
	// says why; the step is planned again every pass. "" for a step that
	// can run.
	Waits string `json:"waits,omitempty"`
	// Addresses are the pool addresses an ActAllocate step takes, as the
	// plan simulated the controller's IPAM (ipam.go); the controller
	// prefers them when they are still free.
	Addresses []StepAddress `json:"addresses,omitempty"`
}

func (s Step) String() string {
	out := fmt.Sprintf("%s %s", s.Server, s.Action)
	if s.Profile != "" {
		out += " " + s.Profile
	}
	out += ": " + s.Why
	if s.Waits != "" {
		out += " (waits: " + s.Waits + ")"
	}
	return out
}

// CondImageNotReady is the Condition type (and reason) of a server
// whose deploy waits because its profile's image is not verified: still
// importing, or its import failed (the message carries the import error).
const CondImageNotReady = "ImageNotReady"

// CondImageChanged is the Condition type of an allocated server whose
// profile now names another image than its allocation: reason
// ReasonReplanBeforeWrite while the write has not started (the deploy
// writes the new image), ReasonAppliesOnRedeploy once it has (the server
// keeps the old image until it is redeployed).
const (
	CondImageChanged        = "ImageChanged"
	ReasonReplanBeforeWrite = "ReplanBeforeWrite"
	ReasonAppliesOnRedeploy = "AppliesOnRedeploy"
)

// imageChanged returns a CondImageChanged condition for each allocated,
// deploying or deployed server whose profile's image differs from the one
// recorded on its allocation (image deploys only; an installer deploy
// boots the ISO named at allocation). names are have's server names,
// sorted.
func imageChanged(want *inventory.Inventory, have state.Snapshot, names []string) []Condition {
	var out []Condition
	for _, name := range names {
		a := have.Servers[name].Allocation
		if a == nil || a.Image == "" || (a.Deploy != "" && a.Deploy != string(inventory.DeployImage)) {
			continue
		}
		s := have.Servers[name]
		p := want.Profile(a.Profile)
		if p == nil || p.Image == a.Image || p.Deploy != inventory.DeployImage {
			continue
		}
		c := Condition{Subject: "server/" + name, Type: CondImageChanged}
		switch {
		case s.Lifecycle == state.LifecycleAllocated || (s.Lifecycle == state.LifecycleDeploying && a.PlanServedAt.IsZero()):
			c.Reason = ReasonReplanBeforeWrite
			c.Message = fmt.Sprintf("profile %s now deploys image %s (allocated with %s); the write has not started, so this deploy writes %s", p.Name, p.Image, a.Image, p.Image)
		case s.Lifecycle == state.LifecycleDeploying || s.Lifecycle == state.LifecycleDeployed:
			c.Reason = ReasonAppliesOnRedeploy
			c.Message = fmt.Sprintf("server has image %s (write started %s); profile %s now says %s: it applies on the next redeploy", a.Image, a.PlanServedAt.UTC().Format(time.RFC3339), p.Name, p.Image)
		default:
			continue
		}
		out = append(out, c)
	}
	return out
}

// Condition is a fact about a server or profile that status shows and that
// needs no action, or needs a human.
type Condition struct {
	// Subject is "server/NAME", "profile/NAME" or "inventory".
	Subject string `json:"subject"`
	// Type is CamelCase: Orphaned, InsufficientCapacity, Waiting, Held,
	// NoBMC, Failing (CondFailing).
	Type    string `json:"type"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Options are the inputs of Compute besides desired and observed state.
type Options struct {
	// Now is the time deadlines are measured against.
	Now time.Time
	// CommissionTimeout fails a server still commissioning after this long
	// since it entered commissioning; zero means 30 minutes.
	CommissionTimeout time.Duration
	// DeployTimeout fails a deploy after this long; zero means 60 minutes.
	DeployTimeout time.Duration
	// SilentAfter is how long a commissioning or image-deploying server may
	// go unheard (no script, plan, image, report or done request since
	// the phase began or its last re-netboot) before the controller
	// re-netboots it, with fresh tokens; zero means 5 minutes. A Waiting
	// condition (MachineSilent) names the last thing heard from half that.
	SilentAfter time.Duration
	// MaxRenetboots bounds the re-netboots per phase; zero means 3. After
	// them the server waits for its deadline.
	MaxRenetboots int
	// WipeTimeout fails a release wipe that has not reported after this
	// long since the server was booted into it; zero means 30 minutes.
	WipeTimeout time.Duration
	// WipeRetryBase is the delay before retrying a failed release wipe,
	// doubling with each further failure up to WipeRetryCap; zero means
	// 1 minute (cap: 1 hour).
	WipeRetryBase, WipeRetryCap time.Duration
	// ConfirmOffAfter is how long after the ramdisk said it powers the
	// machine off itself (state.PowerSourceAgent: after its commissioning
	// report or release wipe) the plan confirms it through the BMC
	// (ActConfirmOff: nothing is sent when the BMC reads off); zero means
	// 1 minute. The ramdisk powers off within seconds; a guest kernel that
	// hangs on the way down stays on without it.
	ConfirmOffAfter time.Duration
	// BrakeShare is the share of the fleet (servers not retired) a revision
	// may release or retire before it is held; zero means 0.2 (20%).
	BrakeShare float64
	// Approved says the operator approved the held steps of this revision
	// (machinactl approve REV).
	Approved bool
}

func (o Options) withDefaults() Options {
	if o.CommissionTimeout <= 0 {
		o.CommissionTimeout = 30 * time.Minute
	}
	if o.DeployTimeout <= 0 {
		o.DeployTimeout = 60 * time.Minute
	}
	if o.BrakeShare <= 0 {
		o.BrakeShare = 0.2
	}
	if o.SilentAfter <= 0 {
		o.SilentAfter = 5 * time.Minute
	}
	if o.MaxRenetboots <= 0 {
		o.MaxRenetboots = 3
	}
	if o.WipeTimeout <= 0 {
		o.WipeTimeout = 30 * time.Minute
	}
	if o.WipeRetryBase <= 0 {
		o.WipeRetryBase = time.Minute
	}
	if o.ConfirmOffAfter <= 0 {
		o.ConfirmOffAfter = time.Minute
	}
	if o.WipeRetryCap <= 0 {
		o.WipeRetryCap = time.Hour
	}
	return o
}

// Result is a plan: the steps to take now, in order, the steps the safety
// brake holds, and conditions to show in status.
type Result struct {
	Steps      []Step      `json:"steps"`
	Held       []Step      `json:"held,omitempty"`
	Conditions []Condition `json:"conditions,omitempty"`
	// Brake explains why Held is not empty; "" otherwise.
	Brake string `json:"brake,omitempty"`
	// Selections say, per profile with a selector, which servers it
	// matches and why the others do not.
	Selections []Selection `json:"selections,omitempty"`
	// Firmware lists what each server's firmware step would change to
	// meet its profile's firmware block (CheckFirmware), by server, then
	// in the order of the firmware step (settings, volumes, updates,
	// Secure Boot).
	Firmware []FirmwareChange `json:"firmware,omitempty"`
}

// Compute works out what must change for the observed state have to match the
// desired inventory want. It is pure: same inputs, same plan, sorted by
// server name and by the action order above. want may be nil (no valid
// revision yet): every observed server is then left alone.
//
// Allocation order (documented contract, tested): among ready servers that
// are not retired, pinned to no other profile, in the profile's zone and at
// least its minimum size, matched by its selector, the smallest wins: fewest cores, then least
// memory, then smallest fitting disk, then name.
func Compute(want *inventory.Inventory, have state.Snapshot, opts Options) Result {
	opts = opts.withDefaults()
	if want == nil {
		return Result{}
	}
	p := &planning{want: want, have: have, opts: opts, desired: make(map[string]*inventory.Server, len(want.Servers)),
		desiredMAC: make(map[string]*inventory.Server, len(want.Servers)), pendingMAC: map[string]*state.Server{}, allocated: map[string]string{},
		names: sortedNames(have)}
	for i := range want.Servers {
		p.desired[want.Servers[i].Name] = &want.Servers[i]
		p.desiredMAC[want.Servers[i].BootMAC] = &want.Servers[i]
	}
	p.orphans()
	// A boot MAC moved onto a name whose record is another machine (two
	// names swapped, or a name reused for a machine another record holds):
	// the record under that name is not the machine servers.yaml now
	// means. Rewriting its MAC and BMC would point a deployed record at
	// an empty machine and the other way round, and its next commission
	// or retire would hit the wrong host. Such names get a condition and
	// no step until servers.yaml is untangled.
	p.conflicted = macConflicts(want, have)
	for i := range want.Servers {
		p.server(&want.Servers[i])
	}
	p.profiles()
	p.storage()
	p.firmware()
	p.networks()
	p.ipam()
	res := &p.res
	if len(p.conflicted) > 0 {
		res.Steps = dropServers(res.Steps, p.conflicted)
		p.disruptive = dropServers(p.disruptive, p.conflicted)
	}
	res.Conditions = append(res.Conditions, imageChanged(want, have, p.names)...)
	res.Steps = dropLoneSteps(res.Steps, ActConfirmOff)
	p.applyBrake()
	res.Conditions = append(res.Conditions, failingConditions(have, p.names, res.Steps, opts)...)
	sortSteps(res.Steps)
	sortSteps(res.Held)
	SortConditions(res.Conditions)
	return *res
}

// planning is one run of Compute: its inputs and what it has planned so far.
type planning struct {
	want       *inventory.Inventory
	have       state.Snapshot
	opts       Options
	desired    map[string]*inventory.Server // by name
	desiredMAC map[string]*inventory.Server // by boot MAC
	// pendingMAC: records not in servers.yaml under their name whose boot
	// MAC it names under another name that has no record (an
	// auto-enrolled server whose entry was renamed in review, or a server
	// renamed in servers.yaml). The new name adopts the record, rather
	// than a second record with the same MAC (the boot endpoints would
	// answer for the old one).
	pendingMAC map[string]*state.Server
	conflicted map[string]Condition
	allocated  map[string]string // server → profile, planned this pass
	// names are have's server names, sorted: the order of every
	// fleet-wide loop, sorted once per plan.
	names      []string
	disruptive []Step
	fwHeld     []Step // firmware steps of deployed servers, until approved
	res        Result
}

func (p *planning) cond(c Condition) { p.res.Conditions = append(p.res.Conditions, c) }

// orphans handles the records servers.yaml does not name: renamed or
// merged ones wait for adoption, auto-enrolled ones get their pending
// steps, the rest are never touched (an Orphaned condition).
func (p *planning) orphans() {
	have := p.have
	for _, name := range p.names {
		if _, ok := p.desired[name]; ok {
			continue
		}
		obs := have.Servers[name]
		if ws, renamed := p.desiredMAC[obs.BootMAC]; renamed && obs.BootMAC != "" && obs.Enrolled == nil {
			if _, taken := have.Servers[ws.Name]; !taken {
				p.pendingMAC[obs.BootMAC] = obs
				continue
			}
		}
		if obs.Enrolled != nil {
			if _, merged := p.desiredMAC[obs.BootMAC]; merged {
				p.pendingMAC[obs.BootMAC] = obs
				continue
			}
			p.res.Steps = append(p.res.Steps, pendingSteps(obs, p.opts)...)
			if obs.Lifecycle != state.LifecycleRetired {
				p.cond(pendingCondition(obs))
			}
			continue
		}
		if obs.Lifecycle != state.LifecycleRetired {
			p.cond(Condition{Subject: "server/" + name, Type: "Orphaned", Reason: "NotInInventory",
				Message: "server is not in servers.yaml any more; left as it is (" + string(obs.Lifecycle) + ")"})
		}
	}
}

// server plans one desired server: a conflicted name gets only its
// condition, a server without a record is adopted or registered, and a
// known one gets its steps (without BMC steps when it has no BMC, without
// power-on steps when fenced) and its conditions.
func (p *planning) server(ws *inventory.Server) {
	obs, ok := p.have.Servers[ws.Name]
	if c, bad := p.conflicted[ws.Name]; bad {
		p.cond(c)
		return
	}
	if !ok {
		p.adoptOrRegister(ws)
		return
	}
	res := &p.res
	if identityChanged(ws, obs) {
		res.Steps = append(res.Steps, Step{Server: ws.Name, Action: ActUpdateIdentity, Why: "zone, rack, boot MAC or BMC changed in servers.yaml"})
	}
	steps, disr := serverSteps(ws, obs, p.opts)
	archConds, steps := archConditions(p.want, ws, obs, steps)
	res.Conditions = append(res.Conditions, archConds...)
	cabConds, steps := cablingConditions(ws, obs, steps)
	res.Conditions = append(res.Conditions, cabConds...)
	if ws.BMC.IsZero() {
		steps, disr = withoutBMC(steps), withoutBMC(disr)
		p.cond(noBMCCondition(ws, obs))
	}
	if obs.Fenced != nil {
		steps, disr = withoutPowerOn(steps), withoutPowerOn(disr)
		p.cond(fencedCondition(ws.Name, obs.Fenced))
	}
	res.Steps = append(res.Steps, steps...)
	p.disruptive = append(p.disruptive, disr...)
	for _, s := range steps {
		if s.Action == ActAllocate {
			p.allocated[s.Server] = s.Profile
		}
	}
	if c, ok := wipeCondition(ws.Name, obs, p.opts); ok {
		p.cond(c)
	}
	if c, ok := silentCondition(ws.Name, obs, p.opts); ok {
		p.cond(c)
	}
	if ws.Want == inventory.WantRetired && obs.Lifecycle == state.LifecycleNew {
		p.cond(Condition{Subject: "server/" + ws.Name, Type: "Waiting", Reason: "NeverCommissioned",
			Message: "want: retired on a server that was never commissioned: nothing to do"})
	}
}

// adoptOrRegister plans a desired server that has no record: a record
// merged or renamed under another name is adopted (its hardware,
// lifecycle and history) once its ramdisk is done, rather than a second
// server registered with its MAC.
func (p *planning) adoptOrRegister(ws *inventory.Server) {
	auto, found := p.pendingMAC[ws.BootMAC]
	if !found {
		p.res.Steps = append(p.res.Steps, Step{Server: ws.Name, Action: ActRegister, Why: "new in servers.yaml"})
		return
	}
	was := "auto-enrolled as"
	if auto.Enrolled == nil {
		was = "renamed from"
	}
	if auto.Lifecycle == state.LifecycleCommissioning || auto.Lifecycle == state.LifecycleDeploying {
		p.cond(Condition{Subject: "server/" + ws.Name, Type: "Waiting", Reason: "AdoptionWaits",
			Message: fmt.Sprintf("%s %s, which is %s: adopted once its ramdisk reports", was, auto.Name, auto.Lifecycle)})
		return
	}
	p.res.Steps = append(p.res.Steps, Step{Server: ws.Name, Action: ActAdopt, From: auto.Name,
		Why: fmt.Sprintf("%s %s; servers.yaml names its boot MAC %s", was, auto.Name, ws.BootMAC)})
}

// profiles tops up each profile's count or releases the surplus of count
// allocations, and reports selector-based selections.
func (p *planning) profiles() {
	if len(p.want.Profiles) == 0 {
		return
	}
	fi := p.fleetIndex()
	for _, prof := range p.want.Profiles {
		if prof.Selector != nil {
			sel := Select(prof, p.want, p.have)
			p.res.Selections = append(p.res.Selections, sel)
			if c, ok := selectionCondition(sel); ok {
				p.cond(c)
			}
		}
		steps, disr, conds := profileSteps(prof, p.want, p.have, fi, p.allocated)
		p.res.Steps = append(p.res.Steps, steps...)
		p.disruptive = append(p.disruptive, disr...)
		p.res.Conditions = append(p.res.Conditions, conds...)
	}
}

// fleetIndex is what every profile's count reads of the fleet, found in
// one walk of it rather than one walk per profile: the servers holding a
// count allocation by profile (in name order), and which of servers.yaml's
// entries have a ready record (by index, in servers.yaml order; walked
// only when a profile is short of its count, see readyEntries). Compute
// never changes the snapshot, so each profile sees what its own walk would.
type fleetIndex struct {
	counted map[string][]string
	ready   []int // nil until readyEntries
	p       *planning
}

func (p *planning) fleetIndex() *fleetIndex {
	fi := &fleetIndex{counted: map[string][]string{}, p: p}
	for _, name := range p.names {
		// Read through the map, so the records are not copied.
		if a := p.have.Servers[name].Allocation; a != nil && a.Reason == ReasonCount {
			fi.counted[a.Profile] = append(fi.counted[a.Profile], name)
		}
	}
	return fi
}

// readyEntries returns the indices of servers.yaml's entries whose record
// is ready, walking the fleet on the first call only. Never nil.
func (fi *fleetIndex) readyEntries() []int {
	if fi.ready == nil {
		fi.ready = []int{}
		for i := range fi.p.want.Servers {
			if obs := fi.p.have.Servers[fi.p.want.Servers[i].Name]; obs != nil && obs.Lifecycle == state.LifecycleReady {
				fi.ready = append(fi.ready, i)
			}
		}
	}
	return fi.ready
}

// applyBrake holds this revision's disruptive steps behind the safety
// brake unless the revision is approved.
func (p *planning) applyBrake() {
	res := &p.res
	why := brake(p.disruptive, res.Steps, p.want, p.have, p.opts)
	if len(p.fwHeld) > 0 {
		// Not approved (firmware puts them in Steps when it is).
		names := make([]string, len(p.fwHeld))
		for i, s := range p.fwHeld {
			names[i] = s.Server
		}
		fw := fmt.Sprintf("the firmware step would reset %d deployed %s to apply a changed profile's firmware (%s)", len(names), map[bool]string{true: "server", false: "servers"}[len(names) == 1], strings.Join(names, ", "))
		if why == "" {
			why = "held until approved (machinactl approve " + DigestPrefix(p.want.Digest) + "): " + fw
		} else {
			why += "; " + fw
		}
		res.Held = append(res.Held, p.fwHeld...)
	}
	if why == "" || p.opts.Approved {
		return
	}
	res.Brake = why
	held := map[string]bool{}
	for _, s := range p.disruptive {
		held[s.Server+"\x00"+string(s.Action)] = true
	}
	kept := res.Steps[:0]
	for _, s := range res.Steps {
		if held[s.Server+"\x00"+string(s.Action)] {
			res.Held = append(res.Held, s)
			continue
		}
		kept = append(kept, s)
	}
	res.Steps = kept
	p.cond(Condition{Subject: "inventory", Type: "Held", Reason: "SafetyBrake", Message: why})
}

// SortConditions orders conditions by subject, then type (stable).
func SortConditions(cs []Condition) {
	sort.SliceStable(cs, func(i, j int) bool {
		if cs[i].Subject != cs[j].Subject {
			return cs[i].Subject < cs[j].Subject
		}
		return cs[i].Type < cs[j].Type
	})
}

// serverSteps plans one desired server against its observed record. It
// returns the steps and, separately, those the safety brake counts.
func serverSteps(ws *inventory.Server, obs *state.Server, opts Options) (steps, disruptive []Step) {
	add := func(s Step, disr bool) {
		s.Server = ws.Name
		steps = append(steps, s)
		if disr {
			disruptive = append(disruptive, s)
		}
	}
	if retireSteps(ws, obs, add) {
		return steps, disruptive
	}
	if s, ok := phaseStep(obs, opts); ok {
		add(s, false)
		return steps, nil
	}
	if s, ok := wipeStep(obs, opts); ok {
		add(s, false)
		if s.Action == ActTimeout {
			return steps, nil
		}
	}
	lc := obs.Lifecycle
	if lc == state.LifecycleDeployed && obs.FinishDeploy {
		add(Step{Action: ActFinishDeploy, Why: "image written: boot from disk from now on"}, false)
	} else if obs.BMC.RestoreDisk && lc != state.LifecycleCommissioning && lc != state.LifecycleDeploying && obs.WipeStartedAt.IsZero() {
		add(Step{Action: ActRestoreDisk, Why: fmt.Sprintf("the network boot a persistent override was set for is over (%s)", lc)}, false)
	}
	if s, ok := commissionStep(ws, obs); ok {
		add(s, false)
	}
	pinnedSteps(ws, obs, hasAction(steps, ActCommission), add)
	for _, s := range powerCounterSteps(ws, obs) {
		add(s, false)
	}
	if len(steps) == 0 {
		// Only on its own (also against the fleet's allocations:
		// dropLoneSteps): any other step of the server boots or powers
		// it anyway, and the next pass sees what that recorded.
		if s, ok := confirmOffStep(obs, opts); ok {
			add(s, false)
		}
	}
	return steps, disruptive
}

// dropLoneSteps removes the steps of action a for servers that have any
// other step in steps: a is planned only on its own (a confirm-off after
// an allocation and a deploy in the same pass would power the deploying
// machine off). It keeps the order of the rest.
func dropLoneSteps(steps []Step, a Action) []Step {
	other := map[string]bool{}
	lone := false
	for _, s := range steps {
		if s.Action != a {
			other[s.Server] = true
		} else {
			lone = true
		}
	}
	if !lone {
		return steps
	}
	out := steps[:0]
	for _, s := range steps {
		if s.Action != a || !other[s.Server] {
			out = append(out, s)
		}
	}
	return out
}

// confirmOffStep confirms through the BMC that a ready or failed server
// the ramdisk said it powers off (state.PowerStatus.OffClaimPending) is
// off, once ConfirmOffAfter has passed since it said so. What the BMC
// sweep read in between does not matter: a machine the sweep saw still on
// is the one that most needs the confirm.
func confirmOffStep(obs *state.Server, opts Options) (Step, bool) {
	claim, pending := obs.Power.OffClaimPending()
	if !pending || (obs.Lifecycle != state.LifecycleReady && obs.Lifecycle != state.LifecycleFailed) {
		return Step{}, false
	}
	since := opts.Now.Sub(claim)
	if since < opts.ConfirmOffAfter {
		return Step{}, false
	}
	return Step{Action: ActConfirmOff, Why: fmt.Sprintf("the ramdisk said it powers the machine off (%s ago): confirm through the BMC", since.Round(time.Second))}, true
}

// retireSteps plans a server whose want is retired, or that is retired
// and wanted again, and reports whether that is all it gets.
func retireSteps(ws *inventory.Server, obs *state.Server, add func(Step, bool)) bool {
	lc := obs.Lifecycle
	switch {
	case ws.Want != inventory.WantRetired && lc == state.LifecycleRetired:
		add(Step{Action: ActUnretire, Why: "want is " + string(ws.Want) + " again"}, false)
		return true
	case ws.Want == inventory.WantRetired:
		switch lc {
		case state.LifecycleReady, state.LifecycleDeployed, state.LifecycleFailed:
			add(Step{Action: ActRetire, Why: "want: retired"}, true)
		}
		return true
	}
	return false
}

// phaseStep is the step of a phase that waits for the ramdisk and took too
// long: its deadline passed (timeout), or the machine went silent mid-phase
// (its controller restarted under it, its answer lost, its ramdisk stuck)
// and is booted again long before the deadline, a bounded number of times.
func phaseStep(obs *state.Server, opts Options) (Step, bool) {
	lc := obs.Lifecycle
	switch {
	case lc == state.LifecycleCommissioning && opts.Now.Sub(obs.LifecycleAt) > opts.CommissionTimeout:
		return Step{Action: ActTimeout, Why: fmt.Sprintf("no commissioning report within %s", opts.CommissionTimeout) + stallNote(obs, opts)}, true
	case lc == state.LifecycleDeploying && opts.Now.Sub(obs.LifecycleAt) > opts.DeployTimeout:
		return Step{Action: ActTimeout, Why: fmt.Sprintf("deploy did not report within %s", opts.DeployTimeout) + stallNote(obs, opts)}, true
	}
	if since, ok := silentSince(obs, opts); ok && opts.Now.Sub(since) > opts.SilentAfter && obs.Renetboots < opts.MaxRenetboots {
		return Step{Action: ActRenetboot, Counter: int64(obs.Renetboots + 1),
			Why: fmt.Sprintf("nothing heard for %s (last: %s): re-netboot %d of %d", opts.Now.Sub(since).Round(time.Second), lastHeard(obs), obs.Renetboots+1, opts.MaxRenetboots)}, true
	}
	return Step{}, false
}

// stallNote is "; " and the boot stall of a timed-out server whose boot
// stalled (the failure it records says why the report never came), else "".
func stallNote(obs *state.Server, opts Options) string {
	if f, ok := bootStalled(obs); ok {
		return "; " + bootStallText(f, opts.Now)
	}
	return ""
}

// wipeStep is the release wipe's step: a released server's disks are
// wiped by the ramdisk before anything else happens to it (it is not
// allocated meanwhile). A wipe past its deadline times out; a running
// one, or a failed one before its retry time, gets no step.
func wipeStep(obs *state.Server, opts Options) (Step, bool) {
	if obs.Lifecycle != state.LifecycleReady || !obs.NeedsWipe {
		return Step{}, false
	}
	// An erase that keeps reporting progress (bytes moving forward) is
	// alive: the deadline counts from its last advance.
	since := obs.WipeStartedAt
	if p := obs.CurrentProgress(); p != nil && p.AdvancedAt.After(since) {
		since = p.AdvancedAt
	}
	switch {
	case !obs.WipeStartedAt.IsZero() && opts.Now.Sub(since) > opts.WipeTimeout:
		if since != obs.WipeStartedAt {
			return Step{Action: ActTimeout, Why: fmt.Sprintf("release wipe's erase made no progress for %s", opts.WipeTimeout)}, true
		}
		why := fmt.Sprintf("release wipe did not report within %s", opts.WipeTimeout)
		if f, ok := wipeBootStalled(obs); ok {
			why += "; " + bootStallText(f, opts.Now)
		}
		return Step{Action: ActTimeout, Why: why}, true
	case !obs.WipeStartedAt.IsZero():
		return Step{}, false // running: wait for the ramdisk's report
	case obs.WipeFailures > 0 && opts.Now.Before(wipeRetryAt(obs, opts)):
		return Step{}, false // failed: wait for the retry time (wipeCondition shows it)
	}
	why := "released: wipe partition tables and signatures before reuse"
	if e := eraseSummary(obs); e != "" {
		why = "released: erase " + e + " before reuse"
	}
	if obs.WipeFailures > 0 {
		why = fmt.Sprintf("retry release wipe (%d failed)", obs.WipeFailures)
		if e := eraseSummary(obs); e != "" {
			why += ": erase " + e
		}
	}
	return Step{Action: ActWipe, Why: why}, true
}

// eraseSummary says how a released server's disks are erased, by method
// ("disks with zero", or per disk "nvme0n1 secure, sda zero, sdb zero"
// when the allocation chose methods per disk); "" for the metadata wipe
// of every disk.
func eraseSummary(obs *state.Server) string {
	def := cmp.Or(obs.WipeErase, "metadata")
	if len(obs.WipeEraseDisks) == 0 {
		if def == "metadata" {
			return ""
		}
		return "disks with " + def
	}
	parts := make([]string, 0, len(obs.WipeEraseDisks))
	for _, d := range obs.WipeEraseDisks {
		parts = append(parts, cmp.Or(d.Name, d.ByPath, d.WWN, d.Serial)+" "+cmp.Or(d.Method, "metadata"))
	}
	return strings.Join(parts, ", ")
}

// commissionStep commissions a server the first time, or again when
// servers.yaml's actions.commission counter asks for it.
func commissionStep(ws *inventory.Server, obs *state.Server) (Step, bool) {
	lc, want, seen := obs.Lifecycle, ws.Actions.Commission, obs.Actions["commission"]
	switch {
	case lc == state.LifecycleNew:
		return Step{Action: ActCommission, Counter: want, CounterName: "commission", Why: "never commissioned"}, true
	case want > seen && (lc == state.LifecycleReady || lc == state.LifecycleFailed):
		return Step{Action: ActCommission, Counter: want, CounterName: "commission", Why: fmt.Sprintf("actions.commission %d > observed %d", want, seen)}, true
	}
	return Step{}, false
}

// pinnedSteps plans pinned deploys (want: deployed with a profile) and
// their release, and the deploy of an allocated server.
func pinnedSteps(ws *inventory.Server, obs *state.Server, commissioning bool, add func(Step, bool)) {
	lc := obs.Lifecycle
	pinnedHere := obs.Allocation != nil && obs.Allocation.Reason == ReasonPinned
	switch {
	case ws.Want == inventory.WantDeployed && ws.Profile != "" && lc == state.LifecycleReady && !obs.NeedsWipe && !commissioning:
		add(Step{Action: ActAllocate, Profile: ws.Profile, AllocReason: ReasonPinned, Why: "want: deployed with profile " + ws.Profile}, false)
		add(Step{Action: ActDeploy, Profile: ws.Profile, Why: "want: deployed"}, false)
	case lc == state.LifecycleAllocated && obs.Allocation != nil:
		add(Step{Action: ActDeploy, Profile: obs.Allocation.Profile, Why: "allocated to " + obs.Allocation.Profile}, false)
	case lc == state.LifecycleDeployed && pinnedHere && ws.Want != inventory.WantDeployed:
		add(Step{Action: ActRelease, Why: "want is " + string(ws.Want) + ", no longer deployed"}, true)
	case lc == state.LifecycleDeployed && pinnedHere && ws.Profile != obs.Allocation.Profile:
		add(Step{Action: ActRelease, Why: fmt.Sprintf("profile changed from %s to %s; released to redeploy", obs.Allocation.Profile, ws.Profile)}, true)
	}
}

// powerCounterSteps are the power actions servers.yaml's counters ask for
// (a counter above the one observed).
func powerCounterSteps(ws *inventory.Server, obs *state.Server) []Step {
	var out []Step
	for _, pc := range []struct {
		name string
		want int64
		act  Action
	}{{"powerOn", ws.Actions.PowerOn, ActPowerOn}, {"powerOff", ws.Actions.PowerOff, ActPowerOff}, {"powerCycle", ws.Actions.PowerCycle, ActPowerCycle}} {
		if seen := obs.Actions[pc.name]; pc.want > seen {
			out = append(out, Step{Action: pc.act, Counter: pc.want, CounterName: pc.name, Why: fmt.Sprintf("actions.%s %d > observed %d", pc.name, pc.want, seen)})
		}
	}
	return out
}

// pendingSteps plans for an auto-enrolled server that is not in
// servers.yaml yet: only its commissioning deadline (it has no BMC, so the
// timeout just marks it failed).
func pendingSteps(obs *state.Server, opts Options) []Step {
	if obs.Lifecycle == state.LifecycleCommissioning && opts.Now.Sub(obs.LifecycleAt) > opts.CommissionTimeout {
		return []Step{{Server: obs.Name, Action: ActTimeout, Why: fmt.Sprintf("no commissioning report within %s", opts.CommissionTimeout)}}
	}
	return nil
}

// pendingCondition says where an auto-enrolled server's proposal is.
func pendingCondition(obs *state.Server) Condition {
	c := Condition{Subject: "server/" + obs.Name, Type: "Waiting", Reason: "AwaitingReview"}
	e := obs.Enrolled
	switch {
	case e.Branch != "":
		c.Message = fmt.Sprintf("auto-enrolled; proposed on branch %s (commit %.12s): merge it into servers.yaml to manage this server", e.Branch, e.Commit)
	case e.ProposalError != "":
		c.Reason = "ProposalFailed"
		c.Message = "auto-enrolled; proposing its servers.yaml entry failed, will retry: " + e.ProposalError
	default:
		c.Message = "auto-enrolled; its servers.yaml entry is proposed once commissioning ends (" + string(obs.Lifecycle) + ")"
	}
	return c
}

// withoutBMC drops the steps a server without a BMC cannot take, and its
// allocation (its deploy could never start).
func withoutBMC(steps []Step) []Step {
	var out []Step
	for _, s := range steps {
		if !s.Action.NeedsBMC() && s.Action != ActAllocate {
			out = append(out, s)
		}
	}
	return out
}

// withoutPowerOn drops the steps that would power a fenced server on.
func withoutPowerOn(steps []Step) []Step {
	var out []Step
	for _, s := range steps {
		if !s.Action.PowersOn() {
			out = append(out, s)
		}
	}
	return out
}

func fencedCondition(name string, f *state.Fencing) Condition {
	return Condition{Subject: "server/" + name, Type: "Fenced", Reason: "Fenced",
		Message: fmt.Sprintf("fenced %s by %s through %s (%s): never powered on until machinactl host unfence %s", f.At.UTC().Format(time.RFC3339), f.Actor, f.Device, f.Reason, orName(f.Host, name))}
}

func orName(host, server string) string {
	if host != "" {
		return host
	}
	return "HOST"
}

func noBMCCondition(ws *inventory.Server, obs *state.Server) Condition {
	return Condition{Subject: "server/" + ws.Name, Type: "NoBMC", Reason: "NoBMC",
		Message: fmt.Sprintf("no BMC: Machina cannot power or boot-override this server (%s); attach one with machinactl server bmc-set %s --driver ... --address ... --credentials ...", obs.Lifecycle, ws.Name)}
}

// profileSteps keeps a profile's count of count-allocated servers: it
// allocates the smallest fitting ready servers when short and releases the
// newest count allocations when over. names are have's server names,
// sorted.
func profileSteps(p inventory.Profile, want *inventory.Inventory, have state.Snapshot, fi *fleetIndex, planned map[string]string) (steps, disruptive []Step, conds []Condition) {
	// holding: the names of p's count allocations, any active lifecycle
	// (names only: the records are read where needed, not copied).
	var holding []string
	for _, name := range fi.counted[p.Name] {
		switch have.Servers[name].Lifecycle {
		case state.LifecycleAllocated, state.LifecycleDeploying, state.LifecycleDeployed:
			holding = append(holding, name)
		}
	}
	switch n := len(holding); {
	case n < p.Count:
		// Only the names are needed: the records are not copied out.
		short := p.Count - n
		cands := smallestKeys(candidateKeys(&p, want, have, fi.readyEntries(), planned, false), short)
		for _, c := range cands {
			if short == 0 {
				break
			}
			planned[c.name] = p.Name
			steps = append(steps,
				Step{Server: c.name, Action: ActAllocate, Profile: p.Name, AllocReason: ReasonCount, Why: fmt.Sprintf("profile %s count %d, %d held", p.Name, p.Count, n)},
				Step{Server: c.name, Action: ActDeploy, Profile: p.Name, Why: "allocated to " + p.Name})
			short--
		}
		if short > 0 {
			conds = append(conds, Condition{Subject: "profile/" + p.Name, Type: "InsufficientCapacity", Reason: "NotEnoughReadyServers",
				Message: fmt.Sprintf("count %d wants %d more servers; %d ready servers fit (zone %s%s, min %d cores, %d GiB memory, %d GiB disk)",
					p.Count, p.Count-n, p.Count-n-short, zoneOrAny(p.Zone), archNote(want, p.Name), p.Min.Cores, p.Min.MemoryGiB, p.Min.DiskGiB) + networkNote(p, want, have)})
		}
	case n > p.Count:
		// Release the newest count allocations first; only deployed ones
		// are released here (allocated and deploying ones finish first).
		at := func(name string) time.Time { return have.Servers[name].Allocation.At }
		sort.SliceStable(holding, func(i, j int) bool {
			if ai, aj := at(holding[i]), at(holding[j]); !ai.Equal(aj) {
				return ai.After(aj)
			}
			return holding[i] > holding[j]
		})
		for _, name := range holding[:n-p.Count] {
			s := have.Servers[name]
			if s.Lifecycle != state.LifecycleDeployed {
				continue
			}
			st := Step{Server: s.Name, Action: ActRelease, Why: fmt.Sprintf("profile %s count lowered to %d", p.Name, p.Count)}
			steps = append(steps, st)
			disruptive = append(disruptive, st)
		}
	}
	return steps, disruptive, conds
}

// Candidates lists the ready servers profile p may allocate, smallest first
// (fewest cores, least memory, smallest fitting disk, name), among those
// its selector matches (stated labels, tags and derived labels). planned holds
// servers already taken in this pass. A released server whose release wipe
// has not finished (NeedsWipe) is never a candidate.
func Candidates(p inventory.Profile, want *inventory.Inventory, have state.Snapshot, planned map[string]string) []state.Server {
	keys := candidateKeys(&p, want, have, nil, planned, true)
	var out []state.Server
	if len(keys) > 0 {
		out = make([]state.Server, len(keys))
		for i, k := range keys {
			out[i] = *have.Servers[k.name] // a copy: the caller may change it
		}
	}
	return out
}

// candidateKeys lists Candidates' servers as keys (the name and what it
// sorts by), without copying the records, in Candidates' order when sorted
// is true and in no order otherwise (smallestKeys orders the few needed).
// ready, when not nil, lists the entries of want.Servers with a ready
// record (fleetIndex): only those are looked at.
func candidateKeys(pp *inventory.Profile, want *inventory.Inventory, have state.Snapshot, ready []int, planned map[string]string, sorted bool) []candidateKey {
	p := *pp
	var keys []candidateKey
	n := len(want.Servers)
	if ready != nil {
		n = len(ready)
	}
	for j := range n {
		i := j
		if ready != nil {
			i = ready[j]
		}
		ws := &want.Servers[i] // not copied: most are skipped
		if ws.Want == inventory.WantRetired || ws.Want == inventory.WantDeployed {
			continue // retired, or deployed through its own pin
		}
		if ws.Profile != "" && ws.Profile != p.Name {
			continue
		}
		if ws.BMC.IsZero() {
			continue // cannot be booted into the deploy ramdisk
		}
		if p.Zone != "" && ws.Zone != p.Zone {
			continue
		}
		if _, taken := planned[ws.Name]; taken {
			continue
		}
		obs := have.Servers[ws.Name] // shared and read-only
		if obs == nil || obs.Lifecycle != state.LifecycleReady || !Fits(p.Min, obs.Hardware) {
			continue
		}
		if p.Selector != nil && !p.Selector.Matches(ServerLabels(ws, obs)) {
			continue // the profile's selector does not match its labels
		}
		if !archFits(want, p.Name, ws, obs) || archBlocked(ws, obs) {
			continue // another architecture than the image's, or the arch is in doubt (stated, kernel, SMBIOS)
		}
		if cablingBlocked(ws, obs) {
			continue // its NICs did not hear their expected switch ports (CablingMismatch)
		}
		if ws.Actions.Commission > obs.Actions["commission"] {
			continue // about to be recommissioned
		}
		if obs.NeedsWipe {
			continue // released, its release wipe not done yet
		}
		if obs.Fenced != nil {
			continue // fenced: never powered on until unfenced
		}
		if firmwareRefused(want, &p, ws, obs) {
			continue // the profile's firmware block is refused on it (IPMI, registry, drives)
		}
		if networkRefused(&p, ws, obs) {
			continue // it cannot carry the profile's network layout (NICs, fixed addresses)
		}
		if storageRefused(&p, obs) {
			continue // too few matching disks for the profile's storage layout
		}
		hw := obs.Hardware
		keys = append(keys, candidateKey{cores: hw.Cores, mem: hw.MemoryBytes, disk: smallestFittingDisk(hw, p.Min.DiskGiB), name: ws.Name})
	}
	// Sort small keys, each computed once, rather than the records
	// themselves (each move of a record copied it whole). Names are
	// unique, so the order is total and an unstable sort gives the same
	// result as a stable one, with fewer moves.
	if sorted {
		slices.SortFunc(keys, compareCandidates)
	}
	return keys
}

// compareCandidates is Candidates' order: cores, memory, smallest fitting
// disk, name. Names are unique, so it is total.
func compareCandidates(a, b candidateKey) int {
	return cmp.Or(cmp.Compare(a.cores, b.cores), cmp.Compare(a.mem, b.mem), cmp.Compare(a.disk, b.disk), strings.Compare(a.name, b.name))
}

// smallestKeys returns the first n of keys in Candidates' order (all of
// them when there are fewer), reordering keys. The order is total, so the
// result is the sorted slice's first n whichever way they are found: a
// bounded max-heap of n keys, O(len(keys) log n), rather than a sort of
// every candidate when a profile needs a few of thousands.
func smallestKeys(keys []candidateKey, n int) []candidateKey {
	if n <= 0 {
		return nil
	}
	if n >= len(keys)/2 {
		slices.SortFunc(keys, compareCandidates)
		return keys[:min(n, len(keys))]
	}
	h := keys[:0:n] // a max-heap of the n smallest so far, in keys' own storage
	for _, k := range keys {
		switch {
		case len(h) < n:
			h = append(h, k)
			siftUp(h, len(h)-1)
		case compareCandidates(k, h[0]) < 0:
			h[0] = k
			siftDown(h, 0)
		}
	}
	slices.SortFunc(h, compareCandidates)
	return h
}

// siftUp restores the max-heap h (largest first) after h[i] was set.
func siftUp(h []candidateKey, i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if compareCandidates(h[i], h[parent]) <= 0 {
			return
		}
		h[i], h[parent] = h[parent], h[i]
		i = parent
	}
}

// siftDown restores the max-heap h (largest first) after h[i] was set.
func siftDown(h []candidateKey, i int) {
	for {
		largest, l, r := i, 2*i+1, 2*i+2
		if l < len(h) && compareCandidates(h[l], h[largest]) > 0 {
			largest = l
		}
		if r < len(h) && compareCandidates(h[r], h[largest]) > 0 {
			largest = r
		}
		if largest == i {
			return
		}
		h[i], h[largest] = h[largest], h[i]
		i = largest
	}
}

// candidateKey is what Candidates orders a candidate by: cores, memory,
// smallest fitting disk, then name, which is also its record's key in the
// snapshot (the store keys servers by name).
type candidateKey struct {
	cores     int
	mem, disk int64
	name      string
}

// Fits reports whether commissioned hardware meets min. Unknown hardware
// (never commissioned) fits nothing.
func Fits(min inventory.Min, hw *state.Hardware) bool {
	if hw == nil {
		return false
	}
	if hw.Cores < min.Cores || hw.MemoryBytes < min.MemoryGiB<<30 {
		return false
	}
	return smallestFittingDisk(hw, min.DiskGiB) >= 0
}

// smallestFittingDisk returns the size of the smallest disk of at least
// minGiB, or -1 when none fits.
func smallestFittingDisk(hw *state.Hardware, minGiB int64) int64 {
	best := int64(-1)
	for _, d := range hw.Disks {
		if d.SizeBytes >= minGiB<<30 && (best < 0 || d.SizeBytes < best) {
			best = d.SizeBytes
		}
	}
	return best
}

// brake returns why the disruptive steps must wait for approval, or "".
// Source: the safety brake of docs/operations.md (default share 20%; a profile brought to
// zero always holds).
func brake(disruptive, all []Step, want *inventory.Inventory, have state.Snapshot, opts Options) string {
	if len(disruptive) == 0 {
		return ""
	}
	fleet := 0
	for _, s := range have.Servers {
		if s.Lifecycle != state.LifecycleRetired {
			fleet++
		}
	}
	var reasons []string
	if fleet > 0 {
		share := float64(len(disruptive)) / float64(fleet)
		if share > opts.BrakeShare {
			reasons = append(reasons, fmt.Sprintf("it would release or retire %d of %d servers (%.0f%%, limit %.0f%%)", len(disruptive), fleet, share*100, opts.BrakeShare*100))
		}
	}
	// A profile brought to zero deployed servers.
	releasing := map[string]bool{}
	for _, s := range disruptive {
		releasing[s.Server] = true
	}
	deployedBy := map[string]int{}
	remaining := map[string]int{}
	for name, s := range have.Servers {
		if s.Allocation == nil || s.Lifecycle != state.LifecycleDeployed {
			continue
		}
		deployedBy[s.Allocation.Profile]++
		if !releasing[name] {
			remaining[s.Allocation.Profile]++
		}
	}
	for _, s := range all {
		if s.Action == ActAllocate {
			remaining[s.Profile]++ // a replacement is on its way
		}
	}
	for _, p := range sortedKeys(deployedBy) {
		if remaining[p] == 0 {
			servers := "servers"
			if deployedBy[p] == 1 {
				servers = "server"
			}
			reasons = append(reasons, fmt.Sprintf("it would bring profile %s from %d deployed %s to zero", p, deployedBy[p], servers))
		}
	}
	if len(reasons) == 0 {
		return ""
	}
	return "held until approved (machinactl approve " + DigestPrefix(want.Digest) + "): " + strings.Join(reasons, "; ")
}

// macConflicts finds the desired servers whose record (same name) has
// another boot MAC while the MAC servers.yaml now gives them is another
// record's: the condition each gets, by name.
func macConflicts(want *inventory.Inventory, have state.Snapshot) map[string]Condition {
	// Almost every pass has no boot MAC change at all: only then is the
	// fleet-wide MAC index built.
	changed := false
	for i := range want.Servers {
		name := want.Servers[i].Name
		obs, ok := have.Servers[name]
		if ok && obs.BootMAC != want.Servers[i].BootMAC {
			changed = true
			break
		}
	}
	if !changed {
		return nil
	}
	var out map[string]Condition
	owner := make(map[string]string, len(have.Servers))
	for name, obs := range have.Servers {
		if obs.BootMAC != "" {
			owner[obs.BootMAC] = name
		}
	}
	for i := range want.Servers {
		ws := &want.Servers[i]
		obs, ok := have.Servers[ws.Name]
		if !ok || obs.BootMAC == ws.BootMAC {
			continue
		}
		other, held := owner[ws.BootMAC]
		if !held || other == ws.Name {
			continue
		}
		if out == nil {
			out = map[string]Condition{}
		}
		out[ws.Name] = Condition{Subject: "server/" + ws.Name, Type: "BootMACConflict", Reason: "MACOfAnotherRecord",
			Message: fmt.Sprintf("servers.yaml gives %s the boot MAC %s, which is the machine recorded as %s (%s); %s's record is the machine with %s (%s). "+
				"Names swapped or reused between machines are not applied: rename through a name no record has, one commit at a time",
				ws.Name, ws.BootMAC, other, have.Servers[other].Lifecycle, ws.Name, obs.BootMAC, obs.Lifecycle)}
	}
	return out
}

// dropServers removes the steps of the named servers.
func dropServers(steps []Step, names map[string]Condition) []Step {
	kept := steps[:0]
	for _, s := range steps {
		if _, drop := names[s.Server]; !drop {
			kept = append(kept, s)
		}
	}
	return kept
}

// Record is ws's identity as servers.yaml states it, as an observed
// record (name, zone, site, rack, boot MAC and mode, BMC settings; every
// other field zero): what the register step creates (the store starts it
// at lifecycle new) and what update-identity copies. identityChanged
// compares the same fields.
func Record(ws *inventory.Server) state.Server {
	return state.Server{Name: ws.Name, Zone: ws.Zone, Site: ws.Site, Rack: ws.Rack, BootMAC: ws.BootMAC, BootMode: string(ws.BootMode),
		BMC: state.BMCFacts{Driver: string(ws.BMC.Driver), Address: ws.BMC.Address, Credentials: ws.BMC.Credentials,
			SystemID: ws.BMC.SystemID, InsecureTLS: ws.BMC.InsecureTLS, Auth: ws.BMC.Auth, CABundle: ws.BMC.CABundle,
			MinCipherSuite: ws.BMC.MinCipherSuite}}
}

// identityChanged reports whether servers.yaml gives ws another identity
// than its record has (the fields Record copies).
func identityChanged(ws *inventory.Server, obs *state.Server) bool {
	return ws.Zone != obs.Zone || ws.Site != obs.Site || ws.Rack != obs.Rack || ws.BootMAC != obs.BootMAC || string(ws.BootMode) != obs.BootMode ||
		string(ws.BMC.Driver) != obs.BMC.Driver || ws.BMC.Address != obs.BMC.Address || ws.BMC.Credentials != obs.BMC.Credentials ||
		ws.BMC.SystemID != obs.BMC.SystemID || ws.BMC.InsecureTLS != obs.BMC.InsecureTLS ||
		ws.BMC.Auth != obs.BMC.Auth || ws.BMC.CABundle != obs.BMC.CABundle || ws.BMC.MinCipherSuite != obs.BMC.MinCipherSuite
}

func hasAction(steps []Step, a Action) bool {
	for _, s := range steps {
		if s.Action == a {
			return true
		}
	}
	return false
}

// silentSince is when the controller last heard from a commissioning or
// image-deploying server's machine (or last booted it); ok is false in
// any other phase, and for installer deploys (the installer reports only
// at its end).
func silentSince(obs *state.Server, opts Options) (time.Time, bool) {
	switch obs.Lifecycle {
	case state.LifecycleCommissioning:
	case state.LifecycleDeploying:
		if obs.Allocation != nil && obs.Allocation.Deploy != "" && obs.Allocation.Deploy != string(inventory.DeployImage) {
			return time.Time{}, false
		}
	default:
		return time.Time{}, false
	}
	since := obs.LifecycleAt
	for _, t := range []time.Time{obs.LastHeardAt, obs.RenetbootAt} {
		if t.After(since) {
			since = t
		}
	}
	return since, true
}

func lastHeard(obs *state.Server) string {
	if f, ok := bootStalled(obs); ok {
		// Said in full: the re-netboot's and the timeout's events carry it.
		out := fmt.Sprintf("%s at %s, nothing from the ramdisk since", obs.LastHeard, f.At.UTC().Format(time.RFC3339))
		if f.SecureBoot {
			out += " (Secure Boot: the firmware, shim or GRUB may have refused an unsigned or untrusted image)"
		}
		return out
	}
	out := obs.LastHeard + " at " + obs.LastHeardAt.UTC().Format(time.RFC3339)
	if obs.LastHeard == "" || obs.LastHeardAt.Before(obs.LifecycleAt) {
		out = "nothing since " + string(obs.Lifecycle) + " began at " + obs.LifecycleAt.UTC().Format(time.RFC3339)
	}
	// A machine that keeps reporting progress without its bytes moving
	// is as silent as one that reports nothing (its reports are not
	// "heard"): say so, or the operator sees recent reports and no
	// reason for the re-netboot.
	if pr := obs.Progress; pr != nil && pr.At.After(obs.LastHeardAt) && !pr.At.Before(obs.LifecycleAt) && !pr.At.Before(obs.RenetbootAt) {
		out += fmt.Sprintf("; progress still reported at %s but stalled at %s %d of %d bytes", pr.At.UTC().Format(time.RFC3339), pr.Step, pr.BytesDone, pr.BytesTotal)
	}
	return out
}

// silentCondition says, once a commissioning or deploying server has been
// silent for half of SilentAfter, what was last heard from it and what the
// controller does about it.
func silentCondition(name string, obs *state.Server, opts Options) (Condition, bool) {
	since, ok := silentSince(obs, opts)
	if !ok || opts.Now.Sub(since) <= opts.SilentAfter/2 {
		return Condition{}, false
	}
	deadline := opts.CommissionTimeout
	if obs.Lifecycle == state.LifecycleDeploying {
		deadline = opts.DeployTimeout
	}
	if opts.Now.Sub(obs.LifecycleAt) > deadline {
		return Condition{}, false // the timeout step says it
	}
	next := fmt.Sprintf("re-netboot %d of %d after %s of silence", obs.Renetboots+1, opts.MaxRenetboots, opts.SilentAfter)
	if obs.Renetboots >= opts.MaxRenetboots {
		next = fmt.Sprintf("%d re-netboots done; waiting for the deadline", obs.Renetboots)
	}
	if f, ok := bootStalled(obs); ok {
		return Condition{Subject: "server/" + name, Type: "Waiting", Reason: CondBootStalled,
			Message: fmt.Sprintf("%s: %s; %s", obs.Lifecycle, bootStallText(f, opts.Now), next)}, true
	}
	return Condition{Subject: "server/" + name, Type: "Waiting", Reason: "MachineSilent",
		Message: fmt.Sprintf("%s: no request from the machine for %s; last heard: %s; %s", obs.Lifecycle, opts.Now.Sub(since).Round(time.Second), lastHeard(obs), next)}, true
}

// CondBootStalled is the reason of a silent commissioning, deploying or
// release-wiping server whose last network boot fetch was a boot file (the
// kernel or the initrd) and which was not heard from since: its boot
// loader got the file and the ramdisk never called the controller. Under
// Secure Boot the usual cause is an image the firmware, shim or GRUB
// refused (an unsigned kernel, or one signed by a key shim does not trust:
// GRUB says "bad shim signature", then "you need to load the kernel
// first"). It replaces MachineSilent (or a release wipe's WipePending) for
// such a server, at half of Options.SilentAfter after the fetch, and
// clears as soon as the machine is heard again.
const CondBootStalled = "BootStalled"

// bootStalled returns the server's last boot file fetch when nothing was
// heard from its machine after it (LastHeard is that fetch) and it
// happened in the current phase and after the last re-netboot.
func bootStalled(obs *state.Server) (*state.BootFetch, bool) {
	f := obs.BootFetch
	if f == nil || !f.At.Equal(obs.LastHeardAt) || f.At.Before(obs.LifecycleAt) || f.At.Before(obs.RenetbootAt) {
		return nil, false
	}
	return f, true
}

// bootStallText says what the machine fetched, when, and what likely
// stopped it.
func bootStallText(f *state.BootFetch, now time.Time) string {
	out := fmt.Sprintf("boot stalled: the machine fetched %s by %s at %s and the ramdisk has not called the controller in the %s since",
		f.File, f.Via, f.At.UTC().Format(time.RFC3339), now.Sub(f.At).Round(time.Second))
	if f.SecureBoot {
		out += "; Secure Boot: the firmware, shim or GRUB may have refused an unsigned or untrusted image (the console shows GRUB's \"bad shim signature\")"
	}
	return out
}

// wipeBootStalled returns a running release wipe's last boot file fetch
// when nothing was heard from its machine after it: the ramdisk that
// erases the disks was fetched and never called (under Secure Boot, a
// refused kernel), as bootStalled for commissioning and deploys.
func wipeBootStalled(obs *state.Server) (*state.BootFetch, bool) {
	f := obs.BootFetch
	if obs.WipeStartedAt.IsZero() || f == nil || !f.At.Equal(obs.LastHeardAt) || f.At.Before(obs.WipeStartedAt) {
		return nil, false
	}
	return f, true
}

func sortSteps(s []Step) {
	sort.SliceStable(s, func(i, j int) bool {
		if s[i].Server != s[j].Server {
			return s[i].Server < s[j].Server
		}
		return actionInfo[s[i].Action].Order < actionInfo[s[j].Action].Order
	})
}

// sortedNames returns have's server names sorted: have.Names when it is
// exactly that (as long as Servers, strictly increasing, each a key of
// Servers: then it is the sorted key set), else the keys sorted here.
// The result is read-only.
func sortedNames(have state.Snapshot) []string {
	n := have.Names
	if len(n) != len(have.Servers) {
		return sortedKeys(have.Servers)
	}
	for i, name := range n {
		if i > 0 && n[i-1] >= name {
			return sortedKeys(have.Servers)
		}
		if _, ok := have.Servers[name]; !ok {
			return sortedKeys(have.Servers)
		}
	}
	return n
}

// anyProfile reports whether some profile of want satisfies f. The
// fleet-wide walks that act only for servers of a profile with a given
// block (firmware, storage, network) are skipped when none has it: each
// of their iterations would find no such profile and do nothing.
func anyProfile(want *inventory.Inventory, f func(*inventory.Profile) bool) bool {
	for i := range want.Profiles {
		if f(&want.Profiles[i]) {
			return true
		}
	}
	return false
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// archNote is ", arch A" for a profile whose image is not amd64 (the
// default every server without a stated or reported arch is taken for).
func archNote(want *inventory.Inventory, profile string) string {
	if _, a := imageArch(want, profile); a != "" && a != inventory.ArchAMD64 {
		return ", arch " + a
	}
	return ""
}

func zoneOrAny(z string) string {
	if z == "" {
		return "any"
	}
	return z
}

// DigestPrefix returns the first 12 hex digits of an inventory digest
// ("sha256:HEX" or bare hex), the form `machinactl approve` takes.
func DigestPrefix(d string) string {
	d = strings.TrimPrefix(d, "sha256:")
	if len(d) > 12 {
		return d[:12]
	}
	return d
}

// wipeRetryAt is when a failed release wipe is tried again: WipeFailedAt
// plus WipeRetryBase doubled per further failure, capped at WipeRetryCap
// (no jitter: Compute is pure).
func wipeRetryAt(obs *state.Server, opts Options) time.Time {
	return obs.WipeFailedAt.Add(RetryDelay(opts.WipeRetryBase, opts.WipeRetryCap, obs.WipeFailures))
}

// wipeCondition reports a released server's wipe in status: WipePending
// while it waits or runs, WipeFailed (with the last reason and the retry
// time) after a failure.
func wipeCondition(name string, obs *state.Server, opts Options) (Condition, bool) {
	if obs.Lifecycle != state.LifecycleReady || !obs.NeedsWipe {
		return Condition{}, false
	}
	if obs.WipeFailures > 0 && obs.WipeUnsupported && obs.WipeStartedAt.IsZero() {
		return Condition{Subject: "server/" + name, Type: "EraseUnsupported", Reason: "EraseUnsupported",
			Message: fmt.Sprintf("%s; no weaker erase is run; next try after %s; not allocatable until erased",
				strings.TrimPrefix(obs.LastError, "release wipe failed: EraseUnsupported: "), wipeRetryAt(obs, opts).UTC().Format(time.RFC3339))}, true
	}
	if f, ok := wipeBootStalled(obs); ok && opts.Now.Sub(f.At) > opts.SilentAfter/2 {
		return Condition{Subject: "server/" + name, Type: "Waiting", Reason: CondBootStalled,
			Message: fmt.Sprintf("release wipe running since %s: %s; the wipe times out at %s; not allocatable until wiped",
				obs.WipeStartedAt.UTC().Format(time.RFC3339), bootStallText(f, opts.Now), obs.WipeStartedAt.Add(opts.WipeTimeout).UTC().Format(time.RFC3339))}, true
	}
	if obs.WipeFailures > 0 {
		// A retry that is running has cleared LastError (the netboot
		// step succeeded); say it runs instead of an empty reason.
		if !obs.WipeStartedAt.IsZero() {
			return Condition{Subject: "server/" + name, Type: "WipeFailed", Reason: "ReleaseWipeFailed",
				Message: fmt.Sprintf("release wipe failed %d times; retry running since %s; not allocatable until wiped",
					obs.WipeFailures, obs.WipeStartedAt.UTC().Format(time.RFC3339))}, true
		}
		last := ""
		if obs.LastError != "" {
			last = " (last: " + obs.LastError + ")"
		}
		return Condition{Subject: "server/" + name, Type: "WipeFailed", Reason: "ReleaseWipeFailed",
			Message: fmt.Sprintf("release wipe failed %d times%s; next try after %s; not allocatable until wiped",
				obs.WipeFailures, last, wipeRetryAt(obs, opts).UTC().Format(time.RFC3339))}, true
	}
	msg := "released; release wipe not started yet; not allocatable until wiped"
	if !obs.WipeStartedAt.IsZero() {
		msg = "release wipe running since " + obs.WipeStartedAt.UTC().Format(time.RFC3339) + "; not allocatable until wiped"
	}
	return Condition{Subject: "server/" + name, Type: "WipePending", Reason: "ReleaseWipe", Message: msg}, true
}
