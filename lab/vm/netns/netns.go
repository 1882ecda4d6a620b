// Package netns creates the isolated layer-2 segment of the VM lab: a
// network namespace (name "<prefix>-<random hex>") holding a bridge and tap
// devices for qemu VMs, runs processes inside it, and tears it all down by
// process id and `ip netns del`. It drives iproute2's `ip` command (root
// needed), as in LAB-NOTES §2.1.
//
// The package imports no other project package.
package netns

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrInvalidName is returned when a prefix or interface name is not a
// short lowercase token ([a-z0-9-], see Config).
var ErrInvalidName = errors.New("netns: invalid name")

// Config describes the namespace to create. Every zero value is usable.
type Config struct {
	// Prefix starts the namespace name; a '-' and 6 random hex digits
	// follow. 1..16 characters of [a-z0-9-]. Zero means "mlab".
	Prefix string
	// Bridge is the bridge device created inside the namespace (STP off,
	// so ports forward at once). At most 15 characters of [a-z0-9-].
	// Zero means "br0".
	Bridge string
	// BridgeAddrs are assigned to the bridge, e.g. 10.99.0.1/24 and
	// fd99::1/64 (the IPv6 address lets a router advertisement stop
	// iPXE's IPv6 wait, LAB-NOTES §2.2). Zero means none.
	BridgeAddrs []netip.Prefix
	// Taps is how many tap devices ("tap0".."tapN-1") to create and
	// attach to the bridge. Zero means none.
	Taps int
	// Logger receives one Info line per create and delete; nil discards.
	Logger *slog.Logger
	// IP is the iproute2 binary; zero means "ip" from PATH.
	IP string
}

// Namespace is a created network namespace. Methods are safe for
// concurrent use. Close it to remove it.
type Namespace struct {
	// Name is the namespace name, as accepted by `ip netns exec`.
	Name string
	// Bridge is the bridge device inside the namespace.
	Bridge string
	// Taps are the tap devices inside the namespace, attached to Bridge.
	Taps []string

	ip  string
	log *slog.Logger

	mu     sync.Mutex
	procs  map[int]*Process
	closed bool
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

func validName(s string, max int) error {
	if len(s) == 0 || len(s) > max || !nameRE.MatchString(s) {
		return fmt.Errorf("%w: %q (want 1..%d of [a-z0-9-])", ErrInvalidName, s, max)
	}
	return nil
}

// Create makes the namespace with loopback up, the bridge (with
// BridgeAddrs, up) and the taps (attached, up). On any error the partial
// namespace is deleted.
func Create(ctx context.Context, cfg Config) (*Namespace, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = "mlab"
	}
	if cfg.Bridge == "" {
		cfg.Bridge = "br0"
	}
	if cfg.IP == "" {
		cfg.IP = "ip"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := validName(cfg.Prefix, 16); err != nil {
		return nil, fmt.Errorf("netns: create: prefix: %w", err)
	}
	if err := validName(cfg.Bridge, 15); err != nil {
		return nil, fmt.Errorf("netns: create: bridge: %w", err)
	}
	if cfg.Taps < 0 || cfg.Taps > 64 {
		return nil, fmt.Errorf("netns: create: %d taps (want 0..64)", cfg.Taps)
	}
	var rnd [3]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, fmt.Errorf("netns: create: random suffix: %w", err)
	}
	n := &Namespace{
		Name:   cfg.Prefix + "-" + hex.EncodeToString(rnd[:]),
		Bridge: cfg.Bridge,
		ip:     cfg.IP,
		log:    cfg.Logger,
		procs:  map[int]*Process{},
	}
	if err := n.run(ctx, "netns", "add", n.Name); err != nil {
		return nil, fmt.Errorf("netns: create %s: %w", n.Name, err)
	}
	steps := [][]string{
		{"-n", n.Name, "link", "set", "lo", "up"},
		{"-n", n.Name, "link", "add", n.Bridge, "type", "bridge"},
	}
	for _, p := range cfg.BridgeAddrs {
		steps = append(steps, []string{"-n", n.Name, "addr", "add", p.String(), "dev", n.Bridge})
	}
	steps = append(steps, []string{"-n", n.Name, "link", "set", n.Bridge, "up"})
	for i := 0; i < cfg.Taps; i++ {
		tap := "tap" + strconv.Itoa(i)
		n.Taps = append(n.Taps, tap)
		steps = append(steps,
			[]string{"-n", n.Name, "tuntap", "add", "dev", tap, "mode", "tap"},
			[]string{"-n", n.Name, "link", "set", tap, "master", n.Bridge},
			[]string{"-n", n.Name, "link", "set", tap, "up"})
	}
	for _, s := range steps {
		if err := n.run(ctx, s...); err != nil {
			return nil, errors.Join(fmt.Errorf("netns: create %s: %w", n.Name, err), n.Close())
		}
	}
	n.log.Info("network namespace created", "netns", n.Name, "bridge", n.Bridge, "taps", len(n.Taps))
	return n, nil
}

func (n *Namespace) run(ctx context.Context, args ...string) error {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, n.ip, args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// Command returns an unstarted command that runs name with args inside the
// namespace (`ip netns exec NAME name args...`; ip execs the program, so
// the started process id is the program's own). Start it with n.Start so
// Close can stop it, or run it to completion yourself.
func (n *Namespace) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, n.ip, append([]string{"netns", "exec", n.Name, name}, args...)...)
}

// Process is a process started with [Namespace.Start]. The namespace owns
// the wait: do not call Cmd.Wait; use Done and Err.
type Process struct {
	Cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Pid is the process id.
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

// Done is closed when the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is the exit error (nil for exit status 0); valid after Done.
func (p *Process) Err() error {
	<-p.done
	return p.err
}

// Start starts cmd (from Command) and records its process id so Close
// stops it. The process enters the namespace when ip has run setns(2) and
// exec'd the program, shortly after Start returns: synchronise on what the
// program does (a socket it serves, a file it writes), not on the pid.
func (n *Namespace) Start(cmd *exec.Cmd) (*Process, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, fmt.Errorf("netns: start in %s: namespace closed", n.Name)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("netns: start in %s: %w", n.Name, err)
	}
	p := &Process{Cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	n.procs[cmd.Process.Pid] = p
	return p, nil
}

// Pids lists the processes currently in the namespace (`ip netns pids`),
// including ones not started through Start.
func (n *Namespace) Pids(ctx context.Context) ([]int, error) {
	out, err := exec.CommandContext(ctx, n.ip, "netns", "pids", n.Name).Output()
	if err != nil {
		return nil, fmt.Errorf("netns: pids %s: %w", n.Name, err)
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		p, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("netns: pids %s: bad pid %q", n.Name, f)
		}
		pids = append(pids, p)
	}
	return pids, nil
}

// Contains reports whether process pid is inside the namespace, by
// comparing /proc/PID/ns/net with the namespace's bind mount.
func (n *Namespace) Contains(pid int) (bool, error) {
	var a, b syscall.Stat_t
	if err := syscall.Stat(filepath.Join("/run/netns", n.Name), &a); err != nil {
		return false, fmt.Errorf("netns: stat %s: %w", n.Name, err)
	}
	if err := syscall.Stat(filepath.Join("/proc", strconv.Itoa(pid), "ns", "net"), &b); err != nil {
		return false, fmt.Errorf("netns: stat net ns of %d: %w", pid, err)
	}
	return a.Dev == b.Dev && a.Ino == b.Ino, nil
}

// StopGrace is how long Close waits after SIGTERM before SIGKILL.
const StopGrace = 3 * time.Second

// Close stops every process started with Start and every other process
// still inside the namespace (SIGTERM, then SIGKILL after StopGrace; by
// pid), then deletes the namespace, which removes the bridge and taps.
// Calling it again is a no-op.
func (n *Namespace) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	procs := n.procs
	n.procs = nil
	n.mu.Unlock()

	var errs []error
	for _, p := range procs {
		stopProcess(p)
	}
	// Anything else left inside (e.g. children that daemonized).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if pids, err := n.Pids(ctx); err == nil {
		for _, pid := range pids {
			stopPid(pid)
		}
	}
	if err := n.run(ctx, "netns", "del", n.Name); err != nil {
		errs = append(errs, fmt.Errorf("netns: delete %s: %w", n.Name, err))
	} else {
		n.log.Info("network namespace deleted", "netns", n.Name)
	}
	return errors.Join(errs...)
}

func stopProcess(p *Process) {
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(StopGrace)
	defer t.Stop()
	select {
	case <-p.done:
		return
	case <-t.C:
	}
	_ = p.Cmd.Process.Kill()
	<-p.done
}

// stopPid stops a process this package did not start as a child, by pid:
// SIGTERM, then SIGKILL if it has not exited after StopGrace. It waits on
// a pidfd (Linux 5.3+), so a recycled pid is never signalled.
func stopPid(pid int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // already gone
	}
	defer unix.Close(fd)
	if unix.PidfdSendSignal(fd, unix.SIGTERM, nil, 0) != nil {
		return
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if n, _ := unix.Poll(fds, int(StopGrace/time.Millisecond)); n > 0 {
		return
	}
	_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	_, _ = unix.Poll(fds, int(StopGrace/time.Millisecond))
}
