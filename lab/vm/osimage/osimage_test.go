package osimage

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/lab/vm/vmpower"
)

func requireLab(t *testing.T) {
	t.Helper()
	peertest.Commands(t, "debootstrap", "qemu-system-x86_64", "qemu-img", "mkfs.vfat", "mcopy", "syslinux", "sfdisk", "sbverify")
	peertest.Root(t, "debootstrap, loop devices")
}

// cacheDir is the shared cache (MACHINA_OS_IMAGE_CACHE or the default), so
// the image is built once per machine, not per test run.
func cacheDir() string {
	if d := os.Getenv("MACHINA_OS_IMAGE_CACHE"); d != "" {
		return d
	}
	return DefaultCacheDir()
}

func TestReadSums(t *testing.T) {
	dir := t.TempDir()
	sum := strings.Repeat("ab", 32)
	for name, c := range map[string]struct {
		body string
		ok   bool
	}{
		"text":   {sum + "  os.img\n", true},
		"binary": {"deadbeef  other\n" + sum + " *os.img\n", true},
		"other":  {sum + "  other.img\n", false},
		"short":  {"abc  os.img\n", false},
		"upper":  {strings.ToUpper(sum) + "  os.img\n", false},
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(c.body), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := ReadSums(p)
		if c.ok && (err != nil || got != sum) {
			t.Errorf("%s: ReadSums = %q, %v; want %q", name, got, err, sum)
		}
		if !c.ok && !errors.Is(err, ErrBadSums) {
			t.Errorf("%s: ReadSums err = %v, want ErrBadSums", name, err)
		}
	}
	if len(Key()) != 16 {
		t.Errorf("Key() = %q, want 16 hex digits", Key())
	}
}

// TestEnsureAndBoot builds (or reuses) the image, checks size, sparseness
// and checksum, then boots it under TCG with BIOS and with UEFI, each with
// a NoCloud seed on a second drive, until the serial console shows the
// seed's hostname at a login prompt and a marker written by the seed's
// runcmd; then the ACPI power button must power the guest off. The third
// boot is UEFI with Secure Boot on and Microsoft's keys enrolled
// (OVMF_CODE_4M.ms.fd, a copy of OVMF_VARS_4M.ms.fd, secure pflash): the
// image's removable-media path holds shim, which loads Debian's signed
// GRUB, which boots Debian's signed kernel; the kernel log must say Secure
// Boot was on, on the console and read back by dmesg in the guest.
func TestEnsureAndBoot(t *testing.T) {
	requireLab(t)
	// The image is built by `make os-image` (which `make test` runs first,
	// as root) into its cache outside the repository; the test only reads
	// it, so it writes nothing outside its temporary folders.
	if _, err := os.Stat(filepath.Join(cacheDir(), Key(), SumsFile)); err != nil {
		peertest.Missing(t, "the VM lab's OS image is not built ("+filepath.Join(cacheDir(), Key())+")", "it with `make os-image` (root, Debian mirror; make test builds it first)")
	}
	ctx := context.Background()
	start := time.Now()
	path, sum, err := Ensure(ctx, cacheDir())
	if err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	t.Logf("Ensure (build or reuse) took %v: %s sha256 %s", time.Since(start).Round(time.Second), path, sum)
	start = time.Now()
	path2, sum2, err := Ensure(ctx, cacheDir())
	if err != nil || path2 != path || sum2 != sum {
		t.Fatalf("second Ensure = %s %s %v; want the cached %s %s", path2, sum2, err, path, sum)
	}
	t.Logf("warm Ensure took %v", time.Since(start))

	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != SizeBytes || st.Blocks*512 >= SizeBytes {
		t.Fatalf("image size %d, allocated %d: want %d apparent and sparse", st.Size, st.Blocks*512, SizeBytes)
	}
	t.Logf("image allocated %d MiB of %d MiB", st.Blocks*512>>20, SizeBytes>>20)
	start = time.Now()
	if err := Verify(path, sum); err != nil {
		t.Fatal(err)
	}
	t.Logf("sha256 of the whole image on the host: %v", time.Since(start).Round(time.Millisecond))
	if err := Verify(path, strings.Repeat("0", 64)); !errors.Is(err, ErrChecksum) {
		t.Fatalf("Verify with a wrong sum = %v, want ErrChecksum", err)
	}

	for _, fw := range []vmpower.Firmware{vmpower.BIOS, vmpower.UEFI} {
		t.Run(string(fw), func(t *testing.T) { bootToMarker(t, path, fw, false) })
	}
	t.Run("uefi-secureboot", func(t *testing.T) { bootToMarker(t, path, vmpower.UEFI, true) })
	// The cached image is untouched by the boots (they wrote to overlays).
	if err := Verify(path, sum); err != nil {
		t.Fatalf("cached image changed by the boots: %v", err)
	}
}

// bootToMarker boots image in fw until the seed's marker; with sb, under
// OVMF with Secure Boot on, and the guest must report it on.
func bootToMarker(t *testing.T, image string, fw vmpower.Firmware, sb bool) {
	dir := t.TempDir()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	nonce := hex.EncodeToString(rnd[:])
	host := "lab14-" + nonce
	marker := "MACHINA-SEED-OK-" + nonce
	seed := filepath.Join(dir, "seed.img")
	userData := "#cloud-config\nruncmd:\n  - [ sh, -c, 'echo " + marker + " > /dev/ttyS0' ]\n"
	if sb {
		// The guest's own view, from user space: the kernel log's
		// "secureboot:" line (dmesg reads it whatever the console log
		// level), counted so that a missing line prints SBLOG-0.
		userData += "  - [ sh, -c, 'echo SBLOG-$(dmesg | grep -c \"secureboot: Secure boot enabled\") > /dev/ttyS0' ]\n"
	}
	metaData := "instance-id: i-" + nonce + "\nlocal-hostname: " + host + "\n"
	for name, body := range map[string]string{"user-data": userData, "meta-data": metaData} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run(t, "mkfs.vfat", "-C", "-n", "CIDATA", seed, "2048")
	run(t, "mcopy", "-i", seed, filepath.Join(dir, "user-data"), filepath.Join(dir, "meta-data"), "::")
	overlay := filepath.Join(dir, "disk.qcow2")
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", "-b", image, "-F", "raw", overlay)

	cfg := vmpower.Config{
		Name: "os14-" + string(fw), Dir: filepath.Join(dir, "vm"), Firmware: fw,
		Disk: overlay, MemoryMiB: 1024, CPUs: 2, BootDevice: vmpower.BootDisk,
		ExtraArgs: []string{"-drive", "file=" + seed + ",format=raw,if=virtio,readonly=on"},
		Logger:    slog.New(slog.NewTextHandler(t.Output(), nil)),
	}
	wants := []string{host + " login:", marker}
	if sb {
		// The Secure Boot build of OVMF keeps its variables in SMM: the
		// flash must be secure (q35's SMM is on under TCG).
		cfg.Name += "-sb"
		cfg.OVMFCode, cfg.OVMFVars = "/usr/share/OVMF/OVMF_CODE_4M.ms.fd", "/usr/share/OVMF/OVMF_VARS_4M.ms.fd"
		peertest.File(t, cfg.OVMFCode, "ovmf")
		peertest.File(t, cfg.OVMFVars, "ovmf")
		cfg.ExtraArgs = append(cfg.ExtraArgs, "-global", "driver=cfi.pflash01,property=secure,value=on")
		wants = append(wants, "secureboot: Secure boot enabled", "SBLOG-1")
	}
	v, err := vmpower.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = v.Reset(context.Background(), "ForceOff") })
	start := time.Now()
	if err := v.Reset(context.Background(), "On"); err != nil {
		t.Fatal(err)
	}
	serial := filepath.Join(dir, "vm", vmpower.SerialLog)
	for _, want := range wants {
		waitFor(t, serial, want, 8*time.Minute)
		t.Logf("%s: %q on the serial console after %v", fw, want, time.Since(start).Round(100*time.Millisecond))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	off := time.Now()
	if err := v.Reset(ctx, "GracefulShutdown"); err != nil {
		t.Fatal(err)
	}
	if err := v.WaitOff(ctx); err != nil {
		t.Fatalf("guest did not power off after the ACPI button: %v", err)
	}
	t.Logf("%s: ACPI power button to powered off in %v", fw, time.Since(off).Round(100*time.Millisecond))
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// waitFor polls the serial log file until it contains want.
func waitFor(t *testing.T, path, want string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for range tick.C {
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			if len(b) > 3000 {
				b = b[len(b)-3000:]
			}
			t.Fatalf("no %q on the serial console within %v; tail:\n%s", want, d, b)
		}
	}
}

// TestEnsureWaitsForLock: a second caller blocks on the cache entry's lock
// and gives up when its ctx ends, and a cached entry is returned without
// building (no root needed).
func TestEnsureWaitsForLock(t *testing.T) {
	cache := t.TempDir()
	dir := filepath.Join(cache, Key())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sum := strings.Repeat("ef", 32)
	if err := os.WriteFile(filepath.Join(dir, ImageFile), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, SumsFile), []byte(sum+"  os.img\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	if _, _, err := Ensure(ctx, cache); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Ensure while locked = %v, want DeadlineExceeded", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	path, got, err := Ensure(context.Background(), cache)
	if err != nil || got != sum || path != filepath.Join(dir, ImageFile) {
		t.Fatalf("Ensure on a cached entry = %s %s %v; want %s", path, got, err, sum)
	}
}

// TestImageLayout reads the built image without booting it: the protective
// MBR carries syslinux's GPT boot code, partition 1 is the EFI System
// Partition marked LegacyBIOSBootable (the partition gptmbr.bin boots) with
// the FAT volume id GRUB's search names, partition 2 holds the ext4 root
// whose block count fits inside the partition (sfdisk aligns the last
// partition's end down to 1 MiB; a file system sized from the disk instead
// of the table ran past its partition and the kernel refused to mount it:
// "bad geometry: block count ... exceeds size of device"), the ESP holds
// the host's shim and signed GRUB at the removable-media path, and the root
// holds the storage and network tools deploys rely on.
func TestImageLayout(t *testing.T) {
	peertest.Commands(t, "mcopy", "mtype", "debugfs")
	peertest.File(t, "/usr/lib/syslinux/mbr/gptmbr.bin", "syslinux-common")
	peertest.File(t, "/usr/lib/shim/shimx64.efi.signed", "shim-signed")
	peertest.File(t, "/usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed", "grub-efi-amd64-signed")
	path := filepath.Join(cacheDir(), Key(), ImageFile)
	if _, err := os.Stat(path); err != nil {
		peertest.Missing(t, "the VM lab's OS image is not built ("+path+")", "it with `make os-image` (root, Debian mirror)")
	}
	checkLayout(t, path)
}

// checkLayout checks the image at path as TestImageLayout describes.
func checkLayout(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	read := func(off int64, n int) []byte {
		b := make([]byte, n)
		if _, err := f.ReadAt(b, off); err != nil {
			t.Fatalf("read %d bytes at %d: %v", n, off, err)
		}
		return b
	}

	mbr := read(0, 512)
	gptmbr, err := os.ReadFile("/usr/lib/syslinux/mbr/gptmbr.bin")
	if err != nil {
		t.Fatal(err)
	}
	if len(gptmbr) > 440 {
		gptmbr = gptmbr[:440]
	}
	if !bytes.Equal(mbr[:len(gptmbr)], gptmbr) {
		t.Errorf("MBR boot code is not syslinux's gptmbr.bin")
	}
	if mbr[450] != 0xee || mbr[510] != 0x55 || mbr[511] != 0xaa {
		t.Errorf("no protective MBR: partition type %#x, signature %#x %#x", mbr[450], mbr[510], mbr[511])
	}

	// GPT header (UEFI 2.10 section 5.3.2) and its entries (5.3.3).
	hdr := read(512, 92)
	if string(hdr[:8]) != "EFI PART" {
		t.Fatalf("no GPT header at LBA 1: %q", hdr[:8])
	}
	entriesLBA := int64(binary.LittleEndian.Uint64(hdr[72:]))
	entrySize := int(binary.LittleEndian.Uint32(hdr[84:]))
	type part struct {
		typ         string
		first, last int64
		attrs       uint64
	}
	var parts []part
	for i := 0; i < 2; i++ {
		e := read(entriesLBA*512+int64(i*entrySize), entrySize)
		parts = append(parts, part{guidString(e[:16]), int64(binary.LittleEndian.Uint64(e[32:])),
			int64(binary.LittleEndian.Uint64(e[40:])), binary.LittleEndian.Uint64(e[48:])})
	}
	esp, root := parts[0], parts[1]
	if esp.typ != "C12A7328-F81F-11D2-BA4B-00A0C93EC93B" || esp.attrs&(1<<2) == 0 {
		t.Errorf("partition 1: type %s attributes %#x; want the EFI System Partition, LegacyBIOSBootable (bit 2)", esp.typ, esp.attrs)
	}
	if root.typ != "0FC63DAF-8483-4772-8E79-3D69D8477DE4" {
		t.Errorf("partition 2: type %s; want Linux filesystem data", root.typ)
	}

	// FAT boot sector: BS_VolID at 39, BS_VolLab at 43 (FAT12/16 layout).
	bs := read(esp.first*512, 64)
	if id := binary.LittleEndian.Uint32(bs[39:]); id != 0x4d414348 {
		t.Errorf("ESP volume id %08X, want 4D414348", id)
	}
	if lab := strings.TrimSpace(string(bs[43:54])); lab != "MACHINA-ESP" {
		t.Errorf("ESP label %q, want MACHINA-ESP", lab)
	}

	// ext4 superblock at 1024 bytes into the partition.
	sb := read(root.first*512+1024, 1024)
	if binary.LittleEndian.Uint16(sb[0x38:]) != 0xef53 {
		t.Fatalf("partition 2 holds no ext4 file system")
	}
	blocks := uint64(binary.LittleEndian.Uint32(sb[0x4:]))
	if binary.LittleEndian.Uint32(sb[0x60:])&0x80 != 0 { // INCOMPAT_64BIT
		blocks |= uint64(binary.LittleEndian.Uint32(sb[0x150:])) << 32
	}
	fsBytes := blocks * (1024 << binary.LittleEndian.Uint32(sb[0x18:]))
	partBytes := uint64(root.last-root.first+1) * 512
	if fsBytes > partBytes {
		t.Errorf("root file system %d bytes exceeds its partition's %d bytes", fsBytes, partBytes)
	} else if partBytes-fsBytes >= 1<<20 {
		t.Errorf("root file system %d bytes leaves %d bytes of its partition unused", fsBytes, partBytes-fsBytes)
	}
	if u := guidBytesString(sb[0x68:0x78]); !strings.EqualFold(u, RootUUID) {
		t.Errorf("root UUID %s, want %s", u, RootUUID)
	}
	t.Logf("root: %d blocks, %d of %d partition bytes", blocks, fsBytes, partBytes)

	dir := t.TempDir()
	espImg := fmt.Sprintf("%s@@%d", path, esp.first*512)
	for src, want := range map[string]string{
		"::EFI/BOOT/BOOTX64.EFI": "/usr/lib/shim/shimx64.efi.signed",
		"::EFI/BOOT/grubx64.efi": "/usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed",
	} {
		dst := filepath.Join(dir, filepath.Base(want))
		run(t, "mcopy", "-n", "-i", espImg, src, dst)
		got, err1 := os.ReadFile(dst)
		exp, err2 := os.ReadFile(want)
		if err1 != nil || err2 != nil || !bytes.Equal(got, exp) {
			t.Errorf("ESP %s is not %s (%v, %v)", src, want, err1, err2)
		}
	}
	out, err := exec.Command("mtype", "-i", espImg, "::EFI/debian/grub.cfg").CombinedOutput()
	// No search: GRUB's root stays the ESP it was loaded from (the
	// ramdisk's seed FAT shares the ESP's volume serial).
	if err != nil || strings.Contains(string(out), "search") || !strings.Contains(string(out), "root=UUID="+RootUUID) {
		t.Errorf("ESP EFI/debian/grub.cfg: %v\n%s", err, out)
	}

	rootImg := fmt.Sprintf("%s?offset=%d", path, root.first*512)
	for _, p := range []string{
		"/usr/sbin/mdadm", "/usr/sbin/lvm", "/usr/sbin/vconfig", "/usr/sbin/brctl", "/usr/sbin/route",
		"/etc/network/if-pre-up.d/ifenslave", "/etc/network/if-pre-up.d/vlan",
	} {
		out, err := exec.Command("debugfs", "-R", "stat "+p, rootImg).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "Type: regular") {
			t.Errorf("root file system has no %s: %v\n%s", p, err, out)
		}
	}
}

// guidString formats a GPT GUID (first three fields little-endian).
func guidString(b []byte) string {
	return strings.ToUpper(fmt.Sprintf("%08x-%04x-%04x-%x-%x", binary.LittleEndian.Uint32(b[0:]),
		binary.LittleEndian.Uint16(b[4:]), binary.LittleEndian.Uint16(b[6:]), b[8:10], b[10:16]))
}

// guidBytesString formats a UUID stored big-endian, as ext4's s_uuid is.
func guidBytesString(b []byte) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
