package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"
	"unsafe"

	v1 "github.com/machina-metal/machina/api/v1"
)

// CommissionConfig configures RunCommissioning. Zero values are usable.
type CommissionConfig struct {
	// Root is where /proc and /sys are mounted; "" means "/".
	Root string
	// DevDir holds the disk device nodes; "" means "/dev". Tests point it at
	// a folder of files named like the disks.
	DevDir string
	// MemoryTestBytes bounds the memory pattern test; zero means 64 MiB.
	MemoryTestBytes int64
	// MemoryFault, when set, is called after each pattern is written and
	// before it is checked: the simulated lab's failing-DIMM injection.
	// Nil (always, outside the simulated lab) tests the real memory only.
	MemoryFault func(words []uint64)
	// DiskReadBytes is read at the start, middle and end of each disk; zero means 8 MiB.
	DiskReadBytes int64
	// NetworkTestBytes is fetched from the controller; zero means 8 MiB.
	NetworkTestBytes int64
	// MinNetworkMBps fails the network test below this rate; zero means any rate.
	MinNetworkMBps float64
	// Payload opens a stream of n bytes from the controller (api/v1
	// AgentClient.Payload bound to the token). Nil fails the network test.
	Payload func(ctx context.Context, n int64) (io.ReadCloser, error)
	Logger  *slog.Logger
}

// RunCommissioning runs the four commissioning tests in order (CPU, memory,
// disk, network) against the facts f and returns one result each. A failed
// test does not stop the others; the controller moves the server to failed
// if any failed (v1.AgentReport.Passed).
func RunCommissioning(ctx context.Context, f v1.Facts, cfg CommissionConfig) []v1.TestResult {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tests := []struct {
		name string
		fn   func() (map[string]float64, error)
	}{
		{v1.TestCPU, func() (map[string]float64, error) { return CPUTest(cfg.Root, f.CPU) }},
		{v1.TestMemory, func() (map[string]float64, error) { return memoryTest(ctx, cfg.MemoryTestBytes, cfg.MemoryFault) }},
		{v1.TestDisk, func() (map[string]float64, error) { return DiskReadTest(ctx, cfg.DevDir, f.Disks, cfg.DiskReadBytes) }},
		{v1.TestNetwork, func() (map[string]float64, error) {
			return NetworkTest(ctx, cfg.Payload, cfg.NetworkTestBytes, cfg.MinNetworkMBps)
		}},
	}
	var out []v1.TestResult
	for _, tc := range tests {
		t0 := time.Now()
		m, err := tc.fn()
		r := v1.TestResult{Name: tc.name, Passed: err == nil, Duration: time.Since(t0), Metrics: m}
		if err != nil {
			r.Reason = err.Error()
			log.Warn("commissioning test failed", "test", tc.name, "err", err)
		} else {
			log.Info("commissioning test passed", "test", tc.name, "seconds", r.Duration.Seconds(), "metrics", m)
		}
		out = append(out, r)
	}
	return out
}

// ErrTopology is returned by CPUTest when the CPU topology is inconsistent.
var ErrTopology = errors.New("cpu topology mismatch")

// CPUTest checks that the online CPUs match the topology: every present CPU
// is online (/sys/devices/system/cpu/present vs online), the processors in
// /proc/cpuinfo equal the online count, and threads divide evenly into cores
// and cores into sockets.
func CPUTest(root string, c v1.CPU) (map[string]float64, error) {
	if root == "" {
		root = "/"
	}
	m := map[string]float64{"sockets": float64(c.Sockets), "cores": float64(c.Cores), "threads": float64(c.Threads), "online": float64(c.Online)}
	present := c.Online
	if s := readTrim(filepath.Join(root, "sys/devices/system/cpu/present")); s != "" {
		n, err := countCPUList(s)
		if err != nil {
			return m, fmt.Errorf("%w: %v", ErrTopology, err)
		}
		present = n
	}
	m["present"] = float64(present)
	switch {
	case c.Threads == 0 || c.Sockets == 0 || c.Cores == 0:
		return m, fmt.Errorf("%w: empty topology %+v", ErrTopology, c)
	case c.Online != 0 && c.Online != c.Threads:
		return m, fmt.Errorf("%w: %d CPUs online but %d in /proc/cpuinfo", ErrTopology, c.Online, c.Threads)
	case present != c.Online && c.Online != 0:
		return m, fmt.Errorf("%w: %d CPUs present but only %d online", ErrTopology, present, c.Online)
	case c.Threads%c.Cores != 0 || c.Cores%c.Sockets != 0:
		return m, fmt.Errorf("%w: %d threads, %d cores, %d sockets do not divide evenly", ErrTopology, c.Threads, c.Cores, c.Sockets)
	}
	return m, nil
}

// ErrMemoryPattern is returned by MemoryTest when a read-back differs.
var ErrMemoryPattern = errors.New("memory pattern mismatch")

// MemoryTest writes and verifies five patterns (all zeros, all ones, 0xAA,
// 0x55 and each word's own address) over n bytes (zero means 64 MiB). It
// tests only the pages the allocator hands out; it is a smoke test for bad
// DIMMs and wrong sizes, not memtest86.
func MemoryTest(ctx context.Context, n int64) (map[string]float64, error) {
	return memoryTest(ctx, n, nil)
}

func memoryTest(ctx context.Context, n int64, fault func([]uint64)) (map[string]float64, error) {
	if n <= 0 {
		n = 64 << 20
	}
	words := make([]uint64, n/8)
	t0 := time.Now()
	patterns := []uint64{0, ^uint64(0), 0xAAAAAAAAAAAAAAAA, 0x5555555555555555, 1}
	for pi, p := range patterns {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		addr := pi == len(patterns)-1
		for i := range words {
			if addr {
				words[i] = uint64(uintptr(unsafe.Pointer(&words[i])))
			} else {
				words[i] = p
			}
		}
		if fault != nil {
			fault(words)
		}
		for i := range words {
			want := p
			if addr {
				want = uint64(uintptr(unsafe.Pointer(&words[i])))
			}
			if words[i] != want {
				return nil, fmt.Errorf("%w: word %d = %#x, want %#x", ErrMemoryPattern, i, words[i], want)
			}
		}
	}
	sec := time.Since(t0).Seconds()
	return map[string]float64{"bytes": float64(n), "MBps": float64(n) * float64(2*len(patterns)) / sec / 1e6}, nil
}

// DiskReadTest reads n bytes (zero means 8 MiB) at the start, middle and end
// of every disk except virtual media, from devDir/<name>. Any read error
// fails the test; the error names the disk. No disk at all fails with
// ErrNoDiskToTest.
func DiskReadTest(ctx context.Context, devDir string, disks []v1.Disk, n int64) (map[string]float64, error) {
	if devDir == "" {
		devDir = "/dev"
	}
	if n <= 0 {
		n = 8 << 20
	}
	var total int64
	t0 := time.Now()
	var errs []error
	tested := 0
	buf := make([]byte, 1<<20)
	for _, d := range disks {
		if d.Virtual {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		f, err := os.Open(filepath.Join(devDir, d.Name))
		if err != nil {
			errs = append(errs, fmt.Errorf("disk %s: %w", d.Name, err))
			continue
		}
		tested++
		span := min(n, d.SizeBytes)
		for _, off := range []int64{0, (d.SizeBytes/2 - span/2) &^ 4095, (d.SizeBytes - span) &^ 4095} {
			r := io.NewSectionReader(f, off, span)
			c, err := io.CopyBuffer(io.Discard, r, buf)
			total += c
			if err != nil || c != span {
				errs = append(errs, fmt.Errorf("disk %s: read %d bytes at %d: got %d: %v", d.Name, span, off, c, err))
				break
			}
		}
		f.Close()
	}
	sec := time.Since(t0).Seconds()
	m := map[string]float64{"disks": float64(tested), "bytes": float64(total)}
	if sec > 0 {
		m["MBps"] = float64(total) / sec / 1e6
	}
	if len(errs) > 0 {
		return m, fmt.Errorf("disk read: %w", errors.Join(errs...))
	}
	if tested == 0 {
		// A machine with no disk cannot be deployed: the test fails rather
		// than pass having read nothing.
		return m, ErrNoDiskToTest
	}
	return m, nil
}

// ErrNoDiskToTest is returned by DiskReadTest when the machine has no disk to
// read (virtual media do not count).
var ErrNoDiskToTest = errors.New("disk read: no disk found")

// ErrNetwork is returned by NetworkTest when the controller is unreachable
// or slower than required.
var ErrNetwork = errors.New("network test failed")

// networkTestAttempts bounds NetworkTest's tries when the transfer itself
// breaks (refused, reset, cut short): an HA controller that fails over
// mid-test resets its connections, and the machine's link is not at fault.
// A rate below the minimum is a result and is not retried.
const networkTestAttempts = 3

// NetworkTest fetches n bytes (zero means 8 MiB) from the controller through
// payload and reports the throughput; it fails on a rate below minMBps, and
// on an error or a short body in each of networkTestAttempts tries (1 s,
// then 2 s apart; metric "attempts" counts them).
func NetworkTest(ctx context.Context, payload func(context.Context, int64) (io.ReadCloser, error), n int64, minMBps float64) (map[string]float64, error) {
	if payload == nil {
		return nil, fmt.Errorf("%w: no controller configured", ErrNetwork)
	}
	if n <= 0 {
		n = 8 << 20
	}
	var m map[string]float64
	var err error
	for attempt := 1; attempt <= networkTestAttempts; attempt++ {
		if attempt > 1 {
			select {
			case <-ctx.Done():
				return m, fmt.Errorf("%w: %v (after: %v)", ErrNetwork, ctx.Err(), err)
			case <-time.After(time.Duration(attempt-1) * time.Second):
			}
		}
		m, err = networkTransfer(ctx, payload, n)
		if m != nil {
			m["attempts"] = float64(attempt)
		}
		if err == nil {
			break
		}
	}
	if err != nil {
		return m, err
	}
	if minMBps > 0 && m["MBps"] < minMBps {
		return m, fmt.Errorf("%w: %.1f MB/s below %.1f MB/s", ErrNetwork, m["MBps"], minMBps)
	}
	return m, nil
}

// networkTransfer is one NetworkTest try: the bytes, seconds and MB/s of
// one payload fetch, and an error for a failed or short one.
func networkTransfer(ctx context.Context, payload func(context.Context, int64) (io.ReadCloser, error), n int64) (map[string]float64, error) {
	t0 := time.Now()
	rc, err := payload(ctx, n)
	if err != nil {
		return map[string]float64{}, fmt.Errorf("%w: %v", ErrNetwork, err)
	}
	defer rc.Close()
	c, err := io.Copy(io.Discard, io.LimitReader(rc, n+1))
	sec := time.Since(t0).Seconds()
	m := map[string]float64{"bytes": float64(c), "seconds": sec}
	if sec > 0 {
		m["MBps"] = float64(c) / sec / 1e6
	}
	if err != nil || c != n {
		return m, fmt.Errorf("%w: got %d of %d bytes: %v", ErrNetwork, c, n, err)
	}
	return m, nil
}
