package bmcsim

import (
	"context"
	"fmt"
	"sync"
)

// PowerBackend is the machine behind the emulated BMC. The emulator asks it
// for the ComputerSystem PowerState on every read of the System and hands it
// every accepted ComputerSystem.Reset. The VM lab implements it over QMP
// (system_powerdown, system_reset, quit/start); tests use [MemoryPower].
//
// Implementations MUST be safe for concurrent use.
type PowerBackend interface {
	// PowerState returns the Redfish PowerState: "On", "Off", "PoweringOn"
	// or "PoweringOff".
	PowerState(ctx context.Context) (string, error)
	// Reset performs a Redfish ResetType the emulator already checked
	// against the tree's AllowableValues (On, ForceOn, ForceOff,
	// GracefulShutdown, GracefulRestart, ForceRestart, PowerCycle,
	// PushPowerButton, Nmi).
	Reset(ctx context.Context, resetType string) error
}

// BootBackend is optionally implemented by a [PowerBackend] that models the
// boot device (the VM lab's vmpower.VM). After the emulator accepts a PATCH of
// ComputerSystem.Boot it calls SetBootOverride with the stored
// BootSourceOverrideTarget ("Pxe", "Hdd", "Cd", "None", ...) and
// BootSourceOverrideEnabled ("Once", "Continuous", "Disabled"), i.e. the
// values after vendor quirks. An error fails the PATCH with 500 and the
// emulator's state keeps the new values (as a BMC whose host side failed).
type BootBackend interface {
	SetBootOverride(ctx context.Context, target, enabled string) error
}

// MediaBackend is optionally implemented by a [PowerBackend] that models
// virtual media. The emulator calls InsertMedia with the Image URI after it
// accepted VirtualMedia.InsertMedia (or a PATCH setting Image), and
// EjectMedia after VirtualMedia.EjectMedia (or a PATCH clearing it). An
// error fails the request with 500 and leaves the slot unchanged.
type MediaBackend interface {
	InsertMedia(ctx context.Context, image string) error
	EjectMedia(ctx context.Context) error
}

// MemoryPower is an in-memory [PowerBackend]. The zero value is a machine
// that is off. Safe for concurrent use.
type MemoryPower struct {
	mu sync.Mutex
	on bool
	// pending is the state reads will show once lag reads have passed.
	pending *bool
	lag     int
	// Lag is how many PowerState reads still show the old state after a
	// Reset, modelling a BMC that applies power changes asynchronously.
	Lag int
	// IgnoreGraceful makes GracefulShutdown and GracefulRestart do nothing,
	// like a host OS that ignores ACPI power-button events.
	IgnoreGraceful bool
	// Resets counts the Reset calls accepted, by ResetType.
	Resets map[string]int
}

// NewMemoryPower returns a backend that starts on or off.
func NewMemoryPower(on bool) *MemoryPower { return &MemoryPower{on: on} }

// PowerState implements [PowerBackend].
func (p *MemoryPower) PowerState(context.Context) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pending != nil {
		if p.lag <= 0 {
			p.on = *p.pending
			p.pending = nil
		} else {
			p.lag--
		}
	}
	if p.on {
		return "On", nil
	}
	return "Off", nil
}

// Reset implements [PowerBackend].
func (p *MemoryPower) Reset(_ context.Context, resetType string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.Resets == nil {
		p.Resets = map[string]int{}
	}
	p.Resets[resetType]++
	cur := p.on
	if p.pending != nil {
		cur = *p.pending
	}
	next := cur
	switch resetType {
	case "On", "ForceOn", "PowerCycle", "ForceRestart":
		next = true
	case "GracefulRestart":
		if p.IgnoreGraceful {
			return nil
		}
		next = true
	case "ForceOff":
		next = false
	case "GracefulShutdown":
		if p.IgnoreGraceful {
			return nil
		}
		next = false
	case "PushPowerButton":
		next = !cur
	case "Nmi":
		return nil
	default:
		return fmt.Errorf("bmcsim: reset type %q not modelled", resetType)
	}
	if p.Lag > 0 {
		p.pending, p.lag = &next, p.Lag
		return nil
	}
	p.on, p.pending = next, nil
	return nil
}

// Set puts the machine on or off at once, as if someone pressed the
// button behind the BMC's back. It does not count as a Reset.
func (p *MemoryPower) Set(on bool) {
	p.mu.Lock()
	p.on, p.pending = on, nil
	p.mu.Unlock()
}

// On reports the current (settled) power.
func (p *MemoryPower) On() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pending != nil {
		return *p.pending
	}
	return p.on
}
