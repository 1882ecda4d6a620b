package sim

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/machina-metal/machina/ramdisk/agent"
)

// BenchmarkMachineDisk is the file-system work one simulated machine costs
// the lab at 10,000 servers (bench/scale), per machine: writing its
// hardware tree and disk files (Lab.start), and the real agent's reads and
// writes of them: commissioning's facts and disk read test (as
// Machine.run configures them), and one 4 MiB image (sim.Config's default)
// written with read-back. Sub-benchmarks: the machines' folder on the
// disk's file system (os.TempDir) and on tmpfs (/dev/shm, skipped when
// it is not one), as Config.MachinesDir chooses.
func BenchmarkMachineDisk(b *testing.B) {
	img := bytes.Repeat([]byte("machina-sim-bench-image\n"), (4<<20)/24+1)[:4<<20]
	sum := sha256.Sum256(img)
	for _, fs := range []struct{ name, parent string }{{"disk", os.TempDir()}, {"tmpfs", "/dev/shm"}} {
		b.Run(fs.name, func(b *testing.B) {
			if fs.name == "tmpfs" && !isTmpfs(fs.parent) {
				b.Skipf("%s is not a tmpfs", fs.parent)
			}
			for _, step := range []string{"tree", "commission", "image"} {
				b.Run(step, func(b *testing.B) {
					dir, err := os.MkdirTemp(fs.parent, "machina-sim-bench-")
					if err != nil {
						b.Fatal(err)
					}
					defer os.RemoveAll(dir)
					var cpu time.Duration
					for i := 0; b.Loop(); i++ {
						cpu += benchMachineStep(b, step, filepath.Join(dir, fmt.Sprintf("m%06d", i)), i, img, hex.EncodeToString(sum[:]))
					}
					// The process's CPU (user and system) in the step, per
					// machine: ns/op is wall time, which other work on a
					// loaded machine stretches.
					b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
				})
			}
		})
	}
}

// processCPU is the process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchMachineStep writes machine i's tree under dir and, for "commission"
// and "image", runs that step of the agent against it. It returns the
// process's CPU time in the step (the tree's writing counts only in
// "tree").
func benchMachineStep(b *testing.B, step, dir string, i int, img []byte, sha string) time.Duration {
	hw := hardwareFor("zone-a", i)
	root, devDir := filepath.Join(dir, "root"), filepath.Join(dir, "dev")
	mac := fmt.Sprintf("52:54:00:%02x:%02x:%02x", (i>>16)&0xff, (i>>8)&0xff, i&0xff)
	if step != "tree" {
		b.StopTimer()
	}
	cpu0 := processCPU()
	if err := hw.writeTree(root, devDir, mac); err != nil {
		b.Fatal(err)
	}
	if step != "tree" {
		b.StartTimer()
		cpu0 = processCPU()
	}
	switch step {
	case "commission":
		f, err := agent.CollectFacts(root)
		if err != nil {
			b.Fatal(err)
		}
		if len(f.Disks) != len(hw.DisksGiB) || f.DMI.SystemSerial != hw.Serial {
			b.Fatalf("facts: %d disks, serial %q; want %d, %q", len(f.Disks), f.DMI.SystemSerial, len(hw.DisksGiB), hw.Serial)
		}
		if _, err := agent.DiskReadTest(context.Background(), devDir, f.Disks, 64<<10); err != nil {
			b.Fatal(err)
		}
	case "image":
		d, err := os.OpenFile(filepath.Join(devDir, "sda"), os.O_RDWR, 0)
		if err != nil {
			b.Fatal(err)
		}
		res, err := agent.WriteImage(context.Background(), d, hw.DisksGiB[0]<<30, agent.WriteConfig{SizeBytes: int64(len(img)), SHA256: sha, ReadBack: true,
			Open: func(context.Context) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(img)), nil }})
		d.Close()
		if err != nil || res.ReadBackSHA256 != sha {
			b.Fatalf("write image: %v (read back %s)", err, res.ReadBackSHA256)
		}
	}
	return processCPU() - cpu0
}

// isTmpfs reports whether dir is on a tmpfs (statfs(2)'s f_type).
func isTmpfs(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.TMPFS_MAGIC
}
