package v1

// StoragePlan is the disk layout a deploy plan asks the ramdisk to make
// before it writes the image (docs/storage.md): the controller lays the
// profile's storage layout onto the server's commissioned disks and names
// each disk by its stable identities and size, which the agent matches
// against the disks it finds (never by kernel name alone).
type StoragePlan struct {
	Root         StorageRoot          `json:"root"`
	VolumeGroups []StorageVolumeGroup `json:"volumeGroups,omitempty"`
}

// StorageRAID1 is StorageRoot.RAID for a Linux md RAID1 (metadata 1.0).
const StorageRAID1 = "raid1"

// StorageRoot is the device the image is written to: one disk, or two
// disks mirrored by md (RAID StorageRAID1).
type StorageRoot struct {
	RAID  string           `json:"raid,omitempty"`
	Disks []StorageDiskRef `json:"disks"`
	// SizeBytes is how much of the root device the image's partitions
	// take, its root partition grown to end there; 0 is the whole device
	// (up to the seed).
	SizeBytes int64 `json:"sizeBytes,omitempty"`
}

// StorageDiskRef names one disk as commissioning saw it. The agent takes
// the disk whose by-path, WWN or serial (the first set, in that order)
// match and whose size is SizeBytes; Name is only for messages.
type StorageDiskRef struct {
	Name      string `json:"name,omitempty"`
	ByPath    string `json:"byPath,omitempty"`
	WWN       string `json:"wwn,omitempty"`
	Serial    string `json:"serial,omitempty"`
	SizeBytes int64  `json:"sizeBytes"`
}

// StorageVolumeGroup is an LVM volume group on the rest of the root
// device (Rest: a partition after the root's SizeBytes) or on whole Disks:
// each disk a physical volume, or with RAID StorageRAID1 the two Disks
// mirrored by md (metadata 1.2, array name "machina-" + Name) and the
// array the one physical volume.
type StorageVolumeGroup struct {
	Name    string           `json:"name"`
	Rest    bool             `json:"rest,omitempty"`
	RAID    string           `json:"raid,omitempty"`
	Disks   []StorageDiskRef `json:"disks,omitempty"`
	Volumes []StorageVolume  `json:"volumes,omitempty"`
}

// StorageVolume is a logical volume: SizeBytes (0: the rest of its
// group), and an optional Filesystem ("ext4", "xfs", "swap") with a
// MountPoint written to the deployed OS's fstab.
type StorageVolume struct {
	Name       string `json:"name"`
	SizeBytes  int64  `json:"sizeBytes,omitempty"`
	Filesystem string `json:"filesystem,omitempty"`
	MountPoint string `json:"mountPoint,omitempty"`
}
