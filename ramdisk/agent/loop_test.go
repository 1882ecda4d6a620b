package agent

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/machina-metal/machina/internal/peertest"
)

// TestDeployOnLoopDevice runs Deploy against a real block device (a loop
// device over a file), then lets the kernel re-read the partition table and
// mounts the seed read-only with the kernel's vfat driver: the strongest
// local proof that the partition table, the FAT16 and its long names are
// what Linux (and so cloud-init) reads.
func TestDeployOnLoopDevice(t *testing.T) {
	peertest.Root(t, "loop devices")
	need(t, "losetup", "sgdisk", "blkid", "mount", "umount")
	img := makeGPTImage(t, 16<<20)
	f, _ := newTarget(t, 96<<20)
	f.Close()
	out, err := exec.Command("losetup", "--find", "--show", "--partscan", f.Name()).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v %s", err, out)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })

	dev, size, err := openTarget(loop)
	if err != nil {
		t.Fatal(err)
	}
	if size != 96<<20 {
		t.Fatalf("loop size = %d", size)
	}
	res, err := Deploy(context.Background(), dev, size, DeployConfig{
		Write:  WriteConfig{Open: FileOpener(img), SizeBytes: int64(len(img)), SHA256: sum(img), ReadBack: true},
		Seed:   testSeed,
		Logger: testLogger(t),
	})
	dev.Close()
	if err != nil {
		t.Fatalf("Deploy on %s: %v", loop, err)
	}
	// The seed's range (the old layout's bytes before) was zeroed with
	// BLKZEROOUT and its extents written: it holds MakeFAT16's image.
	seedFiles, _ := RenderSeed(testSeed)
	full, _ := MakeFAT16(SeedSizeBytes, SeedLabel, uint32(res.SeedOffset/512), seedFiles)
	if disk, _ := os.ReadFile(f.Name()); !bytes.Equal(disk[res.SeedOffset:res.SeedOffset+SeedSizeBytes], full) {
		t.Errorf("seed region on %s differs from MakeFAT16's image", loop)
	}
	// Re-read the partition table the way the installed OS will see it.
	run(t, "losetup", "-d", loop)
	out, err = exec.Command("losetup", "--find", "--show", "--partscan", f.Name()).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v %s", err, out)
	}
	loop = strings.TrimSpace(string(out))
	part := partitionNode(t, loop, 3)
	if got := strings.TrimSpace(run(t, "blkid", "-p", "-s", "LABEL", "-o", "value", part)); !strings.EqualFold(got, "cidata") {
		t.Fatalf("label of %s = %q, want cidata", part, got)
	}
	files := map[string]string{}
	names := []string{"user-data", "meta-data", "network-config"}
	if vfatAvailable() {
		mnt := t.TempDir()
		run(t, "mount", "-t", "vfat", "-o", "ro", part, mnt)
		defer exec.Command("umount", mnt).Run()
		for _, n := range names {
			b, err := os.ReadFile(filepath.Join(mnt, n))
			if err != nil {
				t.Fatalf("read %s from the mounted seed: %v", n, err)
			}
			files[n] = string(b)
		}
	} else {
		// The running kernel has no vfat (e.g. a minimal VM kernel): read
		// the partition's block device with mtools instead.
		t.Logf("kernel has no vfat driver; reading %s with mtools", part)
		for _, n := range names {
			b, err := exec.Command("mtype", "-i", part, "::"+n).Output() // stderr: geometry warning
			if err != nil {
				t.Fatalf("mtype %s: %v", n, err)
			}
			files[n] = string(b)
		}
	}
	checkSeedContent(t, files)
}

// partitionNode returns a device node for partition n of loop. Without udev
// (containers) the kernel registers the partition in sysfs but nobody makes
// the node, so the test makes one from sysfs's major:minor.
func partitionNode(t *testing.T, loop string, n int) string {
	t.Helper()
	name := filepath.Base(loop) + "p" + strconv.Itoa(n)
	devNode := "/dev/" + name
	if _, err := os.Stat(devNode); err == nil {
		return devNode
	}
	sysDev := filepath.Join("/sys/block", filepath.Base(loop), name, "dev")
	if _, err := os.Stat(sysDev); err != nil {
		// The partscan of LOOP_SET_STATUS did not register it (seen in
		// containers); add the partitions with BLKPG as partx does.
		exec.Command("partx", "-a", loop).Run()
	}
	mm, err := os.ReadFile(sysDev)
	if err != nil {
		t.Fatalf("kernel did not register %s after partscan: %v", name, err)
	}
	var major, minor uint32
	if _, err := fmt.Sscanf(strings.TrimSpace(string(mm)), "%d:%d", &major, &minor); err != nil {
		t.Fatal(err)
	}
	node := filepath.Join(t.TempDir(), name)
	if err := syscall.Mknod(node, syscall.S_IFBLK|0o600, int(major<<8|minor&0xff|(minor&^0xff)<<12)); err != nil {
		t.Fatalf("mknod %s: %v", node, err)
	}
	return node
}

// vfatAvailable reports whether the running kernel can mount vfat.
func vfatAvailable() bool {
	if exec.Command("modprobe", "-q", "vfat").Run() != nil {
		b, _ := os.ReadFile("/proc/filesystems")
		return strings.Contains(string(b), "\tvfat\n")
	}
	return true
}
