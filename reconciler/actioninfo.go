package reconciler

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
	// ErrNoBMC (Plan does not plan it there).
	BMCRequired
)

// ActionInfo is everything known about one action kind, as data: the
// planner, the executor's limits, its journal and its failure rule all
// read this row (metal3 keeps its per-state handlers in one table too).
type ActionInfo struct {
	// Order places the action among one server's steps (Plan emits them
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
	ActDeploy:         {Order: 9, BMC: BMCRequired, Disruptive: true, PowersOn: true},
	ActFinishDeploy:   {Order: 10, BMC: BMCRequired},
	ActRestoreDisk:    {Order: 10, BMC: BMCRequired},
	ActPowerOn:        {Order: 11, BMC: BMCRequired, PowersOn: true, Counter: "powerOn"},
	ActPowerOff:       {Order: 12, BMC: BMCRequired, Disruptive: true, Counter: "powerOff"},
	ActPowerCycle:     {Order: 13, BMC: BMCRequired, Disruptive: true, PowersOn: true, Counter: "powerCycle"},
}

// Info returns a's row; false for an action this build does not know
// (say, from a journal written by another version).
func (a Action) Info() (ActionInfo, bool) {
	i, ok := actionInfo[a]
	return i, ok
}

// needsBMC reports whether a talks to the server's BMC. ActTimeout and
// ActRetire also do, but only to power off, which they skip on a server
// without a BMC.
func (a Action) needsBMC() bool { return actionInfo[a].BMC == BMCRequired }

// Disruptive reports whether a failed a is not retried blindly: the server
// stalls until its desired state or counter changes.
func (a Action) Disruptive() bool { return actionInfo[a].Disruptive }

// powersOn reports whether a may power the server on (or keep it on):
// what a fenced server must never get.
func (a Action) powersOn() bool { return actionInfo[a].PowersOn }
