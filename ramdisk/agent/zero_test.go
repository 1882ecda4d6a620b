package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/machina-metal/machina/internal/peertest"
)

// plainDevice is a BlockDevice without the Zeroer capability (an
// *os.File hidden behind the three methods), so the disk code writes its
// zeros.
type plainDevice struct{ f *os.File }

func (d plainDevice) ReadAt(p []byte, off int64) (int, error)  { return d.f.ReadAt(p, off) }
func (d plainDevice) WriteAt(p []byte, off int64) (int, error) { return d.f.WriteAt(p, off) }
func (d plainDevice) Sync() error                              { return d.f.Sync() }

// unsupportedZeroer has the capability but its device refuses it, as a
// file system without hole punching does.
type unsupportedZeroer struct{ plainDevice }

func (unsupportedZeroer) ZeroRange(int64, int64) error { return errors.ErrUnsupported }

// zeroCases are ranges of an 8 MiB device: sector- and page-aligned,
// unaligned at either end or both, inside one sector, the whole device.
var zeroCases = []struct {
	name   string
	off, n int64
}{
	{"aligned MiB", 1 << 20, 1 << 20},
	{"unaligned head", 4096 + 17, 64 << 10},
	{"unaligned tail", 2 << 20, 3<<20 + 5},
	{"unaligned both", 5<<20 + 511, 100_000},
	{"inside one sector", 7<<20 + 3, 300},
	{"whole device", 0, 8 << 20},
}

// randomFile writes size random bytes (all blocks allocated) to a new
// file name in dir and returns it open read-write with its bytes.
func randomFile(t *testing.T, dir, name string, size int) (*os.File, []byte) {
	t.Helper()
	b := make([]byte, size)
	rand.NewChaCha8([32]byte{7}).Read(b)
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, b
}

// wantZeroed is before with [off, off+n) zeroed.
func wantZeroed(before []byte, off, n int64) []byte {
	want := append([]byte(nil), before...)
	clear(want[off : off+n])
	return want
}

// checkBytes fails unless dev's first len(want) bytes are want, naming
// the first difference.
func checkBytes(t *testing.T, what string, dev io.ReaderAt, want []byte) {
	t.Helper()
	got := make([]byte, len(want))
	if _, err := dev.ReadAt(got, 0); err != nil {
		t.Fatalf("%s: read: %v", what, err)
	}
	if i := firstDiff(got, want); i >= 0 {
		t.Fatalf("%s: byte %d = %#x, want %#x", what, i, got[i], want[i])
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// onTmpfs reports whether dir is on a tmpfs (statfs(2)'s f_type).
func onTmpfs(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.TMPFS_MAGIC
}

// allocated is the bytes of f's blocks (stat(2) st_blocks, 512-byte units).
func allocated(t *testing.T, f *os.File) int64 {
	t.Helper()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Blocks * 512
}

// TestFileZeroRangePunchesHoles: on a regular file (the test's temporary
// folder, and tmpfs as the simulated lab uses) ZeroRange punches a hole
// (fallocate FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE): the range reads
// zeros, every other byte is as it was, the size stays, and an aligned
// MiB frees its blocks. A device without the capability, and one whose
// ZeroRange is unsupported, get the same bytes from zeroOut's writes.
func TestFileZeroRangePunchesHoles(t *testing.T) {
	dirs := map[string]string{"tempdir": t.TempDir()}
	if onTmpfs("/dev/shm") {
		d, err := os.MkdirTemp("/dev/shm", "machina-zero-test-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		dirs["tmpfs"] = d
	}
	for fsName, parent := range dirs {
		for _, c := range zeroCases {
			t.Run(fsName+"/"+c.name, func(t *testing.T) {
				dir, err := os.MkdirTemp(parent, "case-")
				if err != nil {
					t.Fatal(err)
				}
				defer os.RemoveAll(dir)
				f, before := randomFile(t, dir, "file", 8<<20)
				want := wantZeroed(before, c.off, c.n)
				held := allocated(t, f)
				how, err := zeroOut(f, c.off, c.n)
				if err != nil || how != "punch-hole" {
					t.Fatalf("zeroOut(file) = %q, %v; want punch-hole", how, err)
				}
				checkBytes(t, "file", f, want)
				if st, _ := f.Stat(); st.Size() != 8<<20 {
					t.Errorf("size after punching = %d, want %d", st.Size(), 8<<20)
				}
				if c.n >= 1<<20 && allocated(t, f) > held-c.n/2 {
					t.Errorf("blocks %d -> %d bytes: the %d-byte range was not freed", held, allocated(t, f), c.n)
				}
				for _, name := range []string{"plain", "unsupported"} {
					g, _ := randomFile(t, dir, name, 8<<20)
					var d BlockDevice = plainDevice{g}
					if name == "unsupported" {
						d = unsupportedZeroer{plainDevice{g}}
					}
					how, err := zeroOut(d, c.off, c.n)
					if err != nil || how != "write" {
						t.Fatalf("zeroOut(%s) = %q, %v; want write", name, how, err)
					}
					checkBytes(t, name, g, want)
				}
			})
		}
	}
}

// TestFileZeroRangeRefusesOtherFiles: a file that is neither regular nor
// a block device is errors.ErrUnsupported from File.ZeroRange, and
// zeroOut writes instead.
func TestFileZeroRangeRefusesOtherFiles(t *testing.T) {
	p := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := (File{f}).ZeroRange(0, 512); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("ZeroRange on a fifo = %v, want errors.ErrUnsupported", err)
	}
}

// TestFileZeroRangeOnLoopDevice: on a real block device (a loop device
// over a file of random bytes) ZeroRange uses BLKZEROOUT for the
// sector-aligned middle and writes the unaligned edges: through the
// device and in the backing file after fsync, the range is zeros and the
// other bytes are as they were.
func TestFileZeroRangeOnLoopDevice(t *testing.T) {
	peertest.Root(t, "loop devices")
	need(t, "losetup")
	for _, c := range zeroCases {
		t.Run(c.name, func(t *testing.T) {
			back, before := randomFile(t, t.TempDir(), "backing", 8<<20)
			out, err := exec.Command("losetup", "--find", "--show", back.Name()).CombinedOutput()
			if err != nil {
				t.Fatalf("losetup: %v %s", err, out)
			}
			loop := strings.TrimSpace(string(out))
			defer exec.Command("losetup", "-d", loop).Run()
			dev, _, err := openTarget(loop)
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			want := wantZeroed(before, c.off, c.n)
			how, err := zeroOut(dev, c.off, c.n)
			if err != nil || how != "BLKZEROOUT" {
				t.Fatalf("zeroOut(%s) = %q, %v; want BLKZEROOUT", loop, how, err)
			}
			checkBytes(t, "loop device", dev, want)
			if err := dev.Sync(); err != nil {
				t.Fatal(err)
			}
			checkBytes(t, "backing file", back, want)
		})
	}
}

// TestDeploySeedEqualsFullImageWrite: Deploy's seed (the partition's range
// zeroed, then only the FAT16's non-zero extents written) leaves the disk
// byte for byte as the full-image write did (AddSeedPartition with
// MakeFAT16's 8 MiB, built again with the right hidden sectors and
// rewritten, as Deploy did before), over a target full of an old layout's
// bytes: with hole punching (*os.File), on a device without the Zeroer
// capability, and for GPT and MBR images. The seed region also equals
// MakeFAT16's image at its offset.
func TestDeploySeedEqualsFullImageWrite(t *testing.T) {
	need(t, "sgdisk", "sfdisk")
	const diskSize = 96 << 20
	files, err := RenderSeed(testSeed)
	if err != nil {
		t.Fatal(err)
	}
	for name, img := range map[string][]byte{"gpt": makeGPTImage(t, 16<<20), "mbr": makeMBRImage(t, 16<<20)} {
		wcfg := WriteConfig{Open: FileOpener(img), SizeBytes: int64(len(img)), SHA256: sum(img), ChunkBytes: 1 << 20}
		old, _ := newTarget(t, diskSize)
		if _, err := WriteImage(context.Background(), old, diskSize, wcfg); err != nil {
			t.Fatal(err)
		}
		full, err := MakeFAT16(SeedSizeBytes, SeedLabel, 0, files)
		if err != nil {
			t.Fatal(err)
		}
		off, err := AddSeedPartition(old, diskSize, int64(len(img)), full, testSeed.InstanceID)
		if err != nil {
			t.Fatal(err)
		}
		full, _ = MakeFAT16(SeedSizeBytes, SeedLabel, uint32(off/512), files)
		if _, err := old.WriteAt(full, off); err != nil {
			t.Fatal(err)
		}
		want, _ := os.ReadFile(old.Name())
		for devName, wrap := range map[string]func(*os.File) BlockDevice{
			"file":  func(f *os.File) BlockDevice { return f },
			"plain": func(f *os.File) BlockDevice { return plainDevice{f} },
		} {
			f, _ := newTarget(t, diskSize)
			res, err := Deploy(context.Background(), wrap(f), diskSize, DeployConfig{Write: wcfg, Seed: testSeed, Logger: testLogger(t)})
			if err != nil {
				t.Fatalf("%s/%s: Deploy: %v", name, devName, err)
			}
			got, _ := os.ReadFile(f.Name())
			if res.SeedOffset != off {
				t.Errorf("%s/%s: seed at %d, full-image write put it at %d", name, devName, res.SeedOffset, off)
			}
			if i := firstDiff(got, want); i >= 0 {
				t.Errorf("%s/%s: disk byte %d = %#x, full-image write left %#x", name, devName, i, got[i], want[i])
			}
			if !bytes.Equal(got[off:off+SeedSizeBytes], full) {
				t.Errorf("%s/%s: seed region differs from MakeFAT16's image", name, devName)
			}
		}
	}
}
