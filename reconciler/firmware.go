package reconciler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/state"
)

// ReadFirmware reads what the plan checks a profile's firmware block
// against, through the optional capabilities of drv (bmc.BIOSConfigurer,
// bmc.RAIDConfigurer, bmc.FirmwareUpdater, bmc.SecureBootConfigurer): the
// BIOS attributes, pending settings and AttributeRegistry; the storage
// controllers with their drives and volumes; the firmware inventory; and
// Secure Boot. An area the driver lacks, or the BMC answers with
// bmc.ErrUnsupported (no Bios, Storage, UpdateService or SecureBoot
// resource), is recorded in Unsupported with the reason; an IPMI BMC has
// all four there. Any other error ends the read (wrapped, naming the
// area): a half read is never stored, so a passing check never rests on
// a missing area. at is the read's time (UTC).
func ReadFirmware(ctx context.Context, drv bmc.Driver, at time.Time) (*state.Firmware, error) {
	fw := &state.Firmware{ReadAt: at.UTC()}
	missing := func(area string, err error) error {
		if err == nil || errors.Is(err, bmc.ErrUnsupported) {
			why := "the BMC's protocol has no such interface"
			if err != nil {
				why = err.Error()
			}
			if fw.Unsupported == nil {
				fw.Unsupported = map[string]string{}
			}
			fw.Unsupported[area] = why
			return nil
		}
		return fmt.Errorf("read firmware %s: %w", area, err)
	}
	if bc, ok := drv.(bmc.BIOSConfigurer); !ok {
		_ = missing(state.FirmwareAreaBIOS, nil)
	} else if b, err := bc.BIOS(ctx); err != nil {
		if err := missing(state.FirmwareAreaBIOS, err); err != nil {
			return nil, err
		}
	} else {
		fw.BIOS = biosState(b)
	}
	if rc, ok := drv.(bmc.RAIDConfigurer); !ok {
		_ = missing(state.FirmwareAreaRAID, nil)
	} else if cs, err := rc.Storage(ctx); err != nil {
		if err := missing(state.FirmwareAreaRAID, err); err != nil {
			return nil, err
		}
	} else {
		fw.Storage = storageState(cs)
	}
	if fu, ok := drv.(bmc.FirmwareUpdater); !ok {
		_ = missing(state.FirmwareAreaVersions, nil)
	} else if comps, err := fu.FirmwareInventory(ctx); err != nil {
		if err := missing(state.FirmwareAreaVersions, err); err != nil {
			return nil, err
		}
	} else {
		for _, c := range comps {
			fw.Components = append(fw.Components, state.FirmwareComponent{ID: c.ID, Name: c.Name, Version: c.Version, Updateable: c.Updateable})
		}
	}
	if sc, ok := drv.(bmc.SecureBootConfigurer); !ok {
		_ = missing(state.FirmwareAreaSecureBoot, nil)
	} else if sb, err := sc.SecureBoot(ctx); err != nil {
		if err := missing(state.FirmwareAreaSecureBoot, err); err != nil {
			return nil, err
		}
	} else {
		fw.SecureBoot = &state.SecureBootState{Enable: sb.Enable, CurrentBoot: sb.CurrentBoot}
	}
	return fw, nil
}

// biosState is the store's compact copy of a BIOS read: the registry
// keeps only what a check needs.
func biosState(b *bmc.BIOS) *state.FirmwareBIOS {
	out := &state.FirmwareBIOS{Attributes: map[string]any(b.Attributes), Pending: map[string]any(b.Pending)}
	for _, t := range b.SupportedApplyTimes {
		out.ApplyTimes = append(out.ApplyTimes, string(t))
	}
	if b.Registry == nil {
		return out
	}
	out.RegistryID = b.Registry.ID
	out.Registry = make([]state.BIOSAttribute, 0, len(b.Registry.Attributes))
	for _, a := range b.Registry.Attributes {
		sa := state.BIOSAttribute{Name: a.Name, Type: string(a.Type), Values: a.AllowedValues, ReadOnly: a.ReadOnly, ResetRequired: a.ResetRequired}
		switch a.Type {
		case bmc.AttrInteger:
			sa.Min, sa.Max = a.LowerBound, a.UpperBound
		case bmc.AttrString, bmc.AttrPassword:
			sa.Min, sa.Max = a.MinLength, a.MaxLength
		}
		out.Registry = append(out.Registry, sa)
	}
	// The plan looks attributes up by binary search.
	slices.SortFunc(out.Registry, func(a, b state.BIOSAttribute) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func storageState(cs []bmc.StorageController) []state.StorageController {
	out := make([]state.StorageController, 0, len(cs))
	for _, c := range cs {
		sc := state.StorageController{ID: c.ID, RAIDTypes: c.RAIDTypes, CanCreateVolumes: c.CanCreateVolumes}
		for _, d := range c.Drives {
			sc.Drives = append(sc.Drives, state.StorageDrive{ID: d.ID, CapacityBytes: d.CapacityBytes, MediaType: d.MediaType})
		}
		for _, v := range c.Volumes {
			sc.Volumes = append(sc.Volumes, state.Volume{ID: v.ID, Name: v.Name, RAIDType: v.RAIDType, CapacityBytes: v.CapacityBytes, Drives: v.Drives})
		}
		out = append(out, sc)
	}
	return out
}
