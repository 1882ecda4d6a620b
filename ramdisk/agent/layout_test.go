package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/ramdisk/agent/agenttest"
)

// threeDiskMachine is the qemu-q35 tree with two more virtio disks (vdb,
// vdc: 256 MiB each, serials machina-vm1 and machina-vm2, by-path
// pci-0000:00:05.0 and pci-0000:00:06.0), and a dev folder holding all
// three as sparse files filled with a marker at both ends.
func threeDiskMachine(t *testing.T) (root, dev string) {
	t.Helper()
	return diskMachine(t, "vdb", "vdc")
}

// diskMachine is the qemu-q35 tree with more 256 MiB virtio disks named
// extra (the i-th: serial machina-vm<i+1>, by-path pci-0000:00:0<5+i>.0),
// and a dev folder holding vda and them as sparse files filled with a
// marker at both ends.
func diskMachine(t *testing.T, extra ...string) (root, dev string) {
	t.Helper()
	b, err := os.ReadFile("testdata/machines/qemu-q35.tree")
	if err != nil {
		t.Fatal(err)
	}
	var tree strings.Builder
	for i, name := range extra {
		d := fmt.Sprintf("sys/devices/pci0000:00/0000:00:0%d.0/virtio%d/block/%s", 5+i, 2+i, name)
		fmt.Fprintf(&tree, "-- sys/block/%s -> ../%s --\n", name, strings.TrimPrefix(d, "sys/"))
		fmt.Fprintf(&tree, "-- %s/size --\n524288\n-- %s/ro --\n0\n-- %s/removable --\n0\n-- %s/queue/rotational --\n0\n", d, d, d, d)
		fmt.Fprintf(&tree, "-- %s/serial --\nmachina-vm%d\n-- %s/device -> ../.. --\n", d, i+1, d)
	}
	root = t.TempDir()
	if err := agenttest.WriteTree(root, append(b, tree.String()...)); err != nil {
		t.Fatal(err)
	}
	dev = t.TempDir()
	sizes := map[string]int64{"vda": 1 << 30}
	for _, name := range extra {
		sizes[name] = 256 << 20
	}
	for name, size := range sizes {
		f, err := os.Create(filepath.Join(dev, name))
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(size)
		f.WriteAt(marker, 0)
		f.WriteAt(marker, size-int64(len(marker)))
		f.Close()
	}
	return root, dev
}

var marker = bytes.Repeat([]byte("old-tenant "), 100)

// fakeStorage stands in for mdadm, lvm, mkfs and mount on files (this
// host's kernel has neither md nor device-mapper): it records every argv,
// makes the array a file of the members' size less its superblock, each
// partition a file holding the partition's first 64 KiB, each logical
// volume a file, and a mount a folder shaped like the image's root (md
// numbers arrays from md127 down, as mdadm does without a name). fail
// makes the tool call whose argv contains it fail.
type fakeStorage struct {
	t        *testing.T
	dev      string
	fail     string
	mountDir string

	mu   sync.Mutex
	argv []string
}

func (f *fakeStorage) tools() StorageTools {
	if f.mountDir == "" {
		f.mountDir = f.t.TempDir()
	}
	proc := f.t.TempDir()
	os.WriteFile(filepath.Join(proc, "mdstat"), []byte("Personalities : [raid1]\nunused devices: <none>\n"), 0o644)
	return StorageTools{Run: f.run, Mount: f.mount, Unmount: f.unmount, Rescan: f.rescan, MountDir: f.mountDir, ProcDir: proc}
}

func (f *fakeStorage) run(_ context.Context, name string, args ...string) ([]byte, error) {
	line := strings.ReplaceAll(name+" "+strings.Join(args, " "), f.dev, "$DEV")
	f.mu.Lock()
	f.argv = append(f.argv, line)
	f.mu.Unlock()
	if f.fail != "" && strings.Contains(line, f.fail) {
		out := "  Volume group \"vg-system\" has insufficient free space (0 extents): 1 required."
		return []byte(out), fmt.Errorf("%s: exit status 5: %s", name, out)
	}
	switch {
	case name == "mdadm" && args[0] == "--create":
		st, err := os.Stat(args[len(args)-1])
		if err != nil {
			return nil, err
		}
		made, _ := filepath.Glob(filepath.Join(f.dev, "md1[0-9][0-9]"))
		name := fmt.Sprintf("md%d", 127-len(made))
		md := filepath.Join(f.dev, name)
		if err := os.WriteFile(md, nil, 0o600); err != nil {
			return nil, err
		}
		os.Truncate(md, st.Size()-128<<10)
		os.MkdirAll(filepath.Join(f.dev, "md"), 0o755)
		return nil, os.Symlink("../"+name, args[1])
	case name == "mdadm" && args[0] == "--detail" && strings.HasSuffix(args[2], "md127"):
		return []byte("MD_LEVEL=raid1\nMD_DEVICES=2\nMD_METADATA=1.0\nMD_UUID=0a1b2c3d:4e5f6071:8293a4b5:c6d7e8f9\nMD_NAME=any:machina-root\n"), nil
	case name == "mdadm" && args[0] == "--detail":
		return []byte("MD_LEVEL=raid1\nMD_DEVICES=2\nMD_METADATA=1.2\nMD_UUID=11223344:55667788:99aabbcc:ddeeff00\n"), nil
	case name == "lvm" && args[0] == "lvcreate":
		vg, lv := args[len(args)-1], args[3]
		os.MkdirAll(filepath.Join(f.dev, vg), 0o755)
		return nil, os.WriteFile(filepath.Join(f.dev, vg, lv), nil, 0o600)
	}
	return nil, nil
}

func (f *fakeStorage) rescan(dev *os.File) error {
	st, _ := dev.Stat()
	t, err := readPartTable(dev, st.Size())
	if err != nil {
		return err
	}
	for _, p := range t.gpt.Partitions {
		b := make([]byte, 64<<10)
		dev.ReadAt(b, int64(p.Start)*512)
		if err := os.WriteFile(filepath.Join(f.dev, partName(filepath.Base(dev.Name()), p.Index)), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeStorage) mount(src, dst, fs string) error {
	f.mu.Lock()
	f.argv = append(f.argv, "mount "+strings.ReplaceAll(src, f.dev, "$DEV")+" "+fs)
	f.mu.Unlock()
	os.MkdirAll(filepath.Join(dst, "etc", "mdadm"), 0o755)
	return os.WriteFile(filepath.Join(dst, "etc", "fstab"), []byte("LABEL=cloudimg-rootfs / ext4 discard,errors=remount-ro 0 1\n"), 0o644)
}

// unmount keeps what was written under dst + ".unmounted" for the test.
func (f *fakeStorage) unmount(dst string) error { return os.Rename(dst, dst+".unmounted") }

// layoutImage is a GPT image (ESP, ext4-looking root) of 16 MiB.
func layoutImage(t *testing.T) []byte {
	img := makeGPTImage(t, 16<<20)
	img[2<<20+1080], img[2<<20+1081] = 0x53, 0xEF // ext4 magic in the root partition (p2 at 2 MiB)
	return img
}

// raidPlan mirrors the root over vdb and vdc (by by-path and by serial),
// root 64 MiB, a group on the rest with a 16 MiB ext4 volume and a raw
// volume over what is left.
func raidPlan() *v1.StoragePlan {
	return &v1.StoragePlan{
		Root: v1.StorageRoot{RAID: v1.StorageRAID1, SizeBytes: 64 << 20, Disks: []v1.StorageDiskRef{
			{Name: "vdb", ByPath: "pci-0000:00:05.0", SizeBytes: 256 << 20}, {Name: "vdc", Serial: "machina-vm2", SizeBytes: 256 << 20}}},
		VolumeGroups: []v1.StorageVolumeGroup{{Name: "vg-system", Rest: true, Volumes: []v1.StorageVolume{
			{Name: "logs", SizeBytes: 16 << 20, Filesystem: "ext4", MountPoint: "/var/log"}, {Name: "guests"}}}},
	}
}

func deployLayout(t *testing.T, plan *v1.StoragePlan, fake *fakeStorage, root, dev string, img []byte) (v1.DeployResult, []v1.DeployResult, error) {
	t.Helper()
	ctl := agenttest.NewController(agenttest.ControllerConfig{DeployToken: "tok-layout", Image: img,
		Plan: v1.Plan{Seed: testSeed, ReadBack: true, Storage: plan}})
	srv := httptest.NewServer(ctl)
	defer srv.Close()
	ctl.SetBaseURL(srv.URL)
	r := &Runner{Client: &v1.AgentClient{BaseURL: srv.URL}, Token: "tok-layout", BootMAC: "52:54:00:12:34:56",
		Root: root, DevDir: dev, Logger: testLogger(t), Storage: fake.tools()}
	res, err := r.Deploy(context.Background())
	return res, ctl.Done(), err
}

// TestLayoutRAID1DeploysOntoArray: with a RAID1 storage plan the agent
// resolves the members by stable identity, clears both ends of each,
// creates the array (metadata 1.0, bitmap, homehost any), writes and reads
// back the image through the array device, grows the root partition to the
// layout's size and adds the rest as an LVM partition before the seed,
// makes the group, its volumes and filesystem, grows the root filesystem,
// writes mdadm.conf and fstab into the deployed root, and settles; every
// argv is built from validated values. The tools are fakes on files (this
// host's kernel has no md or device-mapper); the real tools run in the VM
// test.
func TestLayoutRAID1DeploysOntoArray(t *testing.T) {
	need(t, "sgdisk")
	root, dev := threeDiskMachine(t)
	fake := &fakeStorage{t: t, dev: dev}
	img := layoutImage(t)
	res, done, err := deployLayout(t, raidPlan(), fake, root, dev, img)
	if err != nil {
		t.Fatalf("Deploy: %v\nargv:\n%s", err, strings.Join(fake.argv, "\n"))
	}
	if !res.OK || res.DiskName != "md127" || res.ReadBackSHA256 != sum(img) || len(done) != 1 || !done[0].OK {
		t.Errorf("result %+v, done %+v", res, done)
	}
	want := []string{
		"mdadm --create $DEV/md/machina-root --run --level=1 --raid-devices=2 --metadata=1.0 --bitmap=internal --homehost=any --name=machina-root $DEV/vdb $DEV/vdc",
		"lvm pvcreate -ff -y $DEV/md127p4",
		"lvm vgcreate vg-system $DEV/md127p4",
		"lvm lvcreate -y -n logs -L 16777216b vg-system",
		"mkfs.ext4 -q -F $DEV/vg-system/logs",
		"lvm lvcreate -y -n guests -l 100%FREE vg-system",
		"mount $DEV/md127p2 ext4",
		"resize2fs $DEV/md127p2",
		"mdadm --detail --export $DEV/md127",
		"lvm vgs --noheadings --units b -o vg_name,pv_count,lv_count,vg_size,pv_name",
		"lvm vgchange -an vg-system",
		"mdadm --stop $DEV/md127",
	}
	if got := strings.Join(fake.argv, "\n"); got != strings.Join(want, "\n") {
		t.Errorf("tools ran:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
	for _, m := range []string{"vdb", "vdc"} {
		b, _ := os.ReadFile(filepath.Join(dev, m))
		if bytes.Contains(b, marker) {
			t.Errorf("%s still holds the old tenant's signature at an end", m)
		}
	}
	out := run(t, "sgdisk", "-p", filepath.Join(dev, "md127"))
	for _, w := range []string{"   2            4096          131071", "   4          131072          505855", "8E00  machina-pv", "0700  cidata"} {
		if !strings.Contains(out, w) {
			t.Errorf("array's partition table lacks %q (root to 64 MiB, PV after it, seed):\n%s", w, out)
		}
	}
	checkOSFiles(t, fake)
}

// TestLayoutVolumeGroupOnRAID1: a plan with the root mirrored over vdb and
// vdc and a volume group on a RAID1 of vdd and vde makes both arrays
// before the image is written (the group's with metadata 1.2, named
// machina-GROUP), puts the group's one physical volume on its array (not
// on the members), writes both arrays' ARRAY lines into mdadm.conf, and
// stops the group's array before the root's.
func TestLayoutVolumeGroupOnRAID1(t *testing.T) {
	need(t, "sgdisk")
	root, dev := diskMachine(t, "vdb", "vdc", "vdd", "vde")
	fake := &fakeStorage{t: t, dev: dev}
	plan := raidPlan()
	plan.VolumeGroups = append(plan.VolumeGroups, v1.StorageVolumeGroup{Name: "vg-data", RAID: v1.StorageRAID1,
		Disks:   []v1.StorageDiskRef{{Name: "vdd", Serial: "machina-vm3", SizeBytes: 256 << 20}, {Name: "vde", ByPath: "pci-0000:00:08.0", SizeBytes: 256 << 20}},
		Volumes: []v1.StorageVolume{{Name: "srv", Filesystem: "xfs", MountPoint: "/srv"}}})
	img := layoutImage(t)
	res, done, err := deployLayout(t, plan, fake, root, dev, img)
	if err != nil {
		t.Fatalf("Deploy: %v\nargv:\n%s", err, strings.Join(fake.argv, "\n"))
	}
	if !res.OK || res.DiskName != "md127" || res.ReadBackSHA256 != sum(img) || len(done) != 1 || !done[0].OK {
		t.Errorf("result %+v, done %+v", res, done)
	}
	want := []string{
		"mdadm --create $DEV/md/machina-root --run --level=1 --raid-devices=2 --metadata=1.0 --bitmap=internal --homehost=any --name=machina-root $DEV/vdb $DEV/vdc",
		"mdadm --create $DEV/md/machina-vg-data --run --level=1 --raid-devices=2 --metadata=1.2 --bitmap=internal --homehost=any --name=machina-vg-data $DEV/vdd $DEV/vde",
		"lvm pvcreate -ff -y $DEV/md127p4",
		"lvm vgcreate vg-system $DEV/md127p4",
		"lvm lvcreate -y -n logs -L 16777216b vg-system",
		"mkfs.ext4 -q -F $DEV/vg-system/logs",
		"lvm lvcreate -y -n guests -l 100%FREE vg-system",
		"lvm pvcreate -ff -y $DEV/md126",
		"lvm vgcreate vg-data $DEV/md126",
		"lvm lvcreate -y -n srv -l 100%FREE vg-data",
		"mkfs.xfs -q -f $DEV/vg-data/srv",
		"mount $DEV/md127p2 ext4",
		"resize2fs $DEV/md127p2",
		"mdadm --detail --export $DEV/md127",
		"mdadm --detail --export $DEV/md126",
		"lvm vgs --noheadings --units b -o vg_name,pv_count,lv_count,vg_size,pv_name",
		"lvm vgchange -an vg-system",
		"lvm vgchange -an vg-data",
		"mdadm --stop $DEV/md126",
		"mdadm --stop $DEV/md127",
	}
	if got := strings.Join(fake.argv, "\n"); got != strings.Join(want, "\n") {
		t.Errorf("tools ran:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
	for _, m := range []string{"vdd", "vde"} {
		b, _ := os.ReadFile(filepath.Join(dev, m))
		if bytes.Contains(b, marker) {
			t.Errorf("%s still holds the old tenant's signature at an end", m)
		}
	}
	checkOSFiles(t, fake)
	dirs, _ := filepath.Glob(filepath.Join(fake.mountDir, "machina-root-*.unmounted"))
	conf, _ := os.ReadFile(filepath.Join(dirs[0], "etc", "mdadm", "mdadm.conf"))
	fstab, _ := os.ReadFile(filepath.Join(dirs[0], "etc", "fstab"))
	if !strings.Contains(string(conf), "ARRAY /dev/md/machina-vg-data metadata=1.2 UUID=11223344:55667788:99aabbcc:ddeeff00 name=any:machina-vg-data\n") {
		t.Errorf("mdadm.conf lacks the group's array:\n%s", conf)
	}
	if !strings.Contains(string(fstab), "/dev/vg-data/srv /srv xfs defaults,nofail 0 2\n") {
		t.Errorf("fstab lacks the group's volume:\n%s", fstab)
	}
}

// checkOSFiles finds the unmounted root the fake kept and checks the
// files the layout wrote into it.
func checkOSFiles(t *testing.T, fake *fakeStorage) {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(fake.mountDir, "machina-root-*.unmounted"))
	if len(dirs) != 1 {
		t.Fatalf("unmounted roots %v, want 1", dirs)
	}
	conf, _ := os.ReadFile(filepath.Join(dirs[0], "etc", "mdadm", "mdadm.conf"))
	if !strings.Contains(string(conf), "ARRAY /dev/md/machina-root metadata=1.0 UUID=0a1b2c3d:4e5f6071:8293a4b5:c6d7e8f9 name=any:machina-root\n") {
		t.Errorf("mdadm.conf:\n%s", conf)
	}
	fstab, _ := os.ReadFile(filepath.Join(dirs[0], "etc", "fstab"))
	if !strings.HasPrefix(string(fstab), "LABEL=cloudimg-rootfs / ext4") || !strings.Contains(string(fstab), "/dev/vg-system/logs /var/log ext4 defaults,nofail 0 2\n") ||
		strings.Contains(string(fstab), "guests") {
		t.Errorf("fstab:\n%s", fstab)
	}
	if st, err := os.Stat(filepath.Join(dirs[0], "var", "log")); err != nil || !st.IsDir() {
		t.Errorf("mount point /var/log not made: %v", err)
	}
}

// TestLayoutFailureNamesStepAndSpoilsRoot: a volume that does not fit its
// group makes lvcreate fail after the image is on the array; the deploy is
// reported failed with the step and the volume named, and the root
// device's first and last MiB are zeroed (no firmware boots the half-made
// layout, nothing looks deployed).
func TestLayoutFailureNamesStepAndSpoilsRoot(t *testing.T) {
	need(t, "sgdisk")
	root, dev := threeDiskMachine(t)
	fake := &fakeStorage{t: t, dev: dev, fail: "-n guests"}
	res, done, err := deployLayout(t, raidPlan(), fake, root, dev, layoutImage(t))
	var le *LayoutError
	if !errors.As(err, &le) || le.Step != StepLVCreate || le.Device != "vg-system/guests" {
		t.Fatalf("err = %v, want a LayoutError at lvcreate on vg-system/guests", err)
	}
	if res.OK || len(done) != 1 || done[0].OK || done[0].FailedStep != "lvcreate" || done[0].FailedDevice != "vg-system/guests" ||
		!strings.Contains(done[0].Reason, "layout step lvcreate on vg-system/guests") || !strings.Contains(done[0].Reason, "insufficient free space") {
		t.Errorf("done = %+v", done)
	}
	b, _ := os.ReadFile(filepath.Join(dev, "md127"))
	if !bytes.Equal(b[:1<<20], make([]byte, 1<<20)) || !bytes.Equal(b[len(b)-(1<<20):], make([]byte, 1<<20)) {
		t.Error("the array's first or last MiB still holds the image's partition table")
	}
	if strings.Contains(strings.Join(fake.argv, "\n"), "mount ") {
		t.Error("the deployed root was mounted after a failed step")
	}
}

// TestLayoutMemberTooSmallWritesNothing: a member whose size is not what
// commissioning reported (a smaller replacement disk) refuses the layout
// at resolve: no tool runs, no disk is touched, and the failure names the
// step and the disk.
func TestLayoutMemberTooSmallWritesNothing(t *testing.T) {
	root, dev := threeDiskMachine(t)
	plan := raidPlan()
	plan.Root.Disks[1].SizeBytes = 512 << 20 // commissioning saw a 512 MiB disk; vdc is 256 MiB now
	fake := &fakeStorage{t: t, dev: dev}
	before := map[string]string{}
	for _, d := range []string{"vda", "vdb", "vdc"} {
		before[d] = fileSum(t, filepath.Join(dev, d))
	}
	_, done, err := deployLayout(t, plan, fake, root, dev, layoutImage(t))
	var le *LayoutError
	if !errors.As(err, &le) || le.Step != StepResolve || le.Device != "machina-vm2" {
		t.Fatalf("err = %v, want a LayoutError at resolve on machina-vm2", err)
	}
	if len(done) != 1 || done[0].OK || done[0].FailedStep != "resolve" || !strings.Contains(done[0].Reason, "disk vdc is 268435456 bytes, commissioning reported 536870912") {
		t.Errorf("done = %+v", done)
	}
	if len(fake.argv) != 0 {
		t.Errorf("tools ran: %v", fake.argv)
	}
	for d, s := range before {
		if fileSum(t, filepath.Join(dev, d)) != s {
			t.Errorf("%s changed", d)
		}
	}
}

// TestResolveLayoutRefuses: the disks a plan names must be found by a
// stable identity, once, writable, at the size commissioning reported;
// and every value reaching a command line is checked first.
func TestResolveLayoutRefuses(t *testing.T) {
	disks := []v1.Disk{
		{Name: "sda", SizeBytes: 100, ByPath: "pci-1", WWN: "naa.5000c500a1b2c3d4"},
		{Name: "sdb", SizeBytes: 100, ByPath: "pci-2", Serial: "S2"},
		{Name: "sdc", SizeBytes: 100, ByPath: "pci-3", Serial: "S2"},
		{Name: "sdd", SizeBytes: 100, ByPath: "pci-4", Transport: "usb"},
	}
	root := func(refs ...v1.StorageDiskRef) v1.StoragePlan {
		p := v1.StoragePlan{Root: v1.StorageRoot{Disks: refs}}
		if len(refs) == 2 {
			p.Root.RAID = v1.StorageRAID1
		}
		return p
	}
	for _, tc := range []struct {
		name string
		plan v1.StoragePlan
		want string
	}{
		{"kernel name only", root(v1.StorageDiskRef{Name: "sda", SizeBytes: 100}), "by kernel name only"},
		{"missing", root(v1.StorageDiskRef{ByPath: "pci-9", SizeBytes: 100}), "on pci-9: no such disk found"},
		{"ambiguous serial", root(v1.StorageDiskRef{Serial: "s2", SizeBytes: 100}), "several eligible disks match"},
		{"usb", root(v1.StorageDiskRef{ByPath: "pci-4", SizeBytes: 100}), "not writable: usb"},
		{"size changed", root(v1.StorageDiskRef{WWN: "0x5000C500A1B2C3D4", SizeBytes: 200}), "disk sda is 100 bytes, commissioning reported 200"},
		{"named twice", root(v1.StorageDiskRef{ByPath: "pci-1", SizeBytes: 100}, v1.StorageDiskRef{WWN: "naa.5000c500a1b2c3d4", SizeBytes: 100}), "named twice"},
		{"raid with one disk", v1.StoragePlan{Root: v1.StorageRoot{RAID: "raid1", Disks: []v1.StorageDiskRef{{ByPath: "pci-1", SizeBytes: 100}}}}, "root has 1 disks (want 2)"},
		{"group raid with one disk", v1.StoragePlan{Root: v1.StorageRoot{Disks: []v1.StorageDiskRef{{ByPath: "pci-1", SizeBytes: 100}}},
			VolumeGroups: []v1.StorageVolumeGroup{{Name: "vg0", RAID: "raid1", Disks: []v1.StorageDiskRef{{ByPath: "pci-2", SizeBytes: 100}}}}}, "vg0 on raid1: 1 disks (want 2)"},
		{"group raid name too long", v1.StoragePlan{Root: v1.StorageRoot{Disks: []v1.StorageDiskRef{{ByPath: "pci-1", SizeBytes: 100}}},
			VolumeGroups: []v1.StorageVolumeGroup{{Name: "vg-twenty-characters", RAID: "raid1", Disks: []v1.StorageDiskRef{{ByPath: "pci-2", SizeBytes: 100}, {ByPath: "pci-3", SizeBytes: 100}}}}}, "name of 20 characters (at most 19)"},
		{"group raid5", v1.StoragePlan{Root: v1.StorageRoot{Disks: []v1.StorageDiskRef{{ByPath: "pci-1", SizeBytes: 100}}},
			VolumeGroups: []v1.StorageVolumeGroup{{Name: "vg0", RAID: "raid5", Disks: []v1.StorageDiskRef{{ByPath: "pci-2", SizeBytes: 100}}}}}, `raid "raid5"`},
		{"bad vg name", v1.StoragePlan{Root: v1.StorageRoot{SizeBytes: 10, Disks: []v1.StorageDiskRef{{ByPath: "pci-1", SizeBytes: 100}}},
			VolumeGroups: []v1.StorageVolumeGroup{{Name: "-ff", Rest: true}}}, `name "-ff" is not a valid LVM name`},
		{"bad mount point", v1.StoragePlan{Root: v1.StorageRoot{SizeBytes: 10, Disks: []v1.StorageDiskRef{{ByPath: "pci-1", SizeBytes: 100}}},
			VolumeGroups: []v1.StorageVolumeGroup{{Name: "vg0", Rest: true, Volumes: []v1.StorageVolume{{Name: "a", Filesystem: "ext4", MountPoint: "/var/../etc"}}}}}, "mount point"},
		{"bad filesystem", v1.StoragePlan{Root: v1.StorageRoot{SizeBytes: 10, Disks: []v1.StorageDiskRef{{ByPath: "pci-1", SizeBytes: 100}}},
			VolumeGroups: []v1.StorageVolumeGroup{{Name: "vg0", Rest: true, Volumes: []v1.StorageVolume{{Name: "a", Filesystem: "ext4 -E root_owner"}}}}}, "filesystem"},
	} {
		_, err := ResolveLayout(tc.plan, disks, nil)
		var le *LayoutError
		if !errors.As(err, &le) || le.Step != StepResolve || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want a resolve error containing %q", tc.name, err, tc.want)
		}
	}
	got, err := ResolveLayout(root(v1.StorageDiskRef{WWN: "0x5000C500A1B2C3D4", SizeBytes: 100}, v1.StorageDiskRef{Serial: "S2", ByPath: "pci-3", SizeBytes: 100}), disks, nil)
	if err != nil || got.Root[0].Name != "sda" || got.Root[1].Name != "sdc" {
		t.Errorf("resolve = %+v, %v; want sda (by WWN) and sdc (by-path wins over serial)", got.Root, err)
	}
}
