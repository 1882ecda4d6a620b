package plan

import (
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// CondStorageLayoutUnfit is the condition of a server whose commissioned
// disks cannot hold its profile's storage layout (too few matching disks,
// or too little room): it is not allocated to the profile, or, allocated,
// not deployed. The message names the part of the layout, the disks it
// needs and why each other disk did not match (inventory.PlanStorage).
const CondStorageLayoutUnfit = "StorageLayoutUnfit"

// StorageDisks returns a commissioning report's disks as storage layout
// selection sees them; nil hardware has none.
func StorageDisks(hw *state.Hardware) []inventory.StorageDisk {
	if hw == nil {
		return nil
	}
	out := make([]inventory.StorageDisk, 0, len(hw.Disks))
	for _, d := range hw.Disks {
		if d.Transport == "usb" {
			continue // never a deploy target (the ramdisk refuses USB disks)
		}
		out = append(out, inventory.StorageDisk{Name: d.Name, SizeBytes: d.SizeBytes, Model: d.Model, Serial: d.Serial,
			WWN: d.WWN, ByPath: d.ByPath, Rotational: d.Rotational, Transport: d.Transport})
	}
	return out
}

// PlanServerStorage lays profile pr's storage layout onto a server's
// commissioned disks (inventory.PlanStorage, with min.diskGiB as the
// root's least size). A profile without a layout gives a nil plan and
// no error.
func PlanServerStorage(pr *inventory.Profile, hw *state.Hardware) (*inventory.StoragePlan, error) {
	if pr == nil || pr.Storage == nil {
		return nil, nil
	}
	sp, err := inventory.PlanStorage(*pr.Storage, StorageDisks(hw), pr.Min.DiskGiB<<30)
	if err != nil {
		return nil, err
	}
	return &sp, nil
}

// storageRefused reports whether profile pr's storage layout does not fit
// the server's disks (Candidates skips such servers).
func storageRefused(pr *inventory.Profile, obs *state.Server) bool {
	if pr.Storage == nil {
		return false
	}
	_, err := PlanServerStorage(pr, obs.Hardware)
	return err != nil
}

// storage checks every ready or allocated server bound for a profile
// with a storage layout (allocated to it, pinned to it, or allocated to
// it in this plan): one whose commissioned disks cannot hold the layout
// gets CondStorageLayoutUnfit, and its allocate and deploy steps are
// dropped, so it is neither allocated nor written.
func (p *planning) storage() {
	if !anyProfile(p.want, func(pr *inventory.Profile) bool { return pr.Storage != nil }) {
		return // every server below would be skipped: no profile has a storage layout
	}
	blocked := map[string]Condition{}
	for i := range p.want.Servers {
		ws := &p.want.Servers[i]
		obs, ok := p.have.Servers[ws.Name]
		if !ok || ws.Want == inventory.WantRetired || (obs.Lifecycle != state.LifecycleReady && obs.Lifecycle != state.LifecycleAllocated) {
			continue
		}
		name := firmwareProfile(ws, obs)
		if planned, ok := p.allocated[ws.Name]; ok {
			name = planned
		}
		prof := p.want.Profile(name)
		if prof == nil || prof.Storage == nil || obs.Hardware == nil {
			continue
		}
		if _, err := PlanServerStorage(prof, obs.Hardware); err != nil {
			c := Condition{Subject: "server/" + ws.Name, Type: CondStorageLayoutUnfit, Reason: "DisksMissing",
				Message: "profile " + prof.Name + " storage: " + err.Error() + ": not allocated or deployed until its disks change (recommission) or the layout does"}
			p.cond(c)
			blocked[ws.Name] = c
			delete(p.allocated, ws.Name)
		}
	}
	if len(blocked) > 0 {
		p.res.Steps = dropAllocDeploy(p.res.Steps, blocked)
		p.disruptive = dropAllocDeploy(p.disruptive, blocked)
	}
}

// dropAllocDeploy removes the ActAllocate and ActDeploy steps of the
// named servers.
func dropAllocDeploy(steps []Step, names map[string]Condition) []Step {
	out := steps[:0:0]
	for _, s := range steps {
		if _, bad := names[s.Server]; bad && (s.Action == ActAllocate || s.Action == ActDeploy) {
			continue
		}
		out = append(out, s)
	}
	return out
}

// EraseDisks chooses the release erase method of each of a server's
// commissioned disks for profile pr (inventory.PlanErase over
// StorageDisks: the first of pr.EraseOverrides that matches a disk, else
// pr.Erase), as the allocation records them; nil when pr has no
// overrides, so every disk takes pr.Erase, or the server has no
// commissioning report.
func EraseDisks(pr *inventory.Profile, hw *state.Hardware) []state.EraseDisk {
	if pr == nil || len(pr.EraseOverrides) == 0 {
		return nil
	}
	var out []state.EraseDisk
	for _, e := range inventory.PlanErase(pr.Erase, pr.EraseOverrides, StorageDisks(hw)) {
		d := e.Disk
		out = append(out, state.EraseDisk{Name: d.Name, ByPath: d.ByPath, WWN: d.WWN, Serial: d.Serial, SizeBytes: d.SizeBytes, Method: string(e.Method)})
	}
	return out
}
