package vmtest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/ramdisk/agent/agenttest"
)

// rootfsImage is a 64 MiB GPT image like a cloud image's: an ESP (1 MiB
// at 1 MiB) and an ext4 root (p2, 60 MiB at 2 MiB, label cloudimg-rootfs)
// holding /etc/fstab and an empty /etc/mdadm.
func rootfsImage(t *testing.T, dir string) []byte {
	t.Helper()
	tree := filepath.Join(dir, "tree")
	os.MkdirAll(filepath.Join(tree, "etc", "mdadm"), 0o755)
	os.WriteFile(filepath.Join(tree, "etc", "fstab"), []byte("LABEL=cloudimg-rootfs / ext4 discard,errors=remount-ro 0 1\n"), 0o644)
	fs := filepath.Join(dir, "root.ext4")
	f, _ := os.Create(fs)
	f.Truncate(60 << 20)
	f.Close()
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-L", "cloudimg-rootfs", "-d", tree, fs).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	p := filepath.Join(dir, "os.img")
	f, _ = os.Create(p)
	f.Truncate(64 << 20)
	f.Close()
	if out, err := exec.Command("sgdisk", "-n", "1:2048:+1M", "-t", "1:ef00", "-n", "2:4096:+60M", "-t", "2:8300", "-c", "2:root", p).CombinedOutput(); err != nil {
		t.Fatalf("sgdisk: %v\n%s", err, out)
	}
	img, _ := os.ReadFile(p)
	rootfs, _ := os.ReadFile(fs)
	copy(img[2<<20:], rootfs)
	return img
}

// storageVMArgs are two 512 MiB virtio disks (serials machina-vm1 and
// machina-vm2) and a 256 MiB NVMe namespace (serial machina-nvme0).
func storageVMArgs(t *testing.T, dir string) (args []string, disks map[string]string) {
	disks = map[string]string{}
	for i, d := range []struct {
		name string
		size int64
	}{{"vdb", 512 << 20}, {"vdc", 512 << 20}, {"nvme", 256 << 20}} {
		p := filepath.Join(dir, d.name+".raw")
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(d.size)
		f.Close()
		disks[d.name] = p
		args = append(args, "-drive", fmt.Sprintf("file=%s,format=raw,if=none,id=s%d,cache=unsafe", p, i))
		if d.name == "nvme" {
			args = append(args, "-device", fmt.Sprintf("nvme,drive=s%d,serial=machina-nvme0", i))
		} else {
			args = append(args, "-device", fmt.Sprintf("virtio-blk-pci,drive=s%d,serial=machina-vm%d", i, i+1))
		}
	}
	return args, disks
}

// storagePlan mirrors the root over the two virtio disks (128 MiB of
// each), makes the rest of the mirror vg-system (a 32 MiB ext4 /var/log
// and a raw volume over what is left) and the NVMe vg-guests (swapBytes of
// swap).
func storagePlan(swapBytes int64) *v1.StoragePlan {
	return &v1.StoragePlan{
		Root: v1.StorageRoot{RAID: v1.StorageRAID1, SizeBytes: 128 << 20, Disks: []v1.StorageDiskRef{
			{Name: "vdb", Serial: "machina-vm1", SizeBytes: 512 << 20}, {Name: "vdc", Serial: "machina-vm2", SizeBytes: 512 << 20}}},
		VolumeGroups: []v1.StorageVolumeGroup{
			{Name: "vg-system", Rest: true, Volumes: []v1.StorageVolume{{Name: "logs", SizeBytes: 32 << 20, Filesystem: "ext4", MountPoint: "/var/log"}, {Name: "guests"}}},
			{Name: "vg-guests", Disks: []v1.StorageDiskRef{{Name: "nvme0n1", Serial: "machina-nvme0", SizeBytes: 256 << 20}},
				Volumes: []v1.StorageVolume{{Name: "swap", SizeBytes: swapBytes, Filesystem: "swap"}}},
		},
	}
}

// TestRamdiskStorageLayoutInQemu boots the real ramdisk (with Debian's
// mdadm, lvm2, e2fsprogs) in deploy mode on a VM with two virtio disks and
// an NVMe, with a RAID1 storage plan, then checks the disks from the host:
// each member holds the image at its start (its ESP as written, both
// members equal) and an md 1.0 superblock named
// any:machina-root at its end; the root partition ends at 128 MiB and
// the rest is an LVM partition; the root ext4 grew; mdadm.conf (with the
// array's UUID) and fstab are in the deployed root; the NVMe is a PV. A
// second deploy whose swap volume cannot fit the NVMe fails at lvcreate,
// reported with the step and volume, and leaves both members without a
// partition table (nothing looks deployed).
func TestRamdiskStorageLayoutInQemu(t *testing.T) {
	needTools(t, "qemu-system-x86_64", "socat", "sgdisk", "mkfs.ext4", "debugfs", "dumpe2fs", "mdadm", "apt-get", "dpkg-deb", "cpio", "depmod",
		"lvm", "resize2fs", "mkfs.xfs", "xfs_growfs", "mkswap") // the last five go into the ramdisk
	kernel, initrd := buildRamdisk(t)
	dir := t.TempDir()
	img := rootfsImage(t, dir)
	sum := sha256.Sum256(img)
	boot := func(plan *v1.StoragePlan) (v1.DeployResult, map[string]string, string) {
		sub := t.TempDir()
		os.WriteFile(filepath.Join(sub, "vda.raw"), nil, 0o644)
		os.Truncate(filepath.Join(sub, "vda.raw"), 64<<20)
		args, disks := storageVMArgs(t, sub)
		ctl, port := controller(t, agenttest.ControllerConfig{DeployToken: "deploy-tok-2", Image: img,
			Plan: v1.Plan{ReadBack: true, Storage: plan, Seed: v1.Seed{InstanceID: "i-vm0-2", Hostname: "vm0",
				SSHKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGkUjIg1YmN3qkI3QVh2dGZ1bHd0cWZ6eHJ0a2Z4 ops@lab"}}}})
		ctl.SetBaseURL("http://10.0.2.100:8080")
		serial := bootVM(t, kernel, initrd, filepath.Join(sub, "vda.raw"), port, "machina.mode=deploy machina.token=deploy-tok-2 machina.final=poweroff", vmOpts{Args: args})
		done := ctl.Done()
		if len(done) != 1 {
			t.Fatalf("done = %+v\nserial:\n%s", done, serial)
		}
		return done[0], disks, serial
	}

	res, disks, serial := boot(storagePlan(16 << 20))
	if !res.OK || res.DiskName != "md127" || res.ReadBackSHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("done = %+v\nserial:\n%s", res, serial)
	}
	t.Logf("agent: %s", lineWith(serial, "root array created"))
	t.Logf("agent: %s", lineWith(serial, "deploy written"))
	var uuid string
	vdb, _ := os.ReadFile(disks["vdb"])
	for _, m := range []string{"vdb", "vdc"} {
		b, _ := os.ReadFile(disks[m])
		// the image's ESP at 1 MiB, as written (the root partition's bytes
		// changed: the filesystem grew and got the layout's files)
		if !bytes.Equal(b[1<<20:2<<20], img[1<<20:2<<20]) {
			t.Errorf("%s does not hold the image's ESP at 1 MiB", m)
		}
		// the mirror: both members equal up to md's superblock at the end
		if !bytes.Equal(b[:500<<20], vdb[:500<<20]) {
			t.Errorf("%s differs from vdb in its first 500 MiB", m)
		}
		ex, err := exec.Command("mdadm", "--examine", disks[m]).CombinedOutput()
		if err != nil || !strings.Contains(string(ex), "Version : 1.0") || !strings.Contains(string(ex), "Raid Level : raid1") || !strings.Contains(string(ex), "Name : any:machina-root") {
			t.Errorf("mdadm --examine %s: %v\n%s", m, err, ex)
		}
		if u := regexp.MustCompile(`Array UUID : (\S+)`).FindStringSubmatch(string(ex)); u != nil {
			uuid = u[1]
		}
		if m == "vdb" {
			out, _ := exec.Command("sgdisk", "-p", disks[m]).CombinedOutput()
			t.Logf("vdb partition table (read through the member):\n%s", out)
			if !strings.Contains(string(out), "4096          262143") || !strings.Contains(string(out), "8E00  machina-pv") {
				t.Errorf("root partition does not end at 128 MiB or no PV partition:\n%s", out)
			}
			if !bytes.Equal(b[128<<20+512:128<<20+520], []byte("LABELONE")) {
				t.Errorf("no LVM label at the start of the PV partition")
			}
			root := filepath.Join(dir, "root-part")
			os.WriteFile(root, b[2<<20:128<<20], 0o644)
			h, _ := exec.Command("dumpe2fs", "-h", root).CombinedOutput()
			if bc := regexp.MustCompile(`Block count:\s+(\d+)`).FindStringSubmatch(string(h)); bc == nil || bc[1] == "61440" {
				t.Errorf("root ext4 not grown (60 MiB at 1 KiB blocks is 61440):\n%s", h)
			} else {
				t.Logf("root ext4 block count after the layout: %s", bc[1])
			}
			fstab, _ := exec.Command("debugfs", "-R", "cat /etc/fstab", root).Output()
			conf, _ := exec.Command("debugfs", "-R", "cat /etc/mdadm/mdadm.conf", root).Output()
			t.Logf("deployed fstab:\n%s\nmdadm.conf:\n%s", fstab, conf)
			if !strings.Contains(string(fstab), "/dev/vg-system/logs /var/log ext4 defaults,nofail 0 2") || !strings.Contains(string(fstab), "/dev/vg-guests/swap none swap sw,nofail 0 0") {
				t.Errorf("fstab lacks the layout's lines")
			}
			if uuid == "" || !strings.Contains(string(conf), "UUID="+uuid) {
				t.Errorf("mdadm.conf does not name the array %q", uuid)
			}
		}
	}
	nv, _ := os.ReadFile(disks["nvme"])
	if !bytes.Equal(nv[512:520], []byte("LABELONE")) {
		t.Errorf("the NVMe is not an LVM physical volume")
	}

	// A volume the NVMe cannot hold: lvcreate fails after the image is on
	// the array; the failure names the step and volume and the members'
	// heads are zeroed.
	res, disks, serial = boot(storagePlan(1 << 30))
	if res.OK || res.FailedStep != "lvcreate" || res.FailedDevice != "vg-guests/swap" || !strings.Contains(res.Reason, "layout step lvcreate on vg-guests/swap") {
		t.Fatalf("done = %+v\nserial:\n%s", res, serial)
	}
	t.Logf("failed deploy reported: %s", res.Reason)
	for _, m := range []string{"vdb", "vdc"} {
		b, _ := os.ReadFile(disks[m])
		if !bytes.Equal(b[:1<<20], make([]byte, 1<<20)) {
			t.Errorf("%s still starts with a partition table after the failed layout", m)
		}
	}
}

// TestRamdiskVolumeGroupOnRAID1InQemu boots the real ramdisk in deploy
// mode on a VM with four more virtio disks (512 MiB each, serials
// machina-vm1..4): the root mirrored over the first two, and volume group
// vg-data on a RAID1 of the other two. In the guest, the agent's log of
// what it made shows /proc/mdstat with both arrays active over their two
// members and `lvm vgs` with vg-data on the group's array; from the host,
// the group's members carry md metadata 1.2 named any:machina-vg-data
// with the LVM label after the data offset (so neither member alone shows
// a physical volume), and the deployed mdadm.conf names both arrays.
func TestRamdiskVolumeGroupOnRAID1InQemu(t *testing.T) {
	needTools(t, "qemu-system-x86_64", "socat", "sgdisk", "mkfs.ext4", "debugfs", "mdadm", "apt-get", "dpkg-deb", "cpio", "depmod",
		"lvm", "resize2fs", "mkfs.xfs", "xfs_growfs", "mkswap") // the last five go into the ramdisk
	kernel, initrd := buildRamdisk(t)
	dir := t.TempDir()
	img := rootfsImage(t, dir)
	sum := sha256.Sum256(img)
	os.WriteFile(filepath.Join(dir, "vda.raw"), nil, 0o644)
	os.Truncate(filepath.Join(dir, "vda.raw"), 64<<20)
	var args []string
	disks := map[string]string{}
	refs := map[string]v1.StorageDiskRef{}
	for i, name := range []string{"vdb", "vdc", "vdd", "vde"} {
		p := filepath.Join(dir, name+".raw")
		os.WriteFile(p, nil, 0o644)
		if err := os.Truncate(p, 512<<20); err != nil {
			t.Fatal(err)
		}
		disks[name] = p
		serial := fmt.Sprintf("machina-vm%d", i+1)
		refs[name] = v1.StorageDiskRef{Name: name, Serial: serial, SizeBytes: 512 << 20}
		args = append(args, "-drive", fmt.Sprintf("file=%s,format=raw,if=none,id=s%d,cache=unsafe", p, i),
			"-device", fmt.Sprintf("virtio-blk-pci,drive=s%d,serial=%s", i, serial))
	}
	plan := &v1.StoragePlan{
		Root: v1.StorageRoot{RAID: v1.StorageRAID1, Disks: []v1.StorageDiskRef{refs["vdb"], refs["vdc"]}},
		VolumeGroups: []v1.StorageVolumeGroup{{Name: "vg-data", RAID: v1.StorageRAID1, Disks: []v1.StorageDiskRef{refs["vdd"], refs["vde"]},
			Volumes: []v1.StorageVolume{{Name: "srv", SizeBytes: 64 << 20, Filesystem: "ext4", MountPoint: "/srv"}, {Name: "guests"}}}},
	}
	ctl, port := controller(t, agenttest.ControllerConfig{DeployToken: "deploy-tok-3", Image: img,
		Plan: v1.Plan{ReadBack: true, Storage: plan, Seed: v1.Seed{InstanceID: "i-vm0-3", Hostname: "vm0",
			SSHKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGkUjIg1YmN3qkI3QVh2dGZ1bHd0cWZ6eHJ0a2Z4 ops@lab"}}}})
	ctl.SetBaseURL("http://10.0.2.100:8080")
	serial := bootVM(t, kernel, initrd, filepath.Join(dir, "vda.raw"), port, "machina.mode=deploy machina.token=deploy-tok-3 machina.final=poweroff", vmOpts{Args: args})
	done := ctl.Done()
	if len(done) != 1 || !done[0].OK || done[0].DiskName != "md127" || done[0].ReadBackSHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("done = %+v\nserial:\n%s", done, serial)
	}

	// In the guest: the agent's log of /proc/mdstat and vgs before it
	// settled the layout.
	mdstat, vgs := lineWith(serial, "layout made: mdstat"), lineWith(serial, "layout made: vgs")
	t.Logf("guest: %s", lineWith(serial, "volume group array created"))
	t.Logf("guest: %s", mdstat)
	t.Logf("guest: %s", vgs)
	for _, re := range []string{`md127 : active raid1 vd[bc]\[[01]\] vd[bc]\[[01]\]`, `md126 : active raid1 vd[de]\[[01]\] vd[de]\[[01]\]`} {
		if !regexp.MustCompile(re).MatchString(mdstat) {
			t.Errorf("guest /proc/mdstat does not match %q:\n%s", re, mdstat)
		}
	}
	if !regexp.MustCompile(`vg-data\s+1\s+2\s+\d+B\s+/dev/md(126|/machina-vg-data)`).MatchString(vgs) {
		t.Errorf("guest vgs does not show vg-data with 1 PV (/dev/md126) and 2 LVs:\n%s", vgs)
	}

	// From the host: the group's members are md 1.2 members of
	// machina-vg-data, the PV label inside the array's data area.
	var uuid string
	for _, m := range []string{"vdd", "vde"} {
		ex, err := exec.Command("mdadm", "--examine", disks[m]).CombinedOutput()
		if err != nil || !strings.Contains(string(ex), "Version : 1.2") || !strings.Contains(string(ex), "Raid Level : raid1") || !strings.Contains(string(ex), "Name : any:machina-vg-data") {
			t.Fatalf("mdadm --examine %s: %v\n%s", m, err, ex)
		}
		uuid = regexp.MustCompile(`Array UUID : (\S+)`).FindStringSubmatch(string(ex))[1]
		off := regexp.MustCompile(`Data Offset : (\d+) sectors`).FindStringSubmatch(string(ex))
		if off == nil {
			t.Fatalf("mdadm --examine %s: no data offset\n%s", m, ex)
		}
		n, _ := strconv.ParseInt(off[1], 10, 64)
		b, _ := os.ReadFile(disks[m])
		if bytes.Equal(b[512:520], []byte("LABELONE")) || !bytes.Equal(b[n*512+512:n*512+520], []byte("LABELONE")) {
			t.Errorf("%s: want the LVM label after md's data offset (%d sectors), not at the member's start", m, n)
		}
	}
	vdb, _ := os.ReadFile(disks["vdb"])
	root := filepath.Join(dir, "root-part")
	os.WriteFile(root, vdb[2<<20:], 0o644)
	conf, _ := exec.Command("debugfs", "-R", "cat /etc/mdadm/mdadm.conf", root).Output()
	fstab, _ := exec.Command("debugfs", "-R", "cat /etc/fstab", root).Output()
	t.Logf("deployed mdadm.conf:\n%s", conf)
	if !strings.Contains(string(conf), "ARRAY /dev/md/machina-root metadata=1.0") || !strings.Contains(string(conf), "ARRAY /dev/md/machina-vg-data metadata=1.2 UUID="+uuid) {
		t.Errorf("mdadm.conf does not name both arrays (vg-data %s)", uuid)
	}
	if !strings.Contains(string(fstab), "/dev/vg-data/srv /srv ext4 defaults,nofail 0 2") {
		t.Errorf("fstab lacks vg-data/srv:\n%s", fstab)
	}
}
