package plan

import (
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// raid1Layout mirrors the root across two non-rotational disks.
func raid1Layout() *inventory.Storage {
	ssd := false
	return &inventory.Storage{Root: inventory.RootLayout{RAID: inventory.StorageRAID1, Disks: inventory.DiskMatch{Rotational: &ssd}, Size: "50GiB"},
		VolumeGroups: []inventory.VolumeGroup{{Name: "vg0", From: inventory.VGOnRest}}}
}

func withDisks(snap state.Snapshot, name string, disks ...state.Disk) {
	s := snap.Servers[name]
	hw := *s.Hardware
	hw.Disks = disks
	s.Hardware = &hw
	snap.Servers[name] = s
}

// TestPlanStorageRefusesTooFewDisks: a server pinned to a profile whose
// layout wants a RAID1 of two SSDs is allocated and deployed when its
// commissioning found two, and neither allocated nor deployed when it
// found one: a StorageLayoutUnfit condition names the missing disk and
// why the HDD did not match. Count-based allocation passes it over for a
// server whose disks fit.
func TestPlanStorageRefusesTooFewDisks(t *testing.T) {
	inv := cloneInv(exampleInventory(t))
	inv.Profile("hypervisor").Storage = raid1Layout()
	inv.Server("r1-n03").Want, inv.Server("r1-n03").Profile = inventory.WantDeployed, "hypervisor"
	two := []state.Disk{{Name: "sda", SizeBytes: 480 << 30, ByPath: "pci-0000:00:1f.2-ata-1"}, {Name: "sdb", SizeBytes: 480 << 30, ByPath: "pci-0000:00:1f.2-ata-2"}}
	one := []state.Disk{two[0], {Name: "sdb", SizeBytes: 4000 << 30, Rotational: true, ByPath: "pci-0000:00:1f.2-ata-2"}}
	plan := func(disks []state.Disk) ([]string, []Condition) {
		snap := steadyFleet(inv)
		withDisks(snap, "r1-n03", disks...)
		res := Compute(inv, snap, Options{Now: planT0.Add(time.Minute)})
		var steps []string
		for _, st := range res.Steps {
			if st.Server == "r1-n03" {
				steps = append(steps, string(st.Action))
			}
		}
		var conds []Condition
		for _, c := range res.Conditions {
			if c.Type == CondStorageLayoutUnfit {
				conds = append(conds, c)
			}
		}
		return steps, conds
	}
	steps, conds := plan(two)
	if strings.Join(steps, ",") != "allocate,deploy" || len(conds) != 0 {
		t.Errorf("two SSDs: steps %v, conditions %v; want allocate,deploy and none", steps, conds)
	}
	steps, conds = plan(one)
	if len(steps) != 0 {
		t.Errorf("one SSD: steps %v; want none", steps)
	}
	if len(conds) != 1 || conds[0].Subject != "server/r1-n03" ||
		!strings.Contains(conds[0].Message, "root needs 2 disks, rotational=false") || !strings.Contains(conds[0].Message, "pci-0000:00:1f.2-ata-2: rotational=true") {
		t.Errorf("one SSD: conditions %+v; want one StorageLayoutUnfit naming the missing disk", conds)
	}

	snap := steadyFleet(inv)
	for name := range snap.Servers {
		if snap.Servers[name].Lifecycle == state.LifecycleReady {
			withDisks(snap, name, one...)
		}
	}
	withDisks(snap, "r1-n04", two...)
	var names []string
	for _, s := range Candidates(*inv.Profile("hypervisor"), inv, snap, nil) {
		names = append(names, s.Name)
	}
	if strings.Join(names, ",") != "r1-n04" {
		t.Errorf("candidates %v; want only r1-n04 (the others have one SSD)", names)
	}
}

// TestPlanStorageVolumeGroupOnRAID1: a layout with a RAID1 root on two
// SSDs and a volume group on a RAID1 of two HDDs deploys a server with
// four such disks; a server with one HDD gets StorageLayoutUnfit naming
// the group's mirror, the two disks it needs, and what it found.
func TestPlanStorageVolumeGroupOnRAID1(t *testing.T) {
	inv := cloneInv(exampleInventory(t))
	hdd := true
	layout := raid1Layout()
	layout.VolumeGroups = append(layout.VolumeGroups, inventory.VolumeGroup{Name: "vg-data", From: inventory.VGOnDisks,
		RAID: inventory.StorageRAID1, Disks: inventory.DiskMatch{Rotational: &hdd}})
	inv.Profile("hypervisor").Storage = layout
	inv.Server("r1-n03").Want, inv.Server("r1-n03").Profile = inventory.WantDeployed, "hypervisor"
	four := []state.Disk{
		{Name: "sda", SizeBytes: 480 << 30, ByPath: "pci-0000:00:1f.2-ata-1"}, {Name: "sdb", SizeBytes: 480 << 30, ByPath: "pci-0000:00:1f.2-ata-2"},
		{Name: "sdc", SizeBytes: 4000 << 30, Rotational: true, ByPath: "pci-0000:00:1f.2-ata-3"}, {Name: "sdd", SizeBytes: 4000 << 30, Rotational: true, ByPath: "pci-0000:00:1f.2-ata-4"},
	}
	plan := func(disks []state.Disk) ([]string, []Condition) {
		snap := steadyFleet(inv)
		withDisks(snap, "r1-n03", disks...)
		res := Compute(inv, snap, Options{Now: planT0.Add(time.Minute)})
		var steps []string
		for _, st := range res.Steps {
			if st.Server == "r1-n03" {
				steps = append(steps, string(st.Action))
			}
		}
		var conds []Condition
		for _, c := range res.Conditions {
			if c.Type == CondStorageLayoutUnfit {
				conds = append(conds, c)
			}
		}
		return steps, conds
	}
	if steps, conds := plan(four); strings.Join(steps, ",") != "allocate,deploy" || len(conds) != 0 {
		t.Errorf("four disks: steps %v, conditions %v; want allocate,deploy and none", steps, conds)
	}
	steps, conds := plan(four[:3])
	if len(steps) != 0 || len(conds) != 1 || conds[0].Subject != "server/r1-n03" ||
		!strings.Contains(conds[0].Message, "volumeGroup vg-data (raid1) needs 2 disks, rotational=true; found 1") {
		t.Errorf("one HDD: steps %v, conditions %+v; want none and one StorageLayoutUnfit naming the group's mirror", steps, conds)
	}
}
