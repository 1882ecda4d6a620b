package inventory

import (
	"fmt"
	"strconv"
)

// DiskErase is one disk's erase method in an erase plan (PlanErase).
type DiskErase struct {
	Disk   StorageDisk
	Method EraseMethod
	// Override is the index in Profile.EraseOverrides of the entry that
	// chose Method, or -1 for the profile's Erase.
	Override int
}

// PlanErase chooses each disk's release erase method: the method of the
// first override whose selector matches the disk (DiskMatch, every set
// field; MinSizeGiB as a least size), else def ("" stays "", the
// metadata wipe). It returns one entry per disk, in the order given. An
// override that matches no disk is not an error: one profile serves
// servers with different disks.
func PlanErase(def EraseMethod, overrides []EraseOverride, disks []StorageDisk) []DiskErase {
	out := make([]DiskErase, 0, len(disks))
	for _, d := range disks {
		e := DiskErase{Disk: d, Method: def, Override: -1}
		for i, o := range overrides {
			if o.Disks.Matches(d) {
				e.Method, e.Override = o.Method, i
				break
			}
		}
		out = append(out, e)
	}
	return out
}

// Matches reports whether disk d has every fact m sets (MinSizeGiB as a
// least size). The zero DiskMatch matches every disk.
func (m DiskMatch) Matches(d StorageDisk) bool {
	if m.MinSizeGiB > 0 && d.SizeBytes < m.MinSizeGiB<<30 {
		return false
	}
	return m.mismatch(d) == ""
}

// secureTransports are the transports whose disks the ramdisk can run a
// drive's own erase on (NVMe Format, ATA SECURITY ERASE UNIT); a SAS or
// SCSI disk (no SANITIZE or FORMAT UNIT in the agent) and a virtio disk
// (a virtual disk has no erase of its own) cannot.
var secureTransports = map[string]bool{"nvme": true, "sata": true}

// profileErase checks a profile's erase overrides beyond the schema: an
// override asking secure of a transport whose disks can never do it
// (virtio, sas, scsi) is refused here rather than at every release; an
// override that repeats an earlier one's selector can never apply and is
// refused too.
func (c *crossChecker) profileErase(base string, p Profile) {
	for i, o := range p.EraseOverrides {
		ptr := base + "/eraseOverrides/" + strconv.Itoa(i)
		if o.Method == EraseSecure && o.Disks.Transport != "" && !secureTransports[o.Disks.Transport] {
			c.errAt(c.pd, ptr+"/method", SeverityError, fmt.Sprintf("method secure selects transport %s disks, which cannot do a secure erase (the ramdisk runs NVMe Format or ATA SECURITY ERASE UNIT only); use zero or discard for them", o.Disks.Transport))
		}
		for j := range i {
			if sameMatch(p.EraseOverrides[j].Disks, o.Disks) {
				c.errAt(c.pd, ptr+"/disks", SeverityError, fmt.Sprintf("the same disks as the earlier override at %s, which takes them first: this one never applies", c.where(c.pd, base+"/eraseOverrides/"+strconv.Itoa(j)+"/disks")))
				break
			}
		}
	}
}

// sameMatch reports whether a and b set the same facts.
func sameMatch(a, b DiskMatch) bool {
	eqs := func(x, y []string) bool {
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if x[i] != y[i] {
				return false
			}
		}
		return true
	}
	rot := (a.Rotational == nil) == (b.Rotational == nil) && (a.Rotational == nil || *a.Rotational == *b.Rotational)
	return a.MinSizeGiB == b.MinSizeGiB && rot && a.Model == b.Model && a.Transport == b.Transport && eqs(a.WWN, b.WWN) && eqs(a.ByPath, b.ByPath)
}
