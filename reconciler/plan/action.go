package plan

import "sort"

// Action is one kind of step the executor can take on a server.
type Action string

// The actions. Compute emits a server's steps in the Order of their rows
// in actionInfo.
const (
	ActRegister       Action = "register"        // create the observed record (lifecycle new)
	ActUpdateIdentity Action = "update-identity" // copy zone, site, rack, boot MAC and BMC settings
	ActUnretire       Action = "unretire"        // retired → new
	ActRetire         Action = "retire"          // power off, → retired
	ActTimeout        Action = "timeout"         // commissioning or deploying past its deadline → failed (powered off)
	ActCommission     Action = "commission"      // new|ready|failed → commissioning: PXE boot override, power on/reset
	ActRelease        Action = "release"         // deployed → ready: power off, marked for the release wipe
	ActWipe           Action = "wipe"            // ready and NeedsWipe: PXE boot override, power on/reset into the ramdisk's wipe mode
	ActAllocate       Action = "allocate"        // ready → allocated to a profile
	ActDeploy         Action = "deploy"          // allocated → deploying: PXE boot override, power on/reset
	ActFirmware       Action = "firmware"        // allocated, profile's firmware block differs: BIOS settings, RAID volumes, updates, Secure Boot; reset; read back
	ActFinishDeploy   Action = "finish-deploy"   // deployed by the ramdisk: boot override to disk, read back
	ActRestoreDisk    Action = "restore-disk"    // a persistent netboot override was used: disk again after the boot it was for, read back
	ActPowerOn        Action = "power-on"        // actions.powerOn counter
	ActPowerOff       Action = "power-off"       // actions.powerOff counter
	ActPowerCycle     Action = "power-cycle"     // actions.powerCycle counter
	ActAdopt          Action = "adopt"           // an auto-enrolled server renamed in review: move its record to the servers.yaml name
	ActRenetboot      Action = "renetboot"       // commissioning or deploying, machine silent: PXE boot override, reset (fresh tokens)
	ActConfirmOff     Action = "confirm-off"     // the ramdisk said it powers off: after ConfirmOffAfter, off through the BMC (nothing sent when it is)
)

// BMCUse says how an action uses the server's BMC.
type BMCUse int

const (
	// BMCNone: a store-only step. It is not journalled and no driver is
	// opened for it.
	BMCNone BMCUse = iota
	// BMCIfPresent: journalled; it powers the server off when it has a
	// BMC and skips that on a server without one (timeout, retire).
	BMCIfPresent
	// BMCRequired: journalled; on a server without a BMC it fails with
	// reconciler.ErrNoBMC (Compute does not plan it there).
	BMCRequired
)

// ActionInfo is everything known about one action kind, as data: the
// planner, the executor's limits, its journal and its failure rule all
// read this row (metal3 keeps its per-state handlers in one table too).
type ActionInfo struct {
	// Order places the action among one server's steps (Compute emits them
	// in this order).
	Order int
	// BMC is how the action uses the BMC.
	BMC BMCUse
	// Disruptive: a failure is not retried blindly; the server stalls
	// until its desired state or counter changes.
	Disruptive bool
	// PowersOn: the action may power the server on (or keep it on), so a
	// fenced server never gets it.
	PowersOn bool
	// Counter is the servers.yaml actions.* counter that done records as
	// observed ("" for none).
	Counter string
	// Unlimited: the step skips the per-BMC and per-rack limits (record
	// moves that touch neither: register, adopt).
	Unlimited bool
}

// actionInfo has one row per Action; TestEveryActionHasRowAndHandler
// checks it against the handler table.
var actionInfo = map[Action]ActionInfo{
	ActRegister:       {Order: 0, BMC: BMCNone, Unlimited: true},
	ActAdopt:          {Order: 0, BMC: BMCNone, Unlimited: true},
	ActUpdateIdentity: {Order: 1, BMC: BMCNone},
	ActUnretire:       {Order: 2, BMC: BMCNone},
	ActRetire:         {Order: 3, BMC: BMCIfPresent, Disruptive: true},
	ActTimeout:        {Order: 4, BMC: BMCIfPresent},
	ActCommission:     {Order: 5, BMC: BMCRequired, Disruptive: true, PowersOn: true, Counter: "commission"},
	ActRenetboot:      {Order: 5, BMC: BMCRequired},
	ActRelease:        {Order: 6, BMC: BMCRequired, Disruptive: true},
	ActWipe:           {Order: 7, BMC: BMCRequired, PowersOn: true},
	ActAllocate:       {Order: 8, BMC: BMCNone, PowersOn: true},
	ActFirmware:       {Order: 8, BMC: BMCRequired, Disruptive: true, PowersOn: true},
	ActDeploy:         {Order: 9, BMC: BMCRequired, Disruptive: true, PowersOn: true},
	ActFinishDeploy:   {Order: 10, BMC: BMCRequired},
	ActRestoreDisk:    {Order: 10, BMC: BMCRequired},
	ActPowerOn:        {Order: 11, BMC: BMCRequired, PowersOn: true, Counter: "powerOn"},
	ActPowerOff:       {Order: 12, BMC: BMCRequired, Disruptive: true, Counter: "powerOff"},
	ActPowerCycle:     {Order: 13, BMC: BMCRequired, Disruptive: true, PowersOn: true, Counter: "powerCycle"},
	ActConfirmOff:     {Order: 14, BMC: BMCRequired},
}

// Info returns a's row; false for an action this build does not know
// (say, from a journal written by another version).
func (a Action) Info() (ActionInfo, bool) {
	i, ok := actionInfo[a]
	return i, ok
}

// Actions returns every action kind this build knows (one per row of the
// table), by Order, then name. The executor's tests check it has a
// handler for each.
func Actions() []Action {
	out := make([]Action, 0, len(actionInfo))
	for a := range actionInfo {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool {
		if oi, oj := actionInfo[out[i]].Order, actionInfo[out[j]].Order; oi != oj {
			return oi < oj
		}
		return out[i] < out[j]
	})
	return out
}

// NeedsBMC reports whether a cannot run without the server's BMC
// (BMCRequired). ActTimeout and ActRetire also use it, but only to power
// off, which they skip on a server without a BMC.
func (a Action) NeedsBMC() bool { return actionInfo[a].BMC == BMCRequired }

// Disruptive reports whether a failed a is not retried blindly: the server
// stalls until its desired state or counter changes.
func (a Action) Disruptive() bool { return actionInfo[a].Disruptive }

// PowersOn reports whether a may power the server on (or keep it on):
// what a fenced server must never get.
func (a Action) PowersOn() bool { return actionInfo[a].PowersOn }
