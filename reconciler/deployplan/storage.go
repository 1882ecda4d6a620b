package deployplan

import (
	"fmt"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// storagePlan lays profile pr's storage layout onto the server's
// commissioned disks (inventory.PlanStorage, as the plan's allocation
// check does) and turns it into the agent's wire form; nil for a profile
// without a layout. A layout that no longer fits (the report changed
// since allocation) refuses the plan: nothing is written.
func storagePlan(pr *inventory.Profile, hw *state.Hardware) (*v1.StoragePlan, error) {
	if pr.Storage == nil {
		return nil, nil
	}
	var disks []inventory.StorageDisk
	if hw != nil {
		for _, d := range hw.Disks {
			if d.Transport == "usb" {
				continue
			}
			disks = append(disks, inventory.StorageDisk{Name: d.Name, SizeBytes: d.SizeBytes, Model: d.Model, Serial: d.Serial,
				WWN: d.WWN, ByPath: d.ByPath, Rotational: d.Rotational, Transport: d.Transport})
		}
	}
	sp, err := inventory.PlanStorage(*pr.Storage, disks, pr.Min.DiskGiB<<30)
	if err != nil {
		return nil, fmt.Errorf("profile %s storage: %w", pr.Name, err)
	}
	refs := func(ds []inventory.StorageDisk) []v1.StorageDiskRef {
		var out []v1.StorageDiskRef
		for _, d := range ds {
			out = append(out, v1.StorageDiskRef{Name: d.Name, ByPath: d.ByPath, WWN: d.WWN, Serial: d.Serial, SizeBytes: d.SizeBytes})
		}
		return out
	}
	out := &v1.StoragePlan{Root: v1.StorageRoot{RAID: sp.Root.RAID, Disks: refs(sp.Root.Disks), SizeBytes: sp.Root.SizeBytes}}
	for _, g := range sp.VolumeGroups {
		vg := v1.StorageVolumeGroup{Name: g.Name, Rest: g.Rest, RAID: g.RAID, Disks: refs(g.Disks)}
		for _, v := range g.Volumes {
			vg.Volumes = append(vg.Volumes, v1.StorageVolume{Name: v.Name, SizeBytes: v.SizeBytes, Filesystem: v.Filesystem, MountPoint: v.MountPoint})
		}
		out.VolumeGroups = append(out.VolumeGroups, vg)
	}
	return out, nil
}
