package inventory

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/machina-metal/machina/namerule"
)

// profileStorage checks a profile's storage layout beyond its schema: it
// is for image deploys only (an installer lays out its own disks); names
// of volume groups and of a group's volumes are unique and lvm(8) valid;
// mount points unique, absolute, clean and not "/"; a mount point only on
// ext4 or xfs; at most one group on the rest of the root device, and only
// when the root has a fixed size; "rest" only as a group's last volume;
// fixed volumes that fit the group's stated disk sizes; a group on a RAID1
// only on disks, with count 2 or none, and a name short enough for its md
// array's name; and a layout whose
// fixed sizes need a bigger root disk than the profile's min.diskGiB is
// refused (a server that passes min would be allocated and not fit).
func (c *crossChecker) profileStorage(base string, p Profile) {
	st := p.Storage
	if st == nil {
		return
	}
	pd, base := c.pd, base+"/storage"
	if p.Deploy != "" && p.Deploy != DeployImage {
		c.errAt(pd, base, SeverityError, fmt.Sprintf("a storage layout is laid out by the ramdisk for deploy: image; deploy %s installs through the distribution's installer, which lays out its own disks", p.Deploy))
	}
	rootSize, err := layoutRootSize(*st)
	if err != nil {
		c.errAt(pd, base+"/root/size", SeverityError, err.Error())
	}
	vgs, mounts := map[string]int{}, map[string]string{}
	onRest := -1
	for k, vg := range st.VolumeGroups {
		ptr := base + "/volumeGroups/" + strconv.Itoa(k)
		if j, dup := vgs[vg.Name]; dup {
			c.errAt(pd, ptr+"/name", SeverityError, fmt.Sprintf("volume group %q is named twice (first at %s)", vg.Name, c.where(pd, base+"/volumeGroups/"+strconv.Itoa(j)+"/name")))
		} else {
			vgs[vg.Name] = k
		}
		if err := namerule.VolumeGroup.Check(vg.Name); err != nil {
			c.errAt(pd, ptr+"/name", SeverityError, err.Error())
		}
		switch vg.From {
		case VGOnRest:
			if onRest >= 0 {
				c.errAt(pd, ptr+"/from", SeverityError, fmt.Sprintf("only one volume group can take the rest of the root device (first at %s)", c.where(pd, base+"/volumeGroups/"+strconv.Itoa(onRest)+"/from")))
			}
			onRest = k
			if rootSize == 0 && err == nil {
				c.errAt(pd, ptr+"/from", SeverityError, "the root takes the rest of its device (root.size is rest): give root a size (\"100GiB\") to leave room for this group")
			}
			if !vg.Disks.IsZero() || vg.Count != 0 {
				c.errAt(pd, ptr+"/disks", SeverityError, "a group on the rest of the root device takes no disks or count")
			}
			if vg.RAID != StorageRAIDNone {
				c.errAt(pd, ptr+"/raid", SeverityError, "a group on the rest of the root device lies on the root's device (mirrored when root.raid is raid1): raid is for a group from: disks")
			}
		case VGOnDisks:
			c.raidGroup(pd, ptr, vg)
			c.volumesFitDisks(pd, ptr, vg)
		}
		c.volumes(pd, ptr, vg, mounts)
	}
	c.storageFitsMin(pd, base, p, rootSize)
}

// volumes checks one group's logical volumes.
func (c *crossChecker) volumes(pd *doc, ptr string, vg VolumeGroup, mounts map[string]string) {
	lvs := map[string]bool{}
	for k, lv := range vg.Volumes {
		lp := ptr + "/volumes/" + strconv.Itoa(k)
		if lvs[lv.Name] {
			c.errAt(pd, lp+"/name", SeverityError, fmt.Sprintf("volume %q is named twice in group %s", lv.Name, vg.Name))
		}
		lvs[lv.Name] = true
		if err := namerule.VolumeGroup.Check(lv.Name); err != nil {
			c.errAt(pd, lp+"/name", SeverityError, strings.Replace(err.Error(), "volume group", "logical volume", 1))
		}
		if lv.Size == SizeRest {
			if k != len(vg.Volumes)-1 {
				c.errAt(pd, lp+"/size", SeverityError, "only the group's last volume can take the rest")
			}
		} else if _, err := ParseSize(lv.Size); err != nil {
			c.errAt(pd, lp+"/size", SeverityError, err.Error())
		}
		if lv.MountPoint == "" {
			continue
		}
		switch {
		case lv.Filesystem != "ext4" && lv.Filesystem != "xfs":
			c.errAt(pd, lp+"/mountPoint", SeverityError, fmt.Sprintf("a mount point needs filesystem ext4 or xfs, not %q", lv.Filesystem))
		case lv.MountPoint == "/" || !strings.HasPrefix(lv.MountPoint, "/") || path.Clean(lv.MountPoint) != lv.MountPoint:
			c.errAt(pd, lp+"/mountPoint", SeverityError, fmt.Sprintf("mount point %q must be an absolute clean path other than / (the image's root)", lv.MountPoint))
		case mounts[lv.MountPoint] != "":
			c.errAt(pd, lp+"/mountPoint", SeverityError, fmt.Sprintf("mount point %s is also used by %s", lv.MountPoint, mounts[lv.MountPoint]))
		default:
			mounts[lv.MountPoint] = vg.Name + "/" + lv.Name
		}
	}
}

// raidGroup checks a group on an md RAID1 of two disks: count, when set,
// is 2, and the group's name fits md's array name (RAIDArrayName).
func (c *crossChecker) raidGroup(pd *doc, ptr string, vg VolumeGroup) {
	if vg.RAID != StorageRAID1 {
		return
	}
	if vg.Count != 0 && vg.Count != 2 {
		c.errAt(pd, ptr+"/count", SeverityError, fmt.Sprintf("a group on a raid1 takes its mirror's 2 disks, not %d: omit count or make it 2", vg.Count))
	}
	if len(vg.Name) > RAIDArrayMaxName {
		c.errAt(pd, ptr+"/name", SeverityError, fmt.Sprintf("a group on a raid1 names its md array %s, which md's 32-byte superblock name holds only for group names of up to %d characters (this one has %d)", RAIDArrayName(vg.Name), RAIDArrayMaxName, len(vg.Name)))
	}
}

// volumesFitDisks checks a group on disks whose selector states a size:
// its fixed volumes must fit count (at least one) such disks.
func (c *crossChecker) volumesFitDisks(pd *doc, ptr string, vg VolumeGroup) {
	if vg.Disks.MinSizeGiB == 0 {
		return
	}
	fixed := fixedVolumes(vg)
	have := int64(max(vg.Count, 1)) * (vg.Disks.MinSizeGiB<<30 - lvmOverheadBytes)
	if vg.RAID == StorageRAID1 {
		have = vg.Disks.MinSizeGiB<<30 - RAIDDataOverheadBytes - lvmOverheadBytes
		if fixed > have {
			c.errAt(pd, ptr+"/volumes", SeverityError, fmt.Sprintf("fixed volumes need %s; a raid1 of disks.minSizeGiB %d holds %s", gib(fixed), vg.Disks.MinSizeGiB, gib(have)))
		}
		return
	}
	if fixed > have {
		c.errAt(pd, ptr+"/volumes", SeverityError, fmt.Sprintf("fixed volumes need %s; %d disk(s) of disks.minSizeGiB %d hold %s", gib(fixed), max(vg.Count, 1), vg.Disks.MinSizeGiB, gib(have)))
	}
}

// storageFitsMin refuses a layout whose root device must be larger than
// the profile's min.diskGiB (and root.disks.minSizeGiB, when larger) lets
// a server have.
func (c *crossChecker) storageFitsMin(pd *doc, base string, p Profile, rootSize int64) {
	need := rootNeed(*p.Storage, rootSize)
	if need == 0 || rootSize == 0 { // rest: nothing fixed, or a group on the rest (refused above)
		return
	}
	minBytes := max(p.Min.DiskGiB, p.Storage.Root.Disks.MinSizeGiB) << 30
	if need <= minBytes {
		return
	}
	field := base + "/root/size"
	for k, vg := range p.Storage.VolumeGroups {
		if vg.From == VGOnRest && fixedVolumes(vg) > 0 {
			field = base + "/volumeGroups/" + strconv.Itoa(k) + "/volumes"
		}
	}
	c.errAt(pd, field, SeverityError, fmt.Sprintf("the layout needs a root disk of at least %s (root size, fixed volumes on the rest, and room for the seed, GPT, RAID and LVM metadata); min.diskGiB is %d: a server that passes min would not fit. Raise min.diskGiB to %d or shrink the layout",
		gib(need), p.Min.DiskGiB, (need+(1<<30)-1)>>30))
}

func fixedVolumes(vg VolumeGroup) int64 {
	var n int64
	for _, lv := range vg.Volumes {
		if s, err := ParseSize(lv.Size); err == nil {
			n += s
		}
	}
	return n
}
