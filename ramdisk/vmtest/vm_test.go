package vmtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/ramdisk/agent"
	"github.com/machina-metal/machina/ramdisk/agent/agenttest"
)

const vmMAC = "52:54:00:12:34:56"

// needTools fails naming the Debian package when a tool is missing.
func needTools(t *testing.T, tools ...string) {
	t.Helper()
	peertest.Commands(t, tools...)
}

// repoRoot is two levels up from this package (go test runs in the package dir).
func repoRoot(t testing.TB) string {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// buildRamdisk runs the real build script (what `make ramdisk` runs) into
// a folder of the test, reusing the repository's kernel package cache
// (out/ramdisk/cache, filled by `make ramdisk`, which `make test` runs
// first), so the test writes nothing outside its temporary folders.
func buildRamdisk(t testing.TB) (kernel, initrd string) {
	t.Helper()
	root := repoRoot(t)
	out := filepath.Join(t.TempDir(), "ramdisk")
	cmd := exec.Command(filepath.Join(root, "scripts", "build-ramdisk.sh"))
	cmd.Env = append(os.Environ(), "OUT="+out, "CACHE="+filepath.Join(root, "out", "ramdisk", "cache"))
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("build-ramdisk.sh: %v\n%s", err, b)
	}
	t.Logf("%s", bytes.TrimSpace(b))
	return filepath.Join(out, "vmlinuz"), filepath.Join(out, "initrd.cpio.gz")
}

// controller starts the reference controller on 127.0.0.1:0.
func controller(t *testing.T, cfg agenttest.ControllerConfig) (*agenttest.Controller, int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctl := agenttest.NewController(cfg)
	srv := &http.Server{Handler: ctl, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ctl, ln.Addr().(*net.TCPAddr).Port
}

// bootVM boots kernel+initrd under TCG with disk attached as virtio-blk and
// waits for the guest to power off (the agent's machina.final=poweroff).
// The guest reaches the controller at 10.0.2.100:8080 through a guestfwd
// to 127.0.0.1:port; restrict=on cuts every other path out of the VM.
// vmOpts varies the VM between runs.
type vmOpts struct {
	// NoRNG leaves out virtio-rng and uses a CPU model without RDRAND, so
	// the kernel CRNG may not be ready when the agent starts.
	NoRNG bool
	// Args are more qemu arguments (extra disks).
	Args []string
}

func bootVM(t testing.TB, kernel, initrd, disk string, port int, args string, opt vmOpts) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	mac := strings.ReplaceAll(vmMAC, ":", "-")
	// no_timer_check: under TCG on a loaded host the kernel's check of the
	// IO-APIC timer can fail ("IO-APIC + timer doesn't work!", a panic at
	// 0.05 s, seen at load average 32): it measures the emulator's speed,
	// not the machine's.
	appendArgs := "console=ttyS0 panic=-1 loglevel=4 no_timer_check machina.url=http://10.0.2.100:8080 BOOTIF=01-" + mac + " machina.final=poweroff " + args
	cpu, rng := "max", []string{"-device", "virtio-rng-pci"}
	if opt.NoRNG {
		cpu, rng = "qemu64", nil
	}
	qargs := []string{
		"-accel", "tcg", "-cpu", cpu, "-m", "768", "-smp", "2",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-serial", "stdio", "-uuid", "6a1f0e3c-1111-4222-8333-444455556666",
		"-kernel", kernel, "-initrd", initrd, "-append", appendArgs,
		"-netdev", fmt.Sprintf("user,id=n0,restrict=on,guestfwd=tcp:10.0.2.100:8080-cmd:socat - TCP:127.0.0.1:%d", port),
		"-device", "virtio-net-pci,netdev=n0,mac=" + vmMAC,
		"-drive", "file=" + disk + ",format=raw,if=none,id=d0,cache=unsafe",
		"-device", "virtio-blk-pci,drive=d0,serial=machina-vm0",
	}
	qargs = append(qargs, opt.Args...)
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", append(qargs, rng...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	t0 := time.Now()
	err := cmd.Run()
	t.Logf("qemu ran %.1fs", time.Since(t0).Seconds())
	serial := out.String()
	if err != nil || ctx.Err() != nil {
		t.Fatalf("qemu: %v (ctx %v)\nserial:\n%s", err, ctx.Err(), serial)
	}
	return serial
}

func TestRamdiskCommissionAndDeployInQemu(t *testing.T) {
	needTools(t, "qemu-system-x86_64", "socat", "sgdisk", "sfdisk", "blkid", "mtype", "apt-get", "dpkg-deb", "cpio", "depmod")
	kernel, initrd := buildRamdisk(t)
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk.raw")
	const diskSize = 1 << 30
	f, err := os.Create(disk)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(diskSize)
	f.Close()

	// 1. commissioning, on a VM without an RNG device or RDRAND: the agent
	// must not block on entropy (bounded wait, then a console message).
	ctl, port := controller(t, agenttest.ControllerConfig{CommissionToken: "commission-tok-1"})
	serial := bootVM(t, kernel, initrd, disk, port, "machina.mode=commission machina.token=commission-tok-1 random.trust_cpu=off machina.entropy_wait=3s machina.lldp_wait=5s", vmOpts{NoRNG: true})
	switch {
	case strings.Contains(serial, "kernel CRNG still not initialised"):
		t.Log("CRNG was not ready after the bounded wait; the agent continued")
	case strings.Contains(serial, "waiting for kernel CRNG"):
		t.Log("CRNG became ready during the bounded wait")
	default:
		t.Log("CRNG was ready before the agent asked")
	}
	if strings.Contains(serial, "commission-tok-1") {
		t.Errorf("token leaked to the console")
	}
	reps := ctl.Reports()
	if len(reps) != 1 {
		t.Fatalf("controller got %d reports\nserial:\n%s", len(reps), serial)
	}
	rep := reps[0]
	if !rep.Passed() {
		t.Errorf("commissioning failed: %+v\nserial:\n%s", rep.Tests, serial)
	}
	if rep.BootMAC != vmMAC || rep.Facts.DMI.SystemUUID != "6a1f0e3c-1111-4222-8333-444455556666" || rep.Facts.CPU.Threads != 2 {
		t.Errorf("report identity = mac %s uuid %s threads %d", rep.BootMAC, rep.Facts.DMI.SystemUUID, rep.Facts.CPU.Threads)
	}
	if len(rep.Facts.Disks) != 1 || rep.Facts.Disks[0].Serial != "machina-vm0" || rep.Facts.Disks[0].SizeBytes != diskSize || rep.Facts.Disks[0].ByPath == "" {
		t.Errorf("disks = %+v", rep.Facts.Disks)
	}
	if len(rep.Facts.NICs) != 1 || rep.Facts.NICs[0].Driver != "virtio_net" || rep.Facts.NICs[0].MAC != vmMAC {
		t.Errorf("nics = %+v", rep.Facts.NICs)
	}
	for _, tr := range rep.Tests {
		t.Logf("test %s passed=%v %.2fs %v", tr.Name, tr.Passed, tr.Duration.Seconds(), tr.Metrics)
	}
	t.Logf("kernel start to report: %v", rep.StartedToReport)
	if os.Getenv("VMTEST_SERIAL") != "" {
		t.Logf("serial:\n%s", serial)
	}

	// 2. deploy: a 64 MiB GPT image (ESP + root), random root content, onto
	// a disk whose last 16 MiB hold an old tenant's bytes (where the seed
	// goes: the agent zeroes its range with BLKZEROOUT on the virtio disk
	// and writes only the filesystem's non-zero extents).
	df, err := os.OpenFile(disk, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	junk := bytes.Repeat([]byte{0xA5}, 16<<20)
	if _, err := df.WriteAt(junk, diskSize-int64(len(junk))); err != nil {
		t.Fatalf("write old bytes: %v", err)
	}
	df.Close()
	img := gptImage(t, dir, 64<<20)
	sum := sha256.Sum256(img)
	seed := v1.Seed{
		InstanceID: "i-vm0-1", Hostname: "vm0",
		SSHKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGkUjIg1YmN3qkI3QVh2dGZ1bHd0cWZ6eHJ0a2Z4 ops@lab"},
	}
	ctl2, port2 := controller(t, agenttest.ControllerConfig{
		DeployToken: "deploy-tok-1", Image: img,
		Plan: v1.Plan{ReadBack: true, Seed: seed},
	})
	ctl2.SetBaseURL("http://10.0.2.100:8080")
	serial = bootVM(t, kernel, initrd, disk, port2, "machina.mode=deploy machina.token=deploy-tok-1", vmOpts{})
	done := ctl2.Done()
	if len(done) != 1 || !done[0].OK {
		t.Fatalf("done = %+v\nserial:\n%s", done, serial)
	}
	if done[0].SHA256 != hex.EncodeToString(sum[:]) || done[0].BytesWritten != int64(len(img)) || done[0].DiskName != "vda" {
		t.Errorf("done = %+v", done[0])
	}
	got, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	// the image's partitions are intact (the GPT headers were rewritten for the seed)
	if !bytes.Equal(got[1<<20:len(img)-(1<<20)], img[1<<20:len(img)-(1<<20)]) {
		t.Errorf("image bytes on the VM disk differ")
	}
	if out, err := exec.Command("sgdisk", "-v", disk).CombinedOutput(); err != nil || !strings.Contains(string(out), "No problems found") {
		t.Errorf("sgdisk -v: %v\n%s", err, out)
	}
	// NoCloud discovery: a vfat filesystem labelled cidata (any case)
	off := seedOffset(t, disk)
	ud, err := exec.Command("mtype", "-i", fmt.Sprintf("%s@@%d", disk, off), "::user-data").Output()
	if err != nil || !strings.Contains(string(ud), "ssh_pwauth: false") || !strings.Contains(string(ud), "ops@lab") {
		t.Errorf("user-data: %v\n%s", err, ud)
	}
	// The seed region is exactly the full FAT16 image MakeFAT16 builds.
	seedFiles, err := agent.RenderSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	full, err := agent.MakeFAT16(agent.SeedSizeBytes, agent.SeedLabel, uint32(off/512), seedFiles)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[off:off+agent.SeedSizeBytes], full) {
		t.Errorf("seed region at %d differs from MakeFAT16's image", off)
	}
	if l := lineWith(serial, "seed written"); !strings.Contains(l, "zeroedBy=BLKZEROOUT") {
		t.Errorf("seed not zeroed with BLKZEROOUT on the virtio disk: %q", l)
	} else {
		t.Logf("seed: %s", l)
	}
	if m := regexp.MustCompile(`writeMBps=([0-9.]+)`).FindStringSubmatch(serial); m != nil {
		t.Logf("deploy write throughput in VM: %s MB/s; agent log: %s", m[1], lineWith(serial, "deploy written"))
	}
	t.Logf("verify: %s", lineWith(serial, "image verified"))
}

func lineWith(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

func gptImage(t testing.TB, dir string, size int64) []byte {
	t.Helper()
	p := filepath.Join(dir, "os.img")
	f, _ := os.Create(p)
	f.Truncate(size)
	f.Close()
	if out, err := exec.Command("sgdisk", "-n", "1:2048:+4M", "-t", "1:ef00", "-n", "2:0:0", "-t", "2:8300", "-c", "2:root", p).CombinedOutput(); err != nil {
		t.Fatalf("sgdisk: %v\n%s", err, out)
	}
	b, _ := os.ReadFile(p)
	rand.NewChaCha8([32]byte{9}).Read(b[2<<20 : size-(1<<20)])
	return b
}

func seedOffset(t *testing.T, disk string) int64 {
	t.Helper()
	out, err := exec.Command("sfdisk", "-d", disk).Output()
	if err != nil {
		t.Fatal(err)
	}
	var found []int64
	for _, l := range strings.Split(string(out), "\n") {
		m := regexp.MustCompile(`start=\s*([0-9]+)`).FindStringSubmatch(l)
		if m == nil {
			continue
		}
		start, _ := strconv.ParseInt(m[1], 10, 64)
		b, _ := exec.Command("blkid", "-p", "-O", strconv.FormatInt(start*512, 10), "-o", "export", disk).Output()
		if strings.Contains(strings.ToLower(string(b)), "label=cidata") && strings.Contains(string(b), "TYPE=vfat") {
			found = append(found, start*512)
		}
	}
	if len(found) != 1 {
		t.Fatalf("found %d NoCloud seeds, want 1:\n%s", len(found), out)
	}
	return found[0]
}

// TestRamdiskBuildReproducible builds the ramdisk twice into separate
// folders (sharing the kernel package cache) and compares the bytes.
func TestRamdiskBuildReproducible(t *testing.T) {
	needTools(t, "apt-get", "dpkg-deb", "cpio", "depmod", "modprobe")
	root := repoRoot(t)
	cache := filepath.Join(root, "out", "ramdisk", "cache")
	var sums [2]string
	for i := range sums {
		out := filepath.Join(t.TempDir(), "ramdisk")
		cmd := exec.Command(filepath.Join(root, "scripts", "build-ramdisk.sh"))
		cmd.Env = append(os.Environ(), "OUT="+out, "CACHE="+cache)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %d: %v\n%s", i, err, b)
		}
		man, err := os.ReadFile(filepath.Join(out, "manifest.txt"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"vmlinuz", "initrd.cpio.gz"} {
			b, err := os.ReadFile(filepath.Join(out, f))
			if err != nil {
				t.Fatal(err)
			}
			s := sha256.Sum256(b)
			if !strings.Contains(string(man), hex.EncodeToString(s[:])+"  "+f) {
				t.Errorf("manifest lacks the SHA-256 of %s:\n%s", f, man)
			}
			sums[i] += f + "=" + hex.EncodeToString(s[:]) + " "
		}
	}
	if sums[0] != sums[1] {
		t.Errorf("two builds differ:\n%s\n%s", sums[0], sums[1])
	}
}
