package vmpower

import (
	"context"
	"fmt"
)

// PowerBackend has the method set of bmcsim.PowerBackend (bmc/bmcsim,
// branch i4), declared here so this package does not import bmcsim: *VM
// can be passed as bmcsim's Config.Power as is.
type PowerBackend interface {
	// PowerState returns the Redfish PowerState ("On" or "Off" here).
	PowerState(ctx context.Context) (string, error)
	// Reset performs a Redfish ResetType.
	Reset(ctx context.Context, resetType string) error
}

// BootBackend is what a Redfish emulator needs to forward a boot override
// PATCH (ComputerSystem.Boot) to the machine. bmcsim does not call such a
// hook yet; the lab wiring must add it.
type BootBackend interface {
	SetBootOverride(ctx context.Context, target, enabled string) error
}

// MediaBackend is what a Redfish emulator needs to forward
// VirtualMedia.InsertMedia / EjectMedia to the machine.
type MediaBackend interface {
	InsertMedia(ctx context.Context, image string) error
	EjectMedia(ctx context.Context) error
}

var (
	_ PowerBackend = (*VM)(nil)
	_ BootBackend  = (*VM)(nil)
	_ MediaBackend = (*VM)(nil)
)

// SetBootOverride applies a Redfish boot override: target is
// Boot.BootSourceOverrideTarget ("Pxe", "Hdd", "Cd", "UefiHttp" is not
// modelled; "None" means disk) and enabled is BootSourceOverrideEnabled
// ("Once", "Continuous", or "Disabled", which restores disk). It takes
// effect at the next power on, power cycle or ForceRestart.
func (v *VM) SetBootOverride(_ context.Context, target, enabled string) error {
	var dev BootDevice
	switch target {
	case "Pxe":
		dev = BootPXE
	case "Hdd", "None":
		dev = BootDisk
	case "Cd":
		dev = BootCD
	default:
		return fmt.Errorf("vmpower: boot override target %q: %w", target, ErrInvalidConfig)
	}
	switch enabled {
	case "Once":
		return v.SetBootDevice(dev, false)
	case "Continuous":
		return v.SetBootDevice(dev, true)
	case "Disabled":
		return v.SetBootDevice(BootDisk, true)
	}
	return fmt.Errorf("vmpower: boot override enabled %q: %w", enabled, ErrInvalidConfig)
}
