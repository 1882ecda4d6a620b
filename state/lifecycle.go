package state

import (
	"fmt"
	"time"
)

// Lifecycle is a server's provisioning phase (docs/architecture.md "Lifecycle
// and power"). It changes only through Store.Transition.
type Lifecycle string

// Lifecycle values.
const (
	LifecycleNew           Lifecycle = "new"
	LifecycleCommissioning Lifecycle = "commissioning"
	LifecycleReady         Lifecycle = "ready"
	LifecycleAllocated     Lifecycle = "allocated"
	LifecycleDeploying     Lifecycle = "deploying"
	LifecycleDeployed      Lifecycle = "deployed"
	LifecycleFailed        Lifecycle = "failed"
	LifecycleRetired       Lifecycle = "retired"
)

// Lifecycles lists every lifecycle in table order.
func Lifecycles() []Lifecycle {
	return []Lifecycle{LifecycleNew, LifecycleCommissioning, LifecycleReady, LifecycleAllocated,
		LifecycleDeploying, LifecycleDeployed, LifecycleFailed, LifecycleRetired}
}

// moves is the complete table of allowed moves, exactly as docs/architecture.md lists:
// new→commissioning; commissioning→ready|failed|new;
// ready→allocated|commissioning|retired; allocated→deploying|ready;
// deploying→deployed|failed; deployed→ready|retired;
// failed→commissioning|new|retired; retired→new.
var moves = map[Lifecycle][]Lifecycle{
	LifecycleNew:           {LifecycleCommissioning},
	LifecycleCommissioning: {LifecycleReady, LifecycleFailed, LifecycleNew},
	LifecycleReady:         {LifecycleAllocated, LifecycleCommissioning, LifecycleRetired},
	LifecycleAllocated:     {LifecycleDeploying, LifecycleReady},
	LifecycleDeploying:     {LifecycleDeployed, LifecycleFailed},
	LifecycleDeployed:      {LifecycleReady, LifecycleRetired},
	LifecycleFailed:        {LifecycleCommissioning, LifecycleNew, LifecycleRetired},
	LifecycleRetired:       {LifecycleNew},
}

// CanTransition reports whether from→to is an allowed move. A move to the
// same lifecycle is never allowed.
func CanTransition(from, to Lifecycle) bool {
	for _, l := range moves[from] {
		if l == to {
			return true
		}
	}
	return false
}

// NextLifecycles returns the lifecycles reachable from l in one move, or nil
// for an unknown l. The slice is a copy.
func NextLifecycles(l Lifecycle) []Lifecycle {
	return append([]Lifecycle(nil), moves[l]...)
}

// Valid reports whether l is one of the eight lifecycles.
func (l Lifecycle) Valid() bool {
	_, ok := moves[l]
	return ok
}

// ParseLifecycle returns the Lifecycle named s, or an error wrapping
// ErrInvalid.
func ParseLifecycle(s string) (Lifecycle, error) {
	if l := Lifecycle(s); l.Valid() {
		return l, nil
	}
	return "", fmt.Errorf("parse lifecycle %q: %w", s, ErrInvalid)
}

// Power is a server's observed power state, tracked separately from its
// lifecycle.
type Power string

// Power states (docs/architecture.md "Lifecycle and power").
const (
	PowerRegistered Power = "registered" // known, never read or commanded
	PowerOn         Power = "powered_on"
	PowerOff        Power = "powered_off"
	PowerRebooting  Power = "rebooting"
)

// Valid reports whether p is one of the four power states.
func (p Power) Valid() bool {
	switch p {
	case PowerRegistered, PowerOn, PowerOff, PowerRebooting:
		return true
	}
	return false
}

// PowerSource says where a power state came from.
type PowerSource string

// Power sources.
const (
	PowerSourceBMC     PowerSource = "bmc"     // read from the BMC
	PowerSourceCommand PowerSource = "command" // the last command Machina sent
	// PowerSourceAgent: the ramdisk said it powers the machine off itself
	// (after its commissioning report or release wipe). Not proven: a
	// guest kernel can hang on the way down (seen in the VM lab: a soft
	// lockup in virtio_net after "final action poweroff"), so the plan
	// confirms it through the BMC after plan.Options.ConfirmOffAfter
	// (plan.ActConfirmOff).
	PowerSourceAgent PowerSource = "agent"
)

// PowerStatus is a power state with its source and observation time (UTC).
type PowerStatus struct {
	State  Power       `json:"state"`
	Source PowerSource `json:"source,omitempty"`
	At     time.Time   `json:"at"`
	// OffClaimedAt is when the ramdisk last said it powers the machine
	// off (SetPower with PowerSourceAgent), kept until the controller's
	// confirm-off reads the BMC itself (SetPower with PowerSourceBMC) or
	// the controller commands the power (PowerSourceCommand). A BMC
	// sweep's read (ObserveBMC) leaves it set: a machine read on within
	// the minute after the claim is exactly what confirm-off is for. Zero
	// when no claim is pending.
	OffClaimedAt time.Time `json:"offClaimedAt,omitzero"`
}

// OffClaimPending returns when the ramdisk said it powers the machine off
// and no BMC read of the controller's confirm-off or power command has
// settled it since, and whether such a claim is pending. A record written
// before OffClaimedAt existed counts by its agent-sourced off.
func (p PowerStatus) OffClaimPending() (time.Time, bool) {
	if !p.OffClaimedAt.IsZero() {
		return p.OffClaimedAt, true
	}
	if p.Source == PowerSourceAgent && p.State == PowerOff {
		return p.At, true
	}
	return time.Time{}, false
}
