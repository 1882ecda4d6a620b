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
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/ramdisk/agent"
)

// BenchmarkMachineDisk is the file-system work one simulated machine costs
// the lab at 10,000 servers (bench/scale), per machine: writing its
// hardware tree and disk files (Lab.start), and the real agent's reads and
// writes of them: commissioning's facts and disk read test (as
// Machine.run configures them), and one 4 MiB image (sim.Config's default)
// written with read-back, and one whole deploy (agent.Deploy: the same
// image as the lab's MBR-partitioned simImage, with read-back, then the
// NoCloud seed partition). Sub-benchmarks: the machines' folder on the
// disk's file system (os.TempDir) and on tmpfs (/dev/shm, skipped when
// it is not one), as Config.MachinesDir chooses. Besides cpu-ns/op each
// step reports wchar-B/op, the bytes the process handed to write(2)-like
// calls in it (/proc/self/io wchar; an fallocate or an ioctl that zeroes
// counts nothing), and disk-B/op, the blocks its disk files gained
// (stat(2) st_blocks).
func BenchmarkMachineDisk(b *testing.B) {
	img := bytes.Repeat([]byte("machina-sim-bench-image\n"), (4<<20)/24+1)[:4<<20]
	sum := sha256.Sum256(img)
	osImg := simImage(len(img)) // partitioned, for the deploy's seed
	osSum := sha256.Sum256(osImg)
	for _, fs := range []struct{ name, parent string }{{"disk", os.TempDir()}, {"tmpfs", "/dev/shm"}} {
		b.Run(fs.name, func(b *testing.B) {
			if fs.name == "tmpfs" && !isTmpfs(fs.parent) {
				b.Skipf("%s is not a tmpfs", fs.parent)
			}
			for _, step := range []string{"tree", "commission", "image", "deploy"} {
				b.Run(step, func(b *testing.B) {
					dir, err := os.MkdirTemp(fs.parent, "machina-sim-bench-")
					if err != nil {
						b.Fatal(err)
					}
					defer os.RemoveAll(dir)
					var cost stepCost
					for i := 0; b.Loop(); i++ {
						im, sha := img, hex.EncodeToString(sum[:])
						if step == "deploy" {
							im, sha = osImg, hex.EncodeToString(osSum[:])
						}
						c := benchMachineStep(b, step, filepath.Join(dir, fmt.Sprintf("m%06d", i)), i, im, sha)
						cost.cpu += c.cpu
						cost.wchar += c.wchar
						cost.disk += c.disk
					}
					// The process's CPU (user and system) in the step, per
					// machine: ns/op is wall time, which other work on a
					// loaded machine stretches.
					b.ReportMetric(float64(cost.cpu)/float64(b.N), "cpu-ns/op")
					b.ReportMetric(float64(cost.wchar)/float64(b.N), "wchar-B/op")
					b.ReportMetric(float64(cost.disk)/float64(b.N), "disk-B/op")
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

// stepCost is what one machine's step cost the process: CPU (user and
// system), bytes handed to write calls (/proc/self/io wchar) and blocks
// its disk files gained (st_blocks, in bytes).
type stepCost struct {
	cpu   time.Duration
	wchar int64
	disk  int64
}

// wchar is the process's /proc/self/io wchar so far (0 when unreadable).
func wchar() int64 {
	b, _ := os.ReadFile("/proc/self/io")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "wchar: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// diskBlocks is the bytes of the blocks allocated to the files in devDir.
func diskBlocks(devDir string) int64 {
	ents, _ := os.ReadDir(devDir)
	var n int64
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Sys().(*syscall.Stat_t).Blocks * 512
		}
	}
	return n
}

// benchSeed is the NoCloud seed of the deploy step.
var benchSeed = v1.Seed{InstanceID: "i-bench-1", Hostname: "bench", SSHKeys: []string{simKey}, JoinCommand: "/usr/bin/true"}

// benchMachineStep writes machine i's tree under dir and, for "commission",
// "image" and "deploy", runs that step of the agent against it. It returns
// the step's cost (the tree's writing counts only in "tree").
func benchMachineStep(b *testing.B, step, dir string, i int, img []byte, sha string) stepCost {
	hw := hardwareFor("zone-a", i)
	root, devDir := filepath.Join(dir, "root"), filepath.Join(dir, "dev")
	mac := fmt.Sprintf("52:54:00:%02x:%02x:%02x", (i>>16)&0xff, (i>>8)&0xff, i&0xff)
	if step != "tree" {
		b.StopTimer()
	}
	cpu0, w0, d0 := processCPU(), wchar(), diskBlocks(devDir)
	if err := hw.writeTree(root, devDir, mac); err != nil {
		b.Fatal(err)
	}
	if step != "tree" {
		b.StartTimer()
		cpu0, w0, d0 = processCPU(), wchar(), diskBlocks(devDir)
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
	case "image", "deploy":
		benchWrite(b, step, filepath.Join(devDir, "sda"), hw.DisksGiB[0]<<30, img, sha)
	}
	return stepCost{cpu: processCPU() - cpu0, wchar: wchar() - w0, disk: diskBlocks(devDir) - d0}
}

// benchWrite runs the agent's image write ("image") or whole deploy
// ("deploy": img must be partitioned; then the seed) of img onto the disk
// file at path of size bytes, with read-back.
func benchWrite(b *testing.B, step, path string, size int64, img []byte, sha string) {
	d, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	wcfg := agent.WriteConfig{SizeBytes: int64(len(img)), SHA256: sha, ReadBack: true,
		Open: func(context.Context) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(img)), nil }}
	if step == "image" {
		res, err := agent.WriteImage(context.Background(), d, size, wcfg)
		if err != nil || res.ReadBackSHA256 != sha {
			b.Fatalf("write image: %v (read back %s)", err, res.ReadBackSHA256)
		}
		return
	}
	res, err := agent.Deploy(context.Background(), d, size, agent.DeployConfig{Seed: benchSeed, Write: wcfg})
	if err != nil || res.ReadBackSHA256 != sha || res.SeedOffset <= 0 {
		b.Fatalf("deploy: %v (read back %s, seed at %d)", err, res.ReadBackSHA256, res.SeedOffset)
	}
}

// isTmpfs reports whether dir is on a tmpfs (statfs(2)'s f_type).
func isTmpfs(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.TMPFS_MAGIC
}
