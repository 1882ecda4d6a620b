package vm

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/machina-metal/machina/internal/peertest"
)

// TestVMLabHost runs the host lab (Config.Host, host.go): one UEFI VM
// with a swtpm TPM, two bonded NICs under a VLAN and a bridge, a RAID1
// root over two virtio disks and a volume group on an NVMe disk, from
// commissioning (LLDP, the cabling guard) through deploy, first boot,
// a degraded boot and a release with erase zero. It needs root, qemu,
// swtpm, lldpd and the built binaries; it runs when
// MACHINA_VM_LAB_HOST=1 (set by .ci/run's lab_host step and make
// lab-host), because it takes minutes.
func TestVMLabHost(t *testing.T) {
	if os.Getenv("MACHINA_VM_LAB_HOST") != "1" {
		if os.Getenv("CI") == "true" {
			t.Fatal("TestVMLabHost reached under CI=true without MACHINA_VM_LAB_HOST=1: run it with make lab-host, or filter it out as make test does")
		}
		t.Skip("the host VM lab runs with MACHINA_VM_LAB_HOST=1 (make lab-host, .ci/run step lab_host): minutes, root, qemu, swtpm, lldpd")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// MACHINA_VM_LAB_TIME_SCALE (e.g. 3) stretches every step's deadline
	// and the budget on a machine loaded by other work: TCG's sha256 of
	// the whole image, most of the deploy, slows with the load.
	scale := 1.0
	if v, err := strconv.ParseFloat(os.Getenv("MACHINA_VM_LAB_TIME_SCALE"), 64); err == nil && v > 1 {
		scale = v
	}
	budget := time.Duration(float64(HostBudget) * scale)
	deadline, ok := t.Deadline()
	if !ok {
		deadline = time.Now().Add(budget + 5*time.Minute)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(-30*time.Second)) // .ci/run: -timeout 20m
	defer cancel()
	start := time.Now()
	steps, err := Run(ctx, Config{Root: root, Host: true, TimeScale: scale, Keep: os.Getenv("MACHINA_VM_LAB_KEEP") == "1", Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
		OnStep: func(name string, d time.Duration) { t.Logf("STEP %-90s %6.1fs", name, d.Seconds()) }})
	logSteps(t, "host VM lab", steps, time.Since(start))
	if errors.Is(err, ErrPrereq) {
		peertest.Missing(t, "host VM lab prerequisite: "+err.Error(), "what it names (`make lab-host` builds the binaries and the ramdisk; scripts/deps.sh installs the packages)")
	}
	if err != nil {
		t.Fatal(err)
	}
	total := time.Since(start)
	if len(steps) > 0 {
		total -= steps[0].Duration
	}
	if total > budget {
		t.Errorf("host VM lab took %s, over the %s budget (time scale %.1f)", total.Round(time.Second), budget, scale)
	}
}

// TestScanDisk: scanDisk finds a marker across its 4 MiB read boundary,
// counts the non-zero bytes of allocated extents and skips holes.
func TestScanDisk(t *testing.T) {
	p := filepath.Join(t.TempDir(), "d.raw")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, 64<<20); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	marker := []byte("MARKER-0123456789")
	at := int64(8<<20) + 4<<20 - 5 // straddles the second 4 MiB read of the extent
	if _, err := f.WriteAt(marker, at); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{0}, 1<<20), 32<<20); err != nil { // an allocated extent of zeros
		t.Fatal(err)
	}
	f.Close()
	st, err := scanDisk(p, marker)
	if err != nil {
		t.Fatal(err)
	}
	if !st.marker || st.nonZero != int64(len(marker)) || st.firstNonZero != at {
		t.Fatalf("scan: %+v, want the marker, %d non-zero bytes from %d", st, len(marker), at)
	}
	if st.data == 0 || st.data >= 64<<20 {
		t.Fatalf("scan read %d bytes of data: holes not skipped or nothing read", st.data)
	}
	st, err = scanDisk(p, []byte("ABSENT-MARKER"))
	if err != nil || st.marker {
		t.Fatalf("absent marker found: %+v %v", st, err)
	}
}
