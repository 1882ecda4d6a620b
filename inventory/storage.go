package inventory

import (
	"errors"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Storage is a profile's disk layout for an image deploy (docs/storage.md):
// where the image's root goes (one disk, or a Linux md RAID1 across two),
// how much of that device the root takes, and the LVM volume groups made
// of the rest and of other disks, with their logical volumes, filesystems
// and mount points. The ramdisk lays it out before the image is written;
// nil keeps the single-disk deploy (smallest fitting disk or rootDevice).
type Storage struct {
	Root         RootLayout    `json:"root"`
	VolumeGroups []VolumeGroup `json:"volumeGroups,omitempty"`
}

// Root layouts: StorageRAIDNone writes the image to one disk,
// StorageRAID1 to an md RAID1 (metadata 1.0) of two disks.
const (
	StorageRAIDNone = ""
	StorageRAID1    = "raid1"
)

// SizeRest is a size that takes what is left of the device ("rest").
const SizeRest = "rest"

// Volume group placements: VGOnRest uses the rest of the root device
// (after the root's size: the rest of the disk, or of the RAID1), VGOnDisks
// whole disks chosen by a DiskMatch (with RAID StorageRAID1 in a group:
// an md RAID1 of two such disks, the group's one physical volume).
const (
	VGOnRest  = "rest"
	VGOnDisks = "disks"
)

// RootLayout is where the image goes.
type RootLayout struct {
	// RAID is StorageRAIDNone (one disk) or StorageRAID1 (two disks).
	RAID string `json:"raid,omitempty"`
	// Disks narrows which disks may hold the root; the smallest fitting
	// ones are taken, as in a deploy without a layout.
	Disks DiskMatch `json:"disks,omitzero"`
	// Size is how much of the root device the image's partitions take
	// (its root partition is grown to end there): SizeRest (the default)
	// or a size in GiB or TiB ("100GiB").
	Size string `json:"size,omitempty"`
}

// DiskMatch chooses disks by their commissioning facts. Every set field
// must hold; WWN and ByPath, when set, list the only disks allowed (WWN
// compared ignoring case and a "0x", "naa.", "eui." or "wwn-" prefix;
// by-path names with or without /dev/disk/by-path/). Kernel names (sda,
// nvme0n1) are not stable across boots and cannot be named.
type DiskMatch struct {
	MinSizeGiB int64 `json:"minSizeGiB,omitempty"`
	// Rotational is true for spinning disks, false for SSD and NVMe; nil
	// matches either.
	Rotational *bool `json:"rotational,omitempty"`
	// Model is a shell pattern (path.Match) over the disk's model string.
	Model string `json:"model,omitempty"`
	// Transport is "nvme", "sata", "sas", "virtio" or "scsi".
	Transport string   `json:"transport,omitempty"`
	WWN       []string `json:"wwn,omitempty"`
	ByPath    []string `json:"byPath,omitempty"`
}

// IsZero reports whether m matches every disk.
func (m DiskMatch) IsZero() bool {
	return m.MinSizeGiB == 0 && m.Rotational == nil && m.Model == "" && m.Transport == "" && len(m.WWN) == 0 && len(m.ByPath) == 0
}

// VolumeGroup is one LVM volume group the ramdisk creates.
type VolumeGroup struct {
	// Name is the volume group's name (namerule.VolumeGroup).
	Name string `json:"name"`
	// From is VGOnRest or VGOnDisks. The key is not "on",
	// which YAML 1.1 reads as the boolean true.
	From string `json:"from"`
	// Disks chooses the physical volumes for VGOnDisks, among the disks
	// the root and earlier volume groups did not take.
	Disks DiskMatch `json:"disks,omitzero"`
	// Count is how many matching disks VGOnDisks takes (smallest first);
	// 0 takes every matching disk, at least one. With RAID StorageRAID1
	// it is 0 or 2: the mirror's two members.
	Count int `json:"count,omitempty"`
	// RAID is StorageRAIDNone (each disk its own physical volume) or, for
	// VGOnDisks, StorageRAID1: the two disks become an md RAID1 (metadata
	// 1.2) named RAIDArrayName(Name), and the array the group's physical
	// volume.
	RAID string `json:"raid,omitempty"`
	// Volumes are its logical volumes, made in order.
	Volumes []LogicalVolume `json:"volumes,omitempty"`
}

// LogicalVolume is one LVM logical volume and what is made on it.
type LogicalVolume struct {
	// Name is the logical volume's name (namerule.VolumeGroup's rule).
	Name string `json:"name"`
	// Size is in GiB or TiB, or SizeRest (the last volume only: what is
	// left of the group).
	Size string `json:"size"`
	// Filesystem is "ext4", "xfs", "swap" or "" (a raw volume, for a
	// hypervisor's guests).
	Filesystem string `json:"filesystem,omitempty"`
	// MountPoint is an absolute path in the deployed OS (not "/"); it
	// needs an ext4 or xfs Filesystem and goes into its fstab.
	MountPoint string `json:"mountPoint,omitempty"`
}

// ParseSize returns a layout size in bytes: "100GiB" or "2TiB" (a
// positive integer and the unit). SizeRest and anything else are an
// error.
func ParseSize(s string) (int64, error) {
	n, unit := s, int64(0)
	switch {
	case strings.HasSuffix(s, "GiB"):
		n, unit = strings.TrimSuffix(s, "GiB"), 1<<30
	case strings.HasSuffix(s, "TiB"):
		n, unit = strings.TrimSuffix(s, "TiB"), 1<<40
	default:
		return 0, fmt.Errorf("size %q: want a number of GiB or TiB (\"100GiB\")", s)
	}
	v, err := strconv.ParseInt(n, 10, 64)
	if err != nil || v <= 0 || v > (1<<62)/unit {
		return 0, fmt.Errorf("size %q: want a positive whole number of %s", s, s[len(n):])
	}
	return v * unit, nil
}

// StorageDisk is one commissioned disk as layout selection sees it (the
// commissioning report's facts; state.Disk carries them).
type StorageDisk struct {
	Name       string `json:"name"`
	SizeBytes  int64  `json:"sizeBytes"`
	Model      string `json:"model,omitempty"`
	Serial     string `json:"serial,omitempty"`
	WWN        string `json:"wwn,omitempty"`
	ByPath     string `json:"byPath,omitempty"`
	Rotational bool   `json:"rotational,omitempty"`
	Transport  string `json:"transport,omitempty"`
}

// ID is the disk's most stable identity: by-path, WWN, serial, else its
// kernel name.
func (d StorageDisk) ID() string {
	for _, s := range []string{d.ByPath, d.WWN, d.Serial} {
		if s != "" {
			return s
		}
	}
	return d.Name
}

// StoragePlan is a layout laid onto one server's disks: which disks hold
// the root and each volume group, and every size in bytes. PlanStorage
// makes it; the deploy plan carries it to the ramdisk.
type StoragePlan struct {
	Root         RootPlan          `json:"root"`
	VolumeGroups []VolumeGroupPlan `json:"volumeGroups,omitempty"`
}

// RootPlan is the root device: one disk, or two in a RAID1.
type RootPlan struct {
	RAID  string        `json:"raid,omitempty"`
	Disks []StorageDisk `json:"disks"`
	// SizeBytes is the root's size on the device; 0 is the rest.
	SizeBytes int64 `json:"sizeBytes,omitempty"`
}

// VolumeGroupPlan is one volume group on the rest of the root device
// (Rest) or on whole disks; with RAID StorageRAID1 on an md RAID1 of its
// two disks.
type VolumeGroupPlan struct {
	Name    string              `json:"name"`
	Rest    bool                `json:"rest,omitempty"`
	RAID    string              `json:"raid,omitempty"`
	Disks   []StorageDisk       `json:"disks,omitempty"`
	Volumes []LogicalVolumePlan `json:"volumes,omitempty"`
}

// LogicalVolumePlan is a logical volume with its size in bytes (0: the
// rest of the group).
type LogicalVolumePlan struct {
	Name       string `json:"name"`
	SizeBytes  int64  `json:"sizeBytes,omitempty"`
	Filesystem string `json:"filesystem,omitempty"`
	MountPoint string `json:"mountPoint,omitempty"`
}

// StorageOverheadBytes is what a layout's root device keeps besides the
// image and the volume groups: the NoCloud seed partition (8 MiB), GPT
// headers and alignment, and md's metadata 1.0 superblock and bitmap at
// the end of each member. Validation and selection count it once.
const StorageOverheadBytes = 64 << 20

// RAIDDataOverheadBytes is what an md RAID1 with metadata 1.2 (a volume
// group's mirror) keeps of each member before its data: the superblock
// at 4 KiB, the internal write-intent bitmap and bad-block log, and the
// data offset mdadm leaves as reshape headroom (128 MiB on members of 128
// GiB or more, less on smaller ones; mdadm(8) --data-offset).
const RAIDDataOverheadBytes = 136 << 20

// RAIDArrayMaxName is the longest volume group name whose mirror's md
// name, RAIDArrayName(name) with mdadm's "any:" homehost prefix, fits
// the 32-byte name field of md's version-1 superblock.
const RAIDArrayMaxName = 19

// RAIDArrayName is the md array name (mdadm --name, and its /dev/md/
// link) of a volume group's mirror.
func RAIDArrayName(vg string) string { return "machina-" + vg }

// lvmOverheadBytes is kept per physical volume for LVM's metadata area
// (1 MiB by default) and extent rounding (4 MiB extents).
const lvmOverheadBytes = 8 << 20

// ErrStorageUnfit is the class of PlanStorage failures: the server's
// commissioned disks cannot hold the layout.
var ErrStorageUnfit = errors.New("layout does not fit the commissioned disks")

// StorageUnfitError says which part of the layout found too few disks and
// why the others were passed over.
type StorageUnfitError struct {
	// Part is "root" or "volumeGroup NAME".
	Part string
	// Want describes the disks the part needs ("2 disks, rotational=false,
	// at least 120 GiB").
	Want  string
	Found int
	// Skipped lists the other disks and why each did not match.
	Skipped []string
}

func (e *StorageUnfitError) Error() string {
	s := fmt.Sprintf("%s needs %s; found %d", e.Part, e.Want, e.Found)
	if len(e.Skipped) > 0 {
		s += " (" + strings.Join(e.Skipped, "; ") + ")"
	}
	return s
}

// Unwrap makes errors.Is(err, ErrStorageUnfit) hold.
func (e *StorageUnfitError) Unwrap() error { return ErrStorageUnfit }

// PlanStorage lays layout onto disks, a server's commissioned disks. It
// is pure and deterministic: the root takes the smallest matching disks of
// at least minRootBytes and of the layout's needs (size ties broken by
// by-path, WWN, serial, name), one or two by RAID; then each volume group
// on disks takes the smallest matching disks left (two for a group on a
// RAID1, whose capacity is its smaller member's). Fixed logical volume
// sizes must fit their group. A part that finds too few disks, or too
// little room, is a *StorageUnfitError naming what is missing.
func PlanStorage(layout Storage, disks []StorageDisk, minRootBytes int64) (StoragePlan, error) {
	var plan StoragePlan
	sorted := append([]StorageDisk(nil), disks...)
	sort.SliceStable(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if a.SizeBytes != b.SizeBytes {
			return a.SizeBytes < b.SizeBytes
		}
		return a.ByPath+"\x00"+a.WWN+"\x00"+a.Serial+"\x00"+a.Name < b.ByPath+"\x00"+b.WWN+"\x00"+b.Serial+"\x00"+b.Name
	})
	used := map[int]bool{}
	rootSize, err := layoutRootSize(layout)
	if err != nil {
		return plan, err
	}
	need := max(minRootBytes, layout.Root.Disks.MinSizeGiB<<30, rootNeed(layout, rootSize))
	n := 1
	if layout.Root.RAID == StorageRAID1 {
		n = 2
	}
	root, err := take(sorted, used, layout.Root.Disks, need, n, "root")
	if err != nil {
		return plan, err
	}
	plan.Root = RootPlan{RAID: layout.Root.RAID, Disks: root, SizeBytes: rootSize}
	for _, vg := range layout.VolumeGroups {
		vp := VolumeGroupPlan{Name: vg.Name, Rest: vg.From == VGOnRest}
		var capacity int64
		if vp.Rest {
			capacity = root[0].SizeBytes - rootSize - StorageOverheadBytes - lvmOverheadBytes
		} else {
			count, part := vg.Count, "volumeGroup "+vg.Name
			if vg.RAID == StorageRAID1 {
				count, part = 2, "volumeGroup "+vg.Name+" (raid1)"
			}
			got, err := take(sorted, used, vg.Disks, vg.Disks.MinSizeGiB<<30, count, part)
			if err != nil {
				return plan, err
			}
			vp.Disks, vp.RAID = got, vg.RAID
			for _, d := range got {
				capacity += d.SizeBytes - lvmOverheadBytes
			}
			if vg.RAID == StorageRAID1 {
				// the mirror holds what its smaller member holds
				capacity = min(got[0].SizeBytes, got[1].SizeBytes) - RAIDDataOverheadBytes - lvmOverheadBytes
			}
		}
		var fixed int64
		for _, lv := range vg.Volumes {
			lp := LogicalVolumePlan{Name: lv.Name, Filesystem: lv.Filesystem, MountPoint: lv.MountPoint}
			if lv.Size != SizeRest {
				if lp.SizeBytes, err = ParseSize(lv.Size); err != nil {
					return plan, fmt.Errorf("volumeGroup %s volume %s: %w", vg.Name, lv.Name, err)
				}
				fixed += lp.SizeBytes
			}
			vp.Volumes = append(vp.Volumes, lp)
		}
		if fixed > capacity {
			return plan, &StorageUnfitError{Part: "volumeGroup " + vg.Name, Found: len(vp.Disks),
				Want: fmt.Sprintf("%s for its fixed volumes; its disks hold %s", gib(fixed), gib(max(capacity, 0)))}
		}
		plan.VolumeGroups = append(plan.VolumeGroups, vp)
	}
	return plan, nil
}

// layoutRootSize is the root's fixed size in bytes, 0 for the rest.
func layoutRootSize(layout Storage) (int64, error) {
	if layout.Root.Size == "" || layout.Root.Size == SizeRest {
		return 0, nil
	}
	n, err := ParseSize(layout.Root.Size)
	if err != nil {
		return 0, fmt.Errorf("root: %w", err)
	}
	return n, nil
}

// rootNeed is the smallest root device a layout fits on: the root's fixed
// size, the fixed volumes of a volume group on the rest, and the
// overheads; 0 when the root takes the rest and no group shares it.
func rootNeed(layout Storage, rootSize int64) int64 {
	var rest int64
	onRest := false
	for _, vg := range layout.VolumeGroups {
		if vg.From != VGOnRest {
			continue
		}
		onRest = true
		for _, lv := range vg.Volumes {
			if n, err := ParseSize(lv.Size); err == nil {
				rest += n
			}
		}
	}
	if rootSize == 0 && !onRest {
		return 0
	}
	need := rootSize + StorageOverheadBytes
	if onRest {
		need += rest + lvmOverheadBytes
	}
	return need
}

// take picks n (0: every matching, at least one) of the smallest unused
// disks matching m of at least minBytes each, and marks them used.
func take(sorted []StorageDisk, used map[int]bool, m DiskMatch, minBytes int64, n int, part string) ([]StorageDisk, error) {
	var got []StorageDisk
	var idx []int
	var skipped []string
	for i, d := range sorted {
		why := ""
		switch {
		case used[i]:
			why = "taken by an earlier part"
		case n > 0 && len(got) == n:
			continue
		case d.ByPath == "" && d.WWN == "" && d.Serial == "":
			why = "no stable identity (by-path, WWN or serial) to find it by at deploy"
		case d.SizeBytes < minBytes:
			why = fmt.Sprintf("%s < %s", gib(d.SizeBytes), gib(minBytes))
		default:
			why = m.mismatch(d)
		}
		if why != "" {
			skipped = append(skipped, d.ID()+": "+why)
			continue
		}
		got = append(got, d)
		idx = append(idx, i)
	}
	if len(got) == 0 || (n > 0 && len(got) < n) {
		return nil, &StorageUnfitError{Part: part, Want: m.describe(n, minBytes), Found: len(got), Skipped: skipped}
	}
	for _, i := range idx {
		used[i] = true
	}
	return got, nil
}

// mismatch says why d does not match m, or "".
func (m DiskMatch) mismatch(d StorageDisk) string {
	switch {
	case m.Rotational != nil && d.Rotational != *m.Rotational:
		return "rotational=" + strconv.FormatBool(d.Rotational)
	case m.Transport != "" && d.Transport != m.Transport:
		return "transport " + orNone(d.Transport)
	case m.Model != "" && !modelMatch(m.Model, d.Model):
		return "model " + orNone(d.Model)
	case len(m.WWN) > 0 && !anyOf(m.WWN, d.WWN, WWNEqual):
		return "wwn " + orNone(d.WWN) + " not listed"
	case len(m.ByPath) > 0 && !anyOf(m.ByPath, d.ByPath, byPathEqual):
		return "by-path " + orNone(d.ByPath) + " not listed"
	}
	return ""
}

func (m DiskMatch) describe(n int, minBytes int64) string {
	parts := []string{"1 disk"}
	switch n {
	case 0:
		parts[0] = "at least 1 disk"
	case 1:
	default:
		parts[0] = strconv.Itoa(n) + " disks"
	}
	if m.Rotational != nil {
		parts = append(parts, "rotational="+strconv.FormatBool(*m.Rotational))
	}
	if m.Transport != "" {
		parts = append(parts, "transport "+m.Transport)
	}
	if m.Model != "" {
		parts = append(parts, "model "+m.Model)
	}
	if len(m.WWN) > 0 {
		parts = append(parts, "wwn in ["+strings.Join(m.WWN, ", ")+"]")
	}
	if len(m.ByPath) > 0 {
		parts = append(parts, "by-path in ["+strings.Join(m.ByPath, ", ")+"]")
	}
	if minBytes > 0 {
		parts = append(parts, "at least "+gib(minBytes))
	}
	return strings.Join(parts, ", ")
}

func modelMatch(pattern, model string) bool {
	ok, err := path.Match(pattern, strings.TrimSpace(model))
	return err == nil && ok
}

func anyOf(list []string, v string, eq func(a, b string) bool) bool {
	for _, s := range list {
		if eq(s, v) {
			return true
		}
	}
	return false
}

// WWNEqual compares WWNs ignoring case and an optional "0x", "naa.",
// "eui.", "t10." or "wwn-" prefix (the sysfs wwid and the by-id names
// spell the same WWN differently).
func WWNEqual(a, b string) bool {
	norm := func(s string) string {
		s = strings.ToLower(strings.TrimSpace(s))
		for _, p := range []string{"wwn-", "0x", "naa.", "eui.", "t10."} {
			s = strings.TrimPrefix(s, p)
		}
		return s
	}
	return a != "" && b != "" && norm(a) == norm(b)
}

func byPathEqual(a, b string) bool {
	return b != "" && strings.TrimPrefix(a, "/dev/disk/by-path/") == strings.TrimPrefix(b, "/dev/disk/by-path/")
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// gib renders bytes as GiB, with one decimal when not whole.
func gib(n int64) string {
	if n%(1<<30) == 0 {
		return strconv.FormatInt(n>>30, 10) + " GiB"
	}
	return strconv.FormatFloat(float64(n)/(1<<30), 'f', 1, 64) + " GiB"
}
