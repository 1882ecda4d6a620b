package osimage

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
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
