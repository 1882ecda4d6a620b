package inventory

import (
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var updateStorage = flag.Bool("update-storage", false, "rewrite testdata/storageplan golden plans")

var (
	ssd = false
	hdd = true
)

// Disk sets of the golden plans, as commissioning reports them.
var (
	twoSATAPlusNVMe = []StorageDisk{
		{Name: "nvme0n1", SizeBytes: 1920383410176, Model: "Dell Ent NVMe P5600 MU", Serial: "PHAB1", WWN: "eui.01000000000000005cd2e4a1b2c3d4e5", ByPath: "pci-0000:03:00.0-nvme-1", Transport: "nvme"},
		{Name: "sdb", SizeBytes: 480103981056, Model: "SAMSUNG MZ7KH480", Serial: "S1B", WWN: "naa.5002538e40a1b2c2", ByPath: "pci-0000:00:1f.2-ata-2", Transport: "sata"},
		{Name: "sda", SizeBytes: 480103981056, Model: "SAMSUNG MZ7KH480", Serial: "S1A", WWN: "naa.5002538e40a1b2c1", ByPath: "pci-0000:00:1f.2-ata-1", Transport: "sata"},
	}
	mixedRotational = []StorageDisk{
		{Name: "sda", SizeBytes: 4000787030016, Model: "ST4000NM0035", WWN: "naa.5000c500a1b2c3d1", ByPath: "pci-0000:00:17.0-ata-1", Rotational: true, Transport: "sata"},
		{Name: "sdb", SizeBytes: 4000787030016, Model: "ST4000NM0035", WWN: "naa.5000c500a1b2c3d2", ByPath: "pci-0000:00:17.0-ata-2", Rotational: true, Transport: "sata"},
		{Name: "sdc", SizeBytes: 960197124096, Model: "INTEL SSDSC2KB960G8", WWN: "naa.55cd2e414f1a2b3c", ByPath: "pci-0000:00:17.0-ata-3", Transport: "sata"},
		{Name: "sdd", SizeBytes: 480103981056, Model: "INTEL SSDSC2KB480G8", WWN: "naa.55cd2e414f1a2b3d", ByPath: "pci-0000:00:17.0-ata-4", Transport: "sata"},
	}
	oneSSDTwoHDD = []StorageDisk{
		{Name: "sda", SizeBytes: 480103981056, Model: "INTEL SSDSC2KB480G8", ByPath: "pci-0000:00:17.0-ata-1", Transport: "sata"},
		{Name: "sdb", SizeBytes: 4000787030016, Model: "ST4000NM0035", ByPath: "pci-0000:00:17.0-ata-2", Rotational: true, Transport: "sata"},
		{Name: "sdc", SizeBytes: 4000787030016, Model: "ST4000NM0035", ByPath: "pci-0000:00:17.0-ata-3", Rotational: true, Transport: "sata"},
	}
)

var hypervisorLayout = Storage{
	Root: RootLayout{RAID: StorageRAID1, Disks: DiskMatch{Rotational: &ssd}, Size: "100GiB"},
	VolumeGroups: []VolumeGroup{
		{Name: "vg-system", From: VGOnRest, Volumes: []LogicalVolume{
			{Name: "logs", Size: "20GiB", Filesystem: "ext4", MountPoint: "/var/log"},
			{Name: "images", Size: SizeRest, Filesystem: "xfs", MountPoint: "/var/lib/libvirt/images"},
		}},
		{Name: "vg-guests", From: VGOnDisks, Disks: DiskMatch{Transport: "nvme"}},
	},
}

// TestPlanStorageGolden lays layouts onto disk sets and compares each
// plan (or the refusal's text) with testdata/storageplan/NAME.golden
// (rewrite with -update-storage, then read the diff).
func TestPlanStorageGolden(t *testing.T) {
	cases := []struct {
		name   string
		layout Storage
		disks  []StorageDisk
		minGiB int64
	}{
		// RAID1 root on the two equal SATA SSDs (smallest fitting), the rest
		// of the mirror a volume group, the NVMe its own group.
		{"two-equal-plus-nvme", hypervisorLayout, twoSATAPlusNVMe, 200},
		// Root on the two SSDs of different sizes (the mirror is the
		// smaller); both HDDs make the data group.
		{"mixed-rotational", Storage{
			Root: RootLayout{RAID: StorageRAID1, Disks: DiskMatch{Rotational: &ssd}, Size: "200GiB"},
			VolumeGroups: []VolumeGroup{
				{Name: "vg-fast", From: VGOnRest, Volumes: []LogicalVolume{{Name: "cache", Size: SizeRest}}},
				{Name: "vg-data", From: VGOnDisks, Disks: DiskMatch{Rotational: &hdd}, Volumes: []LogicalVolume{
					{Name: "backups", Size: "6TiB", Filesystem: "xfs", MountPoint: "/srv/backups"},
				}},
			}}, mixedRotational, 100},
		// One SSD where the RAID1 root asks for two: refused, naming what
		// is missing and why each other disk did not match.
		{"too-few-ssd", hypervisorLayout, oneSSDTwoHDD, 200},
		// The NVMe group finds no NVMe disk left.
		{"no-nvme", hypervisorLayout, mixedRotational, 200},
		// Root by WWN (either spelling) on one disk, the whole disk.
		{"wwn-selector", Storage{Root: RootLayout{Disks: DiskMatch{WWN: []string{"0x5000C500A1B2C3D2", "naa.55cd2e414f1a2b3d"}}}}, mixedRotational, 0},
		// Groups on named by-path disks, one with a count.
		{"by-path-selector", Storage{
			Root: RootLayout{Disks: DiskMatch{ByPath: []string{"/dev/disk/by-path/pci-0000:00:17.0-ata-3"}}},
			VolumeGroups: []VolumeGroup{{Name: "vg0", From: VGOnDisks, Count: 1,
				Disks: DiskMatch{ByPath: []string{"pci-0000:00:17.0-ata-1", "pci-0000:00:17.0-ata-2"}}}},
		}, mixedRotational, 0},
		// Fixed volumes larger than the group's disks.
		{"volumes-too-big", Storage{
			Root:         RootLayout{Size: "100GiB"},
			VolumeGroups: []VolumeGroup{{Name: "vg0", From: VGOnRest, Volumes: []LogicalVolume{{Name: "big", Size: "400GiB"}}}},
		}, oneSSDTwoHDD[:1], 0},
		// Root mirrored on the two SSDs, a group on a RAID1 of the two HDDs
		// (its capacity the smaller member's, less md's and LVM's
		// metadata): four disks, two arrays.
		{"vg-on-raid1", Storage{
			Root: RootLayout{RAID: StorageRAID1, Disks: DiskMatch{Rotational: &ssd}},
			VolumeGroups: []VolumeGroup{{Name: "vg-data", From: VGOnDisks, RAID: StorageRAID1, Disks: DiskMatch{Rotational: &hdd},
				Volumes: []LogicalVolume{{Name: "backups", Size: "3TiB", Filesystem: "xfs", MountPoint: "/srv/backups"}, {Name: "scratch", Size: SizeRest}}}},
		}, mixedRotational, 100},
		// The group's RAID1 finds one HDD where it needs two: refused,
		// naming the group's mirror and what it found.
		{"vg-raid1-one-disk", Storage{
			Root:         RootLayout{Disks: DiskMatch{Rotational: &ssd}},
			VolumeGroups: []VolumeGroup{{Name: "vg-data", From: VGOnDisks, RAID: StorageRAID1, Disks: DiskMatch{Rotational: &hdd}}},
		}, oneSSDTwoHDD[:2], 100},
		// A model pattern that matches no disk.
		{"model-unmatched", Storage{Root: RootLayout{Disks: DiskMatch{Model: "SAMSUNG*"}}}, oneSSDTwoHDD, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := PlanStorage(tc.layout, tc.disks, tc.minGiB<<30)
			var got []byte
			if err != nil {
				if !errors.Is(err, ErrStorageUnfit) {
					t.Fatalf("error %v is not ErrStorageUnfit", err)
				}
				got = []byte("refused: " + err.Error() + "\n")
			} else {
				got, _ = json.MarshalIndent(plan, "", "  ")
				got = append(got, '\n')
			}
			file := filepath.Join("testdata", "storageplan", tc.name+".golden")
			if *updateStorage {
				if err := os.WriteFile(file, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("read golden (go test ./inventory -run TestPlanStorageGolden -update-storage): %v", err)
			}
			if string(got) != string(want) {
				t.Errorf("plan differs from %s:\ngot:\n%s\nwant:\n%s", file, got, want)
			}
		})
	}
}

// TestPlanStorageOrderIndependent: the plan does not depend on the order
// the kernel probed the disks in (two equal disks tie on size and are
// ordered by their stable identity).
func TestPlanStorageOrderIndependent(t *testing.T) {
	a, err := PlanStorage(hypervisorLayout, twoSATAPlusNVMe, 200<<30)
	if err != nil {
		t.Fatal(err)
	}
	rev := []StorageDisk{twoSATAPlusNVMe[2], twoSATAPlusNVMe[0], twoSATAPlusNVMe[1]}
	b, err := PlanStorage(hypervisorLayout, rev, 200<<30)
	if err != nil {
		t.Fatal(err)
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if string(ja) != string(jb) {
		t.Errorf("plan depends on disk order:\n%s\n%s", ja, jb)
	}
	if a.Root.Disks[0].Name != "sda" || a.Root.Disks[1].Name != "sdb" {
		t.Errorf("root disks = %s, %s; want sda (ata-1), sdb (ata-2)", a.Root.Disks[0].Name, a.Root.Disks[1].Name)
	}
}

// TestLoadStorage: a profile's storage block loads into the layout types.
func TestLoadStorage(t *testing.T) {
	res, err := loadDir(t, "testdata/valid/storage")
	if err != nil {
		t.Fatal(err)
	}
	st := res.Inventory.Profile("hypervisor").Storage
	if st == nil || st.Root.RAID != StorageRAID1 || st.Root.Size != "100GiB" || st.Root.Disks.Rotational == nil || *st.Root.Disks.Rotational {
		t.Fatalf("storage = %+v", st)
	}
	if len(st.VolumeGroups) != 2 || st.VolumeGroups[0].From != VGOnRest || st.VolumeGroups[1].From != VGOnDisks ||
		st.VolumeGroups[1].Disks.ByPath[0] != "pci-0000:03:00.0-nvme-1" || st.VolumeGroups[0].Volumes[1].MountPoint != "/var/lib/libvirt/images" {
		t.Errorf("volume groups = %+v", st.VolumeGroups)
	}
	for _, v := range []struct {
		s    string
		want int64
	}{{"100GiB", 100 << 30}, {"2TiB", 2 << 40}, {"rest", -1}, {"0GiB", -1}, {"12", -1}} {
		got, err := ParseSize(v.s)
		if (err != nil) != (v.want < 0) || (err == nil && got != v.want) {
			t.Errorf("ParseSize(%q) = %d, %v", v.s, got, err)
		}
	}
}
