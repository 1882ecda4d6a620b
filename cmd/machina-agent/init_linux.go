package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/ramdisk/agent"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// finalAction is what finish does; set by run once the command line is read.
var finalAction = "wait"

func run(ctx context.Context, out io.Writer) error {
	t0 := time.Now()
	if os.Getpid() == 1 {
		if err := mountAll(); err != nil {
			return err
		}
		out = os.Stdout
	}
	log := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelInfo})).With("agent", "machina")
	raw, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return fmt.Errorf("read cmdline: %w", err)
	}
	cfg, err := parseCmdline(string(raw))
	if err != nil {
		return err
	}
	finalAction = cfg.Final
	log.Info("machina-agent starting", "version", version, "mode", cfg.Mode, "url", cfg.URL, "mac", cfg.MAC.String(), "uptime", uptimeString())
	if n, err := loadModules("/modules", log); err != nil {
		log.Warn("module loading incomplete", "loaded", n, "err", err)
	} else {
		log.Info("modules loaded", "count", n, "seconds", time.Since(t0).Seconds())
	}
	waitEntropy(cfg.EntropyWait, log)
	mac, err := networkUp(ctx, cfg, log)
	if err != nil {
		return err
	}
	// Bound the whole session so a stalled controller cannot hold the
	// machine forever; each request is bounded again inside the Runner.
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	r := &agent.Runner{
		Client:   &v1.AgentClient{BaseURL: cfg.URL, HTTP: agentHTTP()},
		Token:    cfg.Token,
		BootMAC:  mac,
		LLDPWait: cfg.LLDPWait,
		Version:  version,
		Logger:   log,
		// md, dm, ext4 and xfs load only for a deploy with a layout.
		Storage: agent.StorageTools{Prepare: func() {
			n, err := loadModules("/modules/storage", log)
			log.Info("storage modules loaded", "count", n, "err", err)
		}},
	}
	if r.TPM = openTPM(log); r.TPM != nil {
		defer r.TPM.Close()
	}
	return runMode(ctx, r, cfg.Mode, log)
}

// networkUp waits for the boot NIC's link, leases an address by DHCP and
// returns the boot MAC the agent reports (the command line's, else the
// NIC's own).
func networkUp(ctx context.Context, cfg bootConfig, log *slog.Logger) (string, error) {
	ifname, err := waitLink(ctx, cfg.MAC, 30*time.Second)
	if err != nil {
		return "", err
	}
	ip, err := dhcp(ctx, ifname, log)
	if err != nil {
		return "", err
	}
	log.Info("network up", "iface", ifname, "ip", ip, "uptime", uptimeString())
	mac := cfg.MAC.String()
	if mac == "" {
		if l, err := net.InterfaceByName(ifname); err == nil {
			mac = l.HardwareAddr.String()
		}
	}
	return mac, nil
}

// runMode runs the session the command line asked for: deploy (serving
// image pieces to the wave's peers meanwhile), wipe, or commission.
func runMode(ctx context.Context, r *agent.Runner, mode string, log *slog.Logger) error {
	switch mode {
	case "deploy":
		stopPieces := servePieces(r, log)
		res, err := r.Deploy(ctx)
		stopPieces()
		if err != nil {
			return err
		}
		log.Info("DEPLOY OK", "disk", res.Disk, "bytes", res.BytesWritten, "mode", res.Mode, "seconds", res.Duration.Seconds())
	case "wipe":
		res, err := r.Wipe(ctx)
		if err != nil {
			return err
		}
		log.Info("WIPE OK", "disks", strings.Join(res.Disks, ","), "seconds", res.Duration.Seconds())
	default:
		ack, err := r.Commission(ctx)
		if err != nil {
			return err
		}
		log.Info("COMMISSION DONE", "lifecycle", ack.Lifecycle, "reason", ack.Reason, "uptime", uptimeString())
	}
	return nil
}

func uptimeString() string {
	b, _ := os.ReadFile("/proc/uptime")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0] + "s"
}

// mountAll mounts proc, sysfs and devtmpfs (DEVTMPFS_MOUNT is off in
// Debian's kernel) and points stdin/stdout/stderr at /dev/console.
func mountAll() error {
	for _, m := range []struct{ src, dst, typ string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"}, {"tmpfs", "/tmp", "tmpfs"},
	} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
		if err := unix.Mount(m.src, m.dst, m.typ, unix.MS_NOSUID, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	if fd, err := unix.Open("/dev/console", unix.O_RDWR, 0); err == nil {
		for i := 0; i <= 2; i++ {
			_ = unix.Dup2(fd, i)
		}
		if fd > 2 {
			unix.Close(fd)
		}
	}
	return nil
}

// loadModules loads the modules named in dir/order.txt (one file name per
// line, in `modprobe --show-depends` order) with finit_module(2). EEXIST
// (built in or already loaded) is fine; other failures are collected and
// loading continues, since a driver without its hardware may refuse.
func loadModules(dir string, log *slog.Logger) (int, error) {
	order, err := os.ReadFile(filepath.Join(dir, "order.txt"))
	if err != nil {
		return 0, fmt.Errorf("load modules: %w", err)
	}
	n := 0
	var errs []error
	for _, name := range strings.Fields(string(order)) {
		if strings.Contains(name, "/") {
			errs = append(errs, fmt.Errorf("module %q: bad name", name))
			continue
		}
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		switch {
		case err == nil:
			n++
		case errors.Is(err, unix.EEXIST):
		default:
			log.Debug("module not loaded", "module", name, "err", err)
			errs = append(errs, fmt.Errorf("finit_module %s: %w", name, err))
		}
	}
	return n, errors.Join(errs...)
}

// waitEntropy waits at most d for the kernel CRNG (getrandom without
// GRND_NONBLOCK would block until then). virtio-rng, loaded above, feeds it
// quickly in VMs. If it is still not ready, the agent says so on the console
// and makes the DHCP client take its transaction IDs from /dev/urandom
// (u-root's UROOT_NOHWRNG switch) instead of blocking for up to 2 minutes.
func waitEntropy(d time.Duration, log *slog.Logger) {
	var b [1]byte
	deadline := time.Now().Add(d)
	warned := false
	for {
		if _, err := unix.Getrandom(b[:], unix.GRND_NONBLOCK); err == nil {
			if warned {
				log.Info("kernel CRNG ready")
			}
			return
		}
		if time.Now().After(deadline) {
			log.Warn("kernel CRNG still not initialised; continuing without blocking (DHCP xids from /dev/urandom). Add a virtio-rng device or enable RDRAND", "waited", d.String())
			os.Setenv("UROOT_NOHWRNG", "1")
			return
		}
		if !warned {
			log.Info("waiting for kernel CRNG", "bound", d.String())
			warned = true
		}
		time.Sleep(100 * time.Millisecond) // polling a kernel state without an event source
	}
}

// waitLink waits up to d for the NIC with the given MAC (or, with no MAC,
// the first non-loopback NIC backed by a device) and brings it up.
func waitLink(ctx context.Context, mac net.HardwareAddr, d time.Duration) (string, error) {
	deadline := time.Now().Add(d)
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		_ = netlink.LinkSetUp(lo)
	}
	for {
		links, _ := netlink.LinkList()
		for _, l := range links {
			a := l.Attrs()
			if a.Name == "lo" || len(a.HardwareAddr) != 6 {
				continue
			}
			if mac != nil && a.HardwareAddr.String() != mac.String() {
				continue
			}
			if _, err := os.Stat("/sys/class/net/" + a.Name + "/device"); mac == nil && err != nil {
				continue
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return "", fmt.Errorf("link %s up: %w", a.Name, err)
			}
			return a.Name, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("boot NIC %v did not appear within %v", mac, d)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// dhcp runs DHCPv4 (RFC 2131 DISCOVER/OFFER/REQUEST/ACK) on ifname with
// insomniacslk/dhcp's nclient4, configures the leased address and the
// default route (option 3) and returns the address.
func dhcp(ctx context.Context, ifname string, log *slog.Logger) (net.IP, error) {
	c, err := nclient4.New(ifname, nclient4.WithTimeout(2*time.Second), nclient4.WithRetry(4))
	if err != nil {
		return nil, fmt.Errorf("dhcp %s: %w", ifname, err)
	}
	defer c.Close()
	var lease *nclient4.Lease
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 15*time.Second)
		lease, err = c.Request(actx)
		cancel()
		if err == nil {
			break
		}
		if attempt == 4 {
			return nil, fmt.Errorf("dhcp %s: %w", ifname, err)
		}
		log.Warn("dhcp attempt failed", "attempt", attempt, "err", err)
	}
	ack := lease.ACK
	mask := ack.SubnetMask()
	if mask == nil {
		mask = net.CIDRMask(24, 32)
	}
	link, err := netlink.LinkByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("dhcp %s: %w", ifname, err)
	}
	if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: ack.YourIPAddr, Mask: mask}}); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("dhcp %s: add address: %w", ifname, err)
	}
	if r := ack.Router(); len(r) > 0 {
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: r[0]}); err != nil && !errors.Is(err, unix.EEXIST) {
			log.Warn("default route not set", "gw", r[0], "err", err)
		}
	}
	return ack.YourIPAddr, nil
}

// finish ends PID 1 as asked on the command line: flush disks, then power
// off, reboot, or wait forever (so the console keeps the last messages).
func finish(err error) {
	unix.Sync()
	action := finalAction
	if err != nil && action == "reboot" {
		action = "wait" // keep the failure on the console; the controller times out
	}
	fmt.Fprintln(os.Stdout, "machina-agent: final action", action)
	switch action {
	case "poweroff":
		_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	case "reboot":
		_ = unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	}
	// Wait on a timer, not `select {}`: when this goroutine is the last one
	// (an early failure, before any other started), the Go runtime reports
	// "all goroutines are asleep - deadlock!", PID 1 exits and the kernel
	// panics, scrolling the failure off the console (seen on the arm64
	// ramdisk with a bad machina.timeout).
	for {
		time.Sleep(time.Hour)
	}
}

// openTPM mounts securityfs (the firmware's event log) and opens the TPM
// 2.0 at /dev/tpmrm0 for attestation; nil when the machine has none or it
// is not usable: the agent goes on without, which the controller accepts
// where the server's policy allows it.
func openTPM(log *slog.Logger) *agent.TPM {
	_ = syscall.Mount("securityfs", "/sys/kernel/security", "securityfs", 0, "")
	tpm, err := agent.OpenTPM(nil)
	if err != nil {
		log.Warn("TPM not usable; going on without attestation", "err", err)
		return nil
	}
	if tpm != nil {
		fp, _ := tpm.EKFingerprint()
		log.Info("TPM 2.0 found", "ek", fp)
	}
	return tpm
}

// agentHTTP is the controller client's HTTP client: bounded dials and
// response headers.
func agentHTTP() *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ResponseHeaderTimeout: 60 * time.Second,
		IdleConnTimeout:       90 * time.Second,
	}}
}
