package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	v1 "github.com/machina-metal/machina/api/v1"
)

// ErrEraseUnsupported is matched (errors.Is) by an *EraseUnsupportedError.
var ErrEraseUnsupported = errors.New("erase method unsupported")

// EraseUnsupportedError says a disk cannot do the plan's erase method and
// why. The agent never runs a weaker method instead: the release wipe
// fails with it (v1.WipeResult.Unsupported) and the server stays held.
type EraseUnsupportedError struct {
	Method string // v1.EraseDiscard, v1.EraseZero or v1.EraseSecure
	Disk   string // kernel name
	Why    string
}

func (e *EraseUnsupportedError) Error() string {
	return fmt.Sprintf("erase %s unsupported on %s: %s", e.Method, e.Disk, e.Why)
}

// Is makes errors.Is(err, ErrEraseUnsupported) true.
func (e *EraseUnsupportedError) Is(target error) bool { return target == ErrEraseUnsupported }

// EraseConfig configures EraseDisk.
type EraseConfig struct {
	// Method is v1.EraseMetadata ("" means it), v1.EraseDiscard,
	// v1.EraseZero or v1.EraseSecure.
	Method string
	// Disk is the disk as the facts name it (Name and Transport are used).
	Disk v1.Disk
	// SysBlock is the disk's sysfs directory (/sys/block/NAME), read for
	// queue/discard_max_bytes; "" means /sys/block/<Disk.Name>.
	SysBlock string
	// Samples is how many sample blocks are read before and after the
	// erase; zero means 1024 (fewer on a disk too small for them).
	Samples int
	// ChunkBytes is the size of one discard or zero-out ioctl, the
	// granularity of Progress; zero means 256 MiB.
	ChunkBytes int64
	// SecureTimeout bounds one NVMe Format or ATA SECURITY ERASE UNIT
	// (passed to the driver as the command's timeout); zero means 4 hours
	// or, on ATA, the drive's own estimate (IDENTIFY word 89 or 90) doubled
	// when that is longer.
	SecureTimeout time.Duration
	// Progress, when set, is called with v1.StepErase and the bytes done
	// of the device's size (ProgressMeter.Set).
	Progress func(step string, done, total int64)
	Logger   *slog.Logger
}

// sampleBytes is the size of one verification sample (a 4 KiB block, the
// largest logical block size in use, so every sample is aligned).
const sampleBytes = 4096

// EraseDisk erases f, the whole block device of cfg.Disk of size bytes,
// with cfg.Method and returns its outcome. Except for metadata (WipeDisk),
// it reads cfg.Samples blocks spread over the device first (one at a
// random place in each equal stretch, and the first and last block),
// erases, and reads them again with O_DIRECT (past the page cache): after
// zero every sample must be all zeros, after discard and secure none may
// still hold the non-zero data it held before. A sample that fails this
// fails the erase. Errors: *EraseUnsupportedError when the device cannot
// do the method (nothing was written then), else the failing step.
func EraseDisk(ctx context.Context, f *os.File, size int64, cfg EraseConfig) (out v1.DiskErase, _ error) {
	out = v1.DiskErase{Name: cfg.Disk.Name, Bytes: size}
	t0 := time.Now()
	defer func() { out.Duration = time.Since(t0) }()
	progress := func(done int64) {
		if cfg.Progress != nil {
			cfg.Progress(v1.StepErase, done, size)
		}
	}
	if cfg.Method == "" || cfg.Method == v1.EraseMetadata {
		out.Method = v1.EraseMetadata
		return out, WipeDisk(f, size)
	}
	// Refuse before anything is read or written.
	sec, err := prepareErase(f, cfg)
	if err != nil {
		return out, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if sec != nil {
		log.Info("secure erase", "disk", cfg.Disk.Name, "command", sec.describe())
	}
	samples := sampleOffsets(size, cfg.Samples)
	before, err := readSamples(f.Name(), samples)
	if err != nil {
		return out, fmt.Errorf("erase %s: read samples before: %w", cfg.Disk.Name, err)
	}
	progress(0)
	switch cfg.Method {
	case v1.EraseDiscard:
		out.Method, err = discardAll(ctx, f, size, cfg.chunk(), progress)
	case v1.EraseZero:
		out.Method, err = zeroAll(ctx, f, size, cfg.chunk(), progress)
	case v1.EraseSecure:
		out.Method, err = secureWithProgress(ctx, sec, size, progress)
	}
	if err != nil {
		return out, fmt.Errorf("erase %s %s: %w", cfg.Method, cfg.Disk.Name, err)
	}
	after, err := readSamples(f.Name(), samples)
	if err != nil {
		return out, fmt.Errorf("erase %s %s: read samples back: %w", cfg.Method, cfg.Disk.Name, err)
	}
	out.VerifiedSamples, err = checkSamples(cfg.Method, samples, before, after)
	if err != nil {
		return out, fmt.Errorf("erase %s %s: verify: %w", cfg.Method, cfg.Disk.Name, err)
	}
	return out, nil
}

// secureTick is how often secureWithProgress updates its estimate.
var secureTick = time.Second

// secureWithProgress runs the drive's own erase, one command that reports
// nothing until it ends, and meanwhile moves the progress by the time
// elapsed over the erase's expected duration (sec.expect: the ATA drive's
// IDENTIFY estimate, else the command timeout), held below the size until
// the command returns. The bytes are an estimate, not the drive's count:
// they tell the controller the agent is still waiting on the drive, so a
// long erase is not taken for a silent one (the wipe deadline counts from
// the last advance).
func secureWithProgress(ctx context.Context, sec secureEraser, size int64, progress func(int64)) (string, error) {
	stop := make(chan struct{})
	ticked := make(chan struct{})
	go func() {
		defer close(ticked)
		t0, expect := time.Now(), sec.expect()
		tk := time.NewTicker(secureTick)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
			}
			frac := float64(time.Since(t0)) / float64(max(expect, time.Second))
			progress(min(size-1, int64(frac*float64(size))))
		}
	}()
	method, err := sec.erase(ctx)
	close(stop)
	<-ticked
	if err == nil {
		progress(size)
	}
	return method, err
}

// CheckErase says whether the disk open as f can do cfg.Method, sending
// it nothing but identify commands: nil, an *EraseUnsupportedError, or the
// error of the identify. The release wipe checks every disk before it
// erases any, so a disk that cannot do the method fails the wipe before
// hours are spent on the others.
func CheckErase(f *os.File, cfg EraseConfig) error {
	_, err := prepareErase(f, cfg)
	return err
}

// prepareErase runs the checks of cfg.Method and returns the secure
// eraser for EraseSecure (nil for the others).
func prepareErase(f *os.File, cfg EraseConfig) (secureEraser, error) {
	if cfg.SysBlock == "" {
		cfg.SysBlock = filepath.Join("/sys/block", cfg.Disk.Name)
	}
	switch cfg.Method {
	case "", v1.EraseMetadata, v1.EraseZero:
		return nil, nil
	case v1.EraseDiscard:
		if n, _ := strconv.ParseInt(readTrim(filepath.Join(cfg.SysBlock, "queue/discard_max_bytes")), 10, 64); n <= 0 {
			return nil, &EraseUnsupportedError{Method: cfg.Method, Disk: cfg.Disk.Name, Why: "queue/discard_max_bytes is 0 (the device takes no discard)"}
		}
		return nil, nil
	case v1.EraseSecure:
		return newSecureEraser(f, cfg)
	}
	return nil, fmt.Errorf("erase %s: unknown method %q", cfg.Disk.Name, cfg.Method)
}

func (c EraseConfig) chunk() int64 {
	if c.ChunkBytes <= 0 {
		return 256 << 20
	}
	return c.ChunkBytes &^ (sampleBytes - 1)
}

// sampleOffsets returns up to n (zero: 1024) 4 KiB-aligned offsets in
// [0, size): the first and last block, and one at a random place in each
// of n-2 equal stretches between them, ascending.
func sampleOffsets(size int64, n int) []int64 {
	if n <= 0 {
		n = 1024
	}
	blocks := size / sampleBytes
	if blocks <= 0 {
		return nil
	}
	if int64(n) > blocks {
		n = int(blocks)
	}
	out := []int64{0}
	if n == 1 {
		return out
	}
	inner := int64(n - 2)
	for i := int64(0); i < inner; i++ {
		lo := 1 + i*(blocks-2)/inner
		hi := 1 + (i+1)*(blocks-2)/inner
		b := lo
		if hi > lo {
			b = lo + rand.Int64N(hi-lo)
		}
		out = append(out, b*sampleBytes)
	}
	return append(out, (blocks-1)*sampleBytes)
}

// readSamples reads sampleBytes at each offset of the device at path,
// opened anew with O_DIRECT so the bytes come from the device and not
// from the page cache (a file system that refuses O_DIRECT, as tmpfs
// does, is read through the cache).
func readSamples(path string, offs []int64) ([][]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		if f, err = os.Open(path); err != nil {
			return nil, err
		}
	}
	defer f.Close()
	// O_DIRECT wants an aligned buffer: an anonymous mapping is page aligned.
	buf, err := unix.Mmap(-1, 0, sampleBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("sample buffer: %w", err)
	}
	defer unix.Munmap(buf)
	out := make([][]byte, len(offs))
	for i, off := range offs {
		if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("read sample at %d: %w", off, err)
		}
		out[i] = bytes.Clone(buf)
	}
	return out, nil
}

// checkSamples compares the samples before and after the erase and
// returns how many passed: for zero, all-zero blocks; for discard and
// secure, blocks that do not hold the non-zero data they held before (an
// NVMe user data erase may leave any pattern; a discard on a device
// without deterministic read-zero-after-TRIM may return the old data,
// which is not erased). The error names the first failing offset and how
// many failed.
func checkSamples(method string, offs []int64, before, after [][]byte) (int, error) {
	zero := make([]byte, sampleBytes)
	ok, bad, first := 0, 0, int64(-1)
	for i := range offs {
		pass := true
		switch method {
		case v1.EraseZero:
			pass = bytes.Equal(after[i], zero)
		default:
			pass = bytes.Equal(before[i], zero) || sha256.Sum256(before[i]) != sha256.Sum256(after[i])
		}
		if pass {
			ok++
			continue
		}
		if bad++; first < 0 {
			first = offs[i]
		}
	}
	if bad > 0 {
		what := "not all zeros"
		if method != v1.EraseZero {
			what = "still holds its data from before the erase"
		}
		return ok, fmt.Errorf("%d of %d samples failed; the sample at byte %d %s", bad, len(offs), first, what)
	}
	return ok, nil
}

// rangeIoctl runs a block ioctl that takes a {start, length} pair of
// uint64 (BLKDISCARD, BLKSECDISCARD, BLKZEROOUT; linux/fs.h).
func rangeIoctl(f *os.File, req uintptr, off, n int64) error {
	r := [2]uint64{uint64(off), uint64(n)}
	conn, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno unix.Errno
	if err := conn.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, req, uintptr(unsafe.Pointer(&r)))
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}

// inChunks runs do over [0, size) in chunk-sized pieces, reporting the
// bytes done after each and stopping when ctx ends.
func inChunks(ctx context.Context, size, chunk int64, progress func(int64), do func(off, n int64) error) error {
	for off := int64(0); off < size; off += chunk {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := do(off, min(chunk, size-off)); err != nil {
			return fmt.Errorf("at byte %d: %w", off, err)
		}
		progress(min(off+chunk, size))
	}
	return nil
}

// discardAll discards every block of f: BLKSECDISCARD (the device must
// also erase the blocks' old copies, e.g. eMMC secure trim) where the
// device takes it, else BLKDISCARD. Sysfs has no attribute for secure
// discard support, so the first chunk's EOPNOTSUPP is the probe. It
// returns "secure-discard" or "discard".
func discardAll(ctx context.Context, f *os.File, size, chunk int64, progress func(int64)) (string, error) {
	method, req := "secure-discard", uintptr(unix.BLKSECDISCARD)
	if err := rangeIoctl(f, req, 0, min(chunk, size)); err != nil {
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EINVAL) {
			return method, fmt.Errorf("BLKSECDISCARD: %w", err)
		}
		method, req = v1.EraseDiscard, unix.BLKDISCARD
	}
	err := inChunks(ctx, size, chunk, progress, func(off, n int64) error { return rangeIoctl(f, req, off, n) })
	if err != nil {
		return method, fmt.Errorf("%s: %w", method, err)
	}
	return method, nil
}

// zeroAll writes zeros over f with BLKZEROOUT (the kernel offloads to
// Write Zeroes or WRITE SAME where the device has it and writes zero pages
// otherwise, and drops the range from the page cache), or with plain
// writes when f is not a block device (ENOTTY), then fsyncs.
func zeroAll(ctx context.Context, f *os.File, size, chunk int64, progress func(int64)) (string, error) {
	zero := make([]byte, min(chunk, 4<<20))
	err := inChunks(ctx, size, chunk, progress, func(off, n int64) error {
		err := rangeIoctl(f, unix.BLKZEROOUT, off, n)
		if !errors.Is(err, unix.ENOTTY) {
			return err
		}
		for p := off; p < off+n; p += int64(len(zero)) {
			if _, err := f.WriteAt(zero[:min(int64(len(zero)), off+n-p)], p); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		return v1.EraseZero, fmt.Errorf("zero out: %w", err)
	}
	return v1.EraseZero, nil
}
