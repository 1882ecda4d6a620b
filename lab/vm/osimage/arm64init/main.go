//go:build linux

// Command arm64init is /init of the VM lab's minimal arm64 OS image
// (lab/vm/osimage/build-arm64.sh): the first boot of a deployed
// arm64 lab VM, in place of systemd and cloud-init, which a debootstrapped
// arm64 Debian would need qemu-user binfmt on the build machine to install.
//
// As PID 1 it mounts /proc, /sys, /dev, /run and /tmp, loads the kernel
// modules listed in /modules/order.txt (finit_module, in that order),
// brings up lo and eth0 with DHCPv4 (insomniacslk/dhcp's nclient4, RFC 2131),
// finds the NoCloud seed the Machina ramdisk wrote (a FAT partition of the
// disk with user-data and meta-data, label CIDATA), sets the hostname from
// meta-data's local-hostname, applies user-data's write_files (path,
// permissions, content) and runs its runcmd entries with busybox sh, as
// cloud-init does: so the controller's real first-boot join command runs
// (curl and openssl from Debian's arm64 packages fetch and pin the CA and
// the install script, which downloads the arm64 machina-node and joins).
// users and ssh_authorized_keys are logged and not applied: the image has
// no sshd.
//
// Invoked as systemctl (a symlink), it is the service manager's client for
// what machina-node install-unit runs: `daemon-reload` does nothing and
// `enable --now UNIT` marks the unit enabled under /run/arm64init; PID 1
// then starts the unit's ExecStart and restarts it 5 s after it exits
// (Restart=always, RestartSec=5s, what that unit says).
//
// Every line goes to the console prefixed "ARM64INIT:"; the lab reads the
// serial log.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"
)

const (
	enabledDir = "/run/arm64init/enabled"
	unitDir    = "/etc/systemd/system"
	// env is every child's environment: the Debian libraries are not in
	// an ld.so.cache (nothing ran ldconfig for arm64), so the loader gets
	// their folders.
	pathEnv = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	libEnv  = "LD_LIBRARY_PATH=/lib/aarch64-linux-gnu:/usr/lib/aarch64-linux-gnu"
)

var t0 = time.Now()

func logf(format string, a ...any) {
	fmt.Printf("ARM64INIT[%6.2fs]: %s\n", time.Since(t0).Seconds(), fmt.Sprintf(format, a...))
}

func main() {
	if filepath.Base(os.Args[0]) == "systemctl" {
		os.Exit(systemctl(os.Args[1:]))
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "arm64init: runs as PID 1 (the image's /init) or as systemctl")
		os.Exit(2)
	}
	if err := run(); err != nil {
		logf("FIRST BOOT FAILED: %v", err)
	} else {
		logf("FIRST BOOT DONE")
	}
	// PID 1 must not exit (the kernel panics); services run on.
	for {
		time.Sleep(time.Hour)
	}
}

func run() error {
	// exec.Command looks commands up in PID 1's own PATH, which the
	// kernel does not set.
	_ = os.Setenv("PATH", strings.TrimPrefix(pathEnv, "PATH="))
	for _, m := range []struct{ src, dir, typ string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"},
		{"tmpfs", "/run", "tmpfs"}, {"tmpfs", "/tmp", "tmpfs"},
	} {
		_ = os.MkdirAll(m.dir, 0o755)
		if err := unix.Mount(m.src, m.dir, m.typ, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.dir, err)
		}
	}
	_ = os.Chmod("/tmp", 0o1777)
	n, err := loadModules("/modules")
	if err != nil {
		return err
	}
	logf("loaded %d modules", n)
	go supervise()
	ip, err := network()
	if err != nil {
		return err
	}
	logf("eth0 up: %s", ip)
	seed, err := findSeed()
	if err != nil {
		return err
	}
	logf("NoCloud seed on %s", seed)
	return firstBoot("/run/seed")
}

func loadModules(dir string) (int, error) {
	order, err := os.ReadFile(filepath.Join(dir, "order.txt"))
	if err != nil {
		return 0, err
	}
	names := strings.Fields(string(order))
	for _, name := range names {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return 0, err
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return 0, fmt.Errorf("finit_module %s: %w", name, err)
		}
	}
	return len(names), nil
}

// network brings up lo and eth0 and leases an address with DHCPv4: the
// address with its mask and the router as the default route.
func network() (string, error) {
	if lo, err := netlink.LinkByName("lo"); err == nil {
		_ = netlink.LinkSetUp(lo)
	}
	var eth netlink.Link
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		if eth, err = netlink.LinkByName("eth0"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("eth0 did not appear within 30s: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := netlink.LinkSetUp(eth); err != nil {
		return "", fmt.Errorf("eth0 up: %w", err)
	}
	var lease *nclient4.Lease
	for attempt := 1; ; attempt++ {
		c, err := nclient4.New("eth0", nclient4.WithTimeout(3*time.Second), nclient4.WithRetry(3))
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			lease, err = c.Request(ctx)
			cancel()
			c.Close()
		}
		if err == nil {
			break
		}
		if attempt == 5 {
			return "", fmt.Errorf("dhcp eth0: %w", err)
		}
		logf("dhcp attempt %d: %v", attempt, err)
	}
	ack := lease.ACK
	mask := ack.SubnetMask()
	if mask == nil {
		mask = net.CIDRMask(24, 32)
	}
	addr := &net.IPNet{IP: ack.YourIPAddr, Mask: mask}
	if err := netlink.AddrAdd(eth, &netlink.Addr{IPNet: addr}); err != nil && !errors.Is(err, unix.EEXIST) {
		return "", fmt.Errorf("eth0 address %s: %w", addr, err)
	}
	if gw := ack.Router(); len(gw) > 0 {
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gw[0]}); err != nil && !errors.Is(err, unix.EEXIST) {
			logf("default route via %s: %v", gw[0], err)
		}
	}
	return addr.String(), nil
}

// findSeed mounts, read-only at /run/seed, the first partition of the
// disk that holds a FAT file system with user-data and meta-data.
func findSeed() (string, error) {
	const dir = "/run/seed"
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		parts, _ := filepath.Glob("/sys/class/block/vd*[0-9]")
		parts2, _ := filepath.Glob("/sys/class/block/sd*[0-9]")
		for _, p := range append(parts, parts2...) {
			dev := "/dev/" + filepath.Base(p)
			if err := unix.Mount(dev, dir, "vfat", unix.MS_RDONLY, ""); err != nil {
				continue
			}
			_, e1 := os.Stat(filepath.Join(dir, "user-data"))
			_, e2 := os.Stat(filepath.Join(dir, "meta-data"))
			if e1 == nil && e2 == nil {
				return dev, nil
			}
			_ = unix.Unmount(dir, 0)
		}
		if time.Now().After(deadline) {
			return "", errors.New("no NoCloud seed (FAT partition with user-data and meta-data) on any disk within 30s")
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// userData is the part of cloud-init's #cloud-config this image applies.
type userData struct {
	Users      []map[string]any `json:"users"`
	WriteFiles []struct {
		Path        string `json:"path"`
		Permissions string `json:"permissions"`
		Content     string `json:"content"`
	} `json:"write_files"`
	Runcmd []any `json:"runcmd"`
}

// metaData is the part of NoCloud's meta-data this image applies.
type metaData struct {
	InstanceID    string `json:"instance-id"`
	LocalHostname string `json:"local-hostname"`
}

// file is one write_files entry.
type file struct {
	Path string
	Mode os.FileMode
	Data []byte
}

// seed is what the first boot applies: the hostname, the files and the
// runcmd argv lists (a string entry is sh -c STRING, as cloud-init runs it).
type seed struct {
	meta   metaData
	users  int
	files  []file
	runcmd [][]string
}

// parseSeed reads NoCloud meta-data and #cloud-config user-data.
func parseSeed(md, ud []byte) (seed, error) {
	var s seed
	if err := yaml.Unmarshal(md, &s.meta); err != nil {
		return s, fmt.Errorf("meta-data: %w", err)
	}
	if !strings.HasPrefix(string(ud), "#cloud-config") {
		return s, errors.New("user-data is not #cloud-config")
	}
	var u userData
	if err := yaml.Unmarshal(ud, &u); err != nil {
		return s, fmt.Errorf("user-data: %w", err)
	}
	s.users = len(u.Users)
	for _, f := range u.WriteFiles {
		mode := os.FileMode(0o644)
		if f.Permissions != "" {
			m, err := strconv.ParseUint(f.Permissions, 8, 32)
			if err != nil || m > 0o7777 {
				return s, fmt.Errorf("write_files %s: permissions %q: want octal", f.Path, f.Permissions)
			}
			mode = os.FileMode(m)
		}
		if !filepath.IsAbs(f.Path) || strings.Contains(f.Path, "..") {
			return s, fmt.Errorf("write_files: path %q is not a clean absolute path", f.Path)
		}
		s.files = append(s.files, file{Path: f.Path, Mode: mode, Data: []byte(f.Content)})
	}
	for i, rc := range u.Runcmd {
		var argv []string
		switch v := rc.(type) {
		case string:
			argv = []string{"sh", "-c", v}
		case []any:
			for _, a := range v {
				argv = append(argv, fmt.Sprint(a))
			}
		}
		if len(argv) == 0 {
			return s, fmt.Errorf("runcmd %d: empty", i)
		}
		s.runcmd = append(s.runcmd, argv)
	}
	return s, nil
}

func firstBoot(dir string) error {
	md, err := os.ReadFile(filepath.Join(dir, "meta-data"))
	if err != nil {
		return err
	}
	ud, err := os.ReadFile(filepath.Join(dir, "user-data"))
	if err != nil {
		return err
	}
	s, err := parseSeed(md, ud)
	if err != nil {
		return err
	}
	meta := s.meta
	if meta.LocalHostname != "" {
		if err := unix.Sethostname([]byte(meta.LocalHostname)); err != nil {
			return fmt.Errorf("hostname %q: %w", meta.LocalHostname, err)
		}
		_ = os.WriteFile("/etc/hostname", []byte(meta.LocalHostname+"\n"), 0o644)
	}
	logf("instance %s, hostname %s", meta.InstanceID, meta.LocalHostname)
	logf("users: %d entries not applied (this image has no sshd)", s.users)
	for _, f := range s.files {
		if err := os.MkdirAll(filepath.Dir(f.Path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(f.Path, f.Data, f.Mode); err != nil {
			return err
		}
		_ = os.Chmod(f.Path, f.Mode)
		logf("write_files: %s (%d bytes, %04o)", f.Path, len(f.Data), f.Mode) // never the content
	}
	for i, argv := range s.runcmd {
		logf("runcmd %d: %s", i, argv[0])
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = []string{pathEnv, libEnv, "HOME=/root"}
		cmd.Dir = "/"
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
		start := time.Now()
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("runcmd %d: %w", i, err)
		}
		logf("runcmd %d done in %.1fs", i, time.Since(start).Seconds())
	}
	return nil
}

// systemctl is the client side: daemon-reload and enable [--now] UNIT.
func systemctl(args []string) int {
	if len(args) == 1 && args[0] == "daemon-reload" {
		return 0
	}
	var units []string
	if len(args) >= 2 && args[0] == "enable" {
		for _, a := range args[1:] {
			if a != "--now" {
				units = append(units, a)
			}
		}
	}
	if len(units) == 0 {
		fmt.Fprintf(os.Stderr, "systemctl (arm64init): only daemon-reload and enable [--now] UNIT..., got %q\n", args)
		return 2
	}
	if err := os.MkdirAll(enabledDir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "systemctl:", err)
		return 1
	}
	for _, u := range units {
		if strings.ContainsAny(u, "/\x00") {
			fmt.Fprintf(os.Stderr, "systemctl: bad unit name %q\n", u)
			return 1
		}
		if _, err := os.Stat(filepath.Join(unitDir, u)); err != nil {
			fmt.Fprintln(os.Stderr, "systemctl:", err)
			return 1
		}
		if err := os.WriteFile(filepath.Join(enabledDir, u), nil, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "systemctl:", err)
			return 1
		}
	}
	return 0
}

// supervise starts each unit marked enabled (polling every second) and
// restarts it 5 s after it exits.
func supervise() {
	started := map[string]bool{}
	for {
		ents, _ := os.ReadDir(enabledDir)
		for _, e := range ents {
			if started[e.Name()] {
				continue
			}
			argv, err := execStart(filepath.Join(unitDir, e.Name()))
			if err != nil {
				logf("unit %s: %v", e.Name(), err)
				started[e.Name()] = true
				continue
			}
			started[e.Name()] = true
			go func(name string, argv []string) {
				for {
					logf("starting %s: %s", name, argv[0])
					cmd := exec.Command(argv[0], argv[1:]...)
					cmd.Env = []string{pathEnv, libEnv, "HOME=/root"}
					cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
					err := cmd.Run()
					logf("%s exited: %v; restart in 5s", name, err)
					time.Sleep(5 * time.Second)
				}
			}(e.Name(), argv)
		}
		time.Sleep(time.Second)
	}
}

// execStart reads a systemd unit's ExecStart= (one line, no quoting: the
// unit machina-node install-unit writes has none).
func execStart(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "ExecStart="); ok {
			if f := strings.Fields(v); len(f) > 0 {
				return f, nil
			}
		}
	}
	return nil, errors.New("no ExecStart=")
}
