package vmpower

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/lab/vm/netns"
	"github.com/machina-metal/machina/lab/vm/qmp"
)

func needQEMU(t *testing.T) {
	t.Helper()
	peertest.Command(t, "qemu-system-x86_64")
}

func startVM(t *testing.T, cfg Config) *VM {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	if cfg.Name == "" {
		cfg.Name = "vm14"
	}
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	v, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := v.Reset(context.Background(), "ForceOff"); err != nil {
			t.Errorf("cleanup ForceOff: %v", err)
		}
	})
	return v
}

// waitSerial waits until the VM's serial log contains want.
func waitSerial(t *testing.T, v *VM, want string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for range tick.C {
		b, _ := os.ReadFile(filepath.Join(v.Config().Dir, SerialLog))
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("serial log has no %q after %v; tail:\n%s", want, d, tail(b, 1500))
		}
	}
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func mustState(t *testing.T, v *VM, want string) {
	t.Helper()
	got, err := v.PowerState(context.Background())
	if err != nil || got != want {
		t.Fatalf("PowerState = %q, %v; want %q", got, err, want)
	}
}

func TestPowerLifecycle(t *testing.T) {
	needQEMU(t)
	ctx := context.Background()
	v := startVM(t, Config{Paused: true, MemoryMiB: 128, CPUs: 1, GracefulTimeout: time.Second})
	mustState(t, v, "Off")
	if err := v.Reset(ctx, "ForceOff"); err != nil {
		t.Fatalf("ForceOff while off: %v", err)
	}
	if err := v.Reset(ctx, "On"); err != nil {
		t.Fatalf("On: %v", err)
	}
	mustState(t, v, "On")
	pid := v.Pid()
	if err := v.Reset(ctx, "ForceOn"); err != nil || v.Pid() != pid {
		t.Fatalf("ForceOn while on: err=%v pid %d -> %d, want no restart", err, pid, v.Pid())
	}
	c, err := v.QMP(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if st, err := c.QueryStatus(ctx); err != nil || st.Status != "prelaunch" {
		t.Fatalf("QueryStatus = %+v, %v; want prelaunch (-S)", st, err)
	}

	// Same boot device: ForceRestart is a system_reset of the same process.
	if err := v.Reset(ctx, "ForceRestart"); err != nil {
		t.Fatal(err)
	}
	if v.Pid() != pid {
		t.Fatalf("ForceRestart with unchanged boot device restarted qemu (pid %d -> %d)", pid, v.Pid())
	}
	waitEvent(t, c, "RESET")
	if err := v.Reset(ctx, "GracefulShutdown"); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, c, "POWERDOWN")
	if err := v.Reset(ctx, "Nmi"); err != nil {
		t.Fatalf("Nmi: %v", err)
	}

	// Changed boot device: ForceRestart restarts the process with the new order.
	if err := v.SetBootDevice(BootPXE, true); err != nil {
		t.Fatal(err)
	}
	if err := v.Reset(ctx, "ForceRestart"); err != nil {
		t.Fatal(err)
	}
	if v.Pid() == pid || v.Pid() == 0 {
		t.Fatalf("ForceRestart after boot change: pid %d -> %d, want a new process", pid, v.Pid())
	}
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("old QMP session still open after restart")
	}
	pid = v.Pid()
	if err := v.Reset(ctx, "PowerCycle"); err != nil {
		t.Fatal(err)
	}
	if v.Pid() == pid || v.Pid() == 0 {
		t.Fatalf("PowerCycle: pid %d -> %d, want a new process", pid, v.Pid())
	}
	// A paused guest ignores the ACPI button: GracefulRestart forces it off
	// after GracefulTimeout and starts a new process.
	pid = v.Pid()
	if err := v.Reset(ctx, "GracefulRestart"); err != nil {
		t.Fatal(err)
	}
	if v.Pid() == pid || v.Pid() == 0 {
		t.Fatalf("GracefulRestart: pid %d -> %d, want a new process", pid, v.Pid())
	}
	old := v.Pid()
	if err := v.Reset(ctx, "ForceOff"); err != nil {
		t.Fatal(err)
	}
	mustState(t, v, "Off")
	if alive(old) {
		t.Fatalf("qemu pid %d still alive after ForceOff", old)
	}
	if err := v.Reset(ctx, "PushPowerButton"); err != nil {
		t.Fatal(err)
	}
	mustState(t, v, "On")
	if err := v.Reset(ctx, "ForceOff"); err != nil {
		t.Fatal(err)
	}
	if err := v.Reset(ctx, "Warp"); !errors.Is(err, ErrUnsupportedReset) {
		t.Fatalf("Reset(Warp) = %v, want ErrUnsupportedReset", err)
	}
	if err := v.Reset(ctx, "ForceRestart"); !errors.Is(err, ErrPoweredOff) {
		t.Fatalf("ForceRestart while off = %v, want ErrPoweredOff", err)
	}

	// Another process (ipmi_sim's chassis_control) sees the same VM.
	w, err := Open(v.Config().Dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Reset(ctx, "On"); err != nil {
		t.Fatal(err)
	}
	mustState(t, v, "On")
	if dev, persistent := v.BootDevice(); dev != BootPXE || !persistent {
		t.Fatalf("BootDevice = %s,%v; want pxe persistent", dev, persistent)
	}
}

// alive reports whether pid exists and is not a zombie (a daemonized qemu
// is reaped by init, which may lag).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}

func waitEvent(t *testing.T, c *qmp.Client, name string) {
	t.Helper()
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-c.Events():
			if !ok {
				t.Fatalf("QMP closed while waiting for %s", name)
			}
			if ev.Name == name {
				return
			}
		case <-timer.C:
			t.Fatalf("no %s event within 30s", name)
		}
	}
}

func ipxeISO(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("dpkg", "-L", "ipxe").Output()
	if err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasSuffix(l, "/ipxe.iso") {
				return l
			}
		}
	}
	peertest.Missing(t, "ipxe.iso not found (dpkg -L ipxe)", "the Debian package ipxe")
	return ""
}

// TestBootFromVirtualMedia boots a disk-less BIOS VM from an ISO inserted
// while it is off (boot device cd, once), and checks the one-time override
// reverted to disk and that media can be swapped on the running VM.
func TestBootFromVirtualMedia(t *testing.T) {
	needQEMU(t)
	iso := ipxeISO(t)
	ctx := context.Background()
	v := startVM(t, Config{MemoryMiB: 256, CPUs: 1})
	if err := v.SetBootDevice(BootCD, false); err != nil {
		t.Fatal(err)
	}
	if err := v.InsertMedia(ctx, iso); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := v.Reset(ctx, "On"); err != nil {
		t.Fatal(err)
	}
	waitSerial(t, v, "Booting from DVD/CD", 60*time.Second)
	waitSerial(t, v, "iPXE", 60*time.Second)
	t.Logf("BIOS VM booted the inserted ISO to the iPXE banner in %v", time.Since(start).Round(10*time.Millisecond))
	if dev, persistent := v.BootDevice(); dev != BootDisk || !persistent {
		t.Fatalf("after a one-time cd boot BootDevice = %s,%v; want disk persistent", dev, persistent)
	}
	c, err := v.QMP(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := v.EjectMedia(ctx); err != nil {
		t.Fatal(err)
	}
	blocks, err := c.QueryBlock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(blocks, func(b qmp.BlockInfo) bool { return b.Device == "cd0" })
	if i < 0 || blocks[i].Inserted != nil {
		t.Fatalf("after EjectMedia query-block = %+v", blocks)
	}
	if err := v.InsertMedia(ctx, iso); err != nil {
		t.Fatal(err)
	}
	blocks, _ = c.QueryBlock(ctx)
	if blocks[i].Inserted == nil || blocks[i].Inserted.File != iso || !blocks[i].Inserted.RO {
		t.Fatalf("after live InsertMedia: %+v", blocks[i].Inserted)
	}
	for _, bad := range []string{"relative.iso", "/a,b.iso", "http://x/a b"} {
		if err := v.InsertMedia(ctx, bad); err == nil {
			t.Errorf("InsertMedia(%q) accepted", bad)
		}
	}
}

// TestPXEInNetns starts a BIOS VM inside a network namespace with its NIC
// on a tap of the lab bridge and boot device pxe: SeaBIOS must boot the
// NIC's iPXE ROM, which then sends DHCP on the bridge.
func TestPXEInNetns(t *testing.T) {
	needQEMU(t)
	peertest.Root(t, "a network namespace")
	ctx := context.Background()
	ns, err := netns.Create(ctx, netns.Config{Prefix: "m14", Taps: 1,
		BridgeAddrs: []netip.Prefix{netip.MustParsePrefix("10.99.141.1/24")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Close() })
	v := startVM(t, Config{Name: "pxe14", MemoryMiB: 256, CPUs: 1, Netns: ns.Name, BootDevice: BootPXE,
		NICs: []NIC{{Tap: ns.Taps[0], MAC: "52:54:00:14:00:01"}}})
	start := time.Now()
	if err := v.Reset(ctx, "On"); err != nil {
		t.Fatal(err)
	}
	if in, err := ns.Contains(v.Pid()); err != nil || !in {
		t.Fatalf("qemu pid %d in %s: %v, %v", v.Pid(), ns.Name, in, err)
	}
	waitSerial(t, v, "iPXE (PCI", 60*time.Second)
	waitSerial(t, v, "52:54:00:14:00:01", 60*time.Second)
	t.Logf("BIOS VM in netns reached iPXE on its NIC in %v", time.Since(start).Round(10*time.Millisecond))
	if err := v.Reset(ctx, "ForceOff"); err != nil {
		t.Fatal(err)
	}
}

// TestUEFIStart starts an OVMF VM with boot device cd and the iPXE ISO:
// OVMF must reach the EFI iPXE on the ISO.
func TestUEFIStart(t *testing.T) {
	needQEMU(t)
	iso := ipxeISO(t)
	peertest.File(t, "/usr/share/OVMF/OVMF_CODE_4M.fd", "ovmf")
	ctx := context.Background()
	v := startVM(t, Config{Name: "uefi14", Firmware: UEFI, MemoryMiB: 256, CPUs: 1, BootDevice: BootCD})
	if err := v.InsertMedia(ctx, iso); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := v.Reset(ctx, "On"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(v.Config().Dir, VarsFile)); err != nil {
		t.Fatalf("OVMF vars not copied: %v", err)
	}
	waitSerial(t, v, "iPXE", 120*time.Second)
	t.Logf("UEFI VM booted the ISO to iPXE in %v", time.Since(start).Round(10*time.Millisecond))
}

func TestConfigValidation(t *testing.T) {
	dir := t.TempDir()
	for name, c := range map[string]Config{
		"kvm":        {Name: "a", Dir: dir, Accel: "kvm"},
		"name":       {Name: "A B", Dir: dir},
		"dir":        {Name: "a", Dir: "rel"},
		"disk comma": {Name: "a", Dir: dir, Disk: "/x,y.img"},
		"mac":        {Name: "a", Dir: dir, NICs: []NIC{{Tap: "tap0", MAC: "zz"}}},
		"tap":        {Name: "a", Dir: dir, NICs: []NIC{{Tap: "tap0;rm", MAC: "52:54:00:00:00:01"}}},
		"boot":       {Name: "a", Dir: dir, BootDevice: "floppy"},
		"firmware":   {Name: "a", Dir: dir, Firmware: "coreboot"},
		"uuid":       {Name: "a", Dir: dir, UUID: "nope"},
		"nic opts":   {Name: "a", Dir: dir, NICs: []NIC{{Tap: "tap0", MAC: "52:54:00:00:00:01", Options: "csum=off -device x"}}},
	} {
		if _, err := New(c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: New = %v, want ErrInvalidConfig", name, err)
		}
	}
	v, err := New(Config{Name: "args", Dir: dir, Disk: "/images/os.qcow2", BootDevice: BootPXE,
		NICs: []NIC{{Tap: "tap0", MAC: "52:54:00:00:00:01"}, {Tap: "tap1", MAC: "52:54:00:00:00:02", Options: "csum=off"}}})
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Join(v.Args(), " ")
	for _, want := range []string{"-accel tcg", "format=qcow2", "virtio-net-pci,netdev=n0,mac=52:54:00:00:00:01,bootindex=1",
		"id=vdisk0,bootindex=2", "virtio-net-pci,netdev=n1,mac=52:54:00:00:00:02,csum=off", "id=cdrom0,bus=ide.1,bootindex=3", "-machine pc,graphics=off", "-daemonize"} {
		if !strings.Contains(args, want) {
			t.Errorf("Args() lacks %q:\n%s", want, args)
		}
	}
	if err := v.SetBootDevice("floppy", true); err == nil {
		t.Error("SetBootDevice(floppy) accepted")
	}
}

func TestSetBootOverride(t *testing.T) {
	v, err := New(Config{Name: "ovr", Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []struct {
		target, enabled string
		dev             BootDevice
		persistent      bool
	}{
		{"Pxe", "Once", BootPXE, false},
		{"Cd", "Continuous", BootCD, true},
		{"Hdd", "Once", BootDisk, false},
		{"Pxe", "Disabled", BootDisk, true},
	} {
		if err := v.SetBootOverride(ctx, c.target, c.enabled); err != nil {
			t.Fatal(err)
		}
		if dev, p := v.BootDevice(); dev != c.dev || p != c.persistent {
			t.Errorf("SetBootOverride(%s, %s): BootDevice = %s,%v; want %s,%v", c.target, c.enabled, dev, p, c.dev, c.persistent)
		}
	}
	for _, bad := range [][2]string{{"Floppy", "Once"}, {"Pxe", "Sometimes"}} {
		if err := v.SetBootOverride(ctx, bad[0], bad[1]); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("SetBootOverride(%v) = %v, want ErrInvalidConfig", bad, err)
		}
	}
}

// TestARM64Start: an arm64 VM (qemu-system-aarch64 virt, -cpu max, AAVMF
// pflash, its vars copied) starts under TCG and its firmware runs its boot
// manager on the serial console.
func TestARM64Start(t *testing.T) {
	peertest.Command(t, "qemu-system-aarch64")
	peertest.File(t, "/usr/share/AAVMF/AAVMF_CODE.fd", "qemu-efi-aarch64")
	v := startVM(t, Config{Name: "arm14", Firmware: UEFIARM64, MemoryMiB: 512, CPUs: 1})
	if got := v.Config().QEMU; got != "qemu-system-aarch64" {
		t.Fatalf("QEMU = %q, want qemu-system-aarch64 for uefi-arm64", got)
	}
	start := time.Now()
	if err := v.Reset(context.Background(), "On"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(v.Config().Dir, VarsFile)); err != nil {
		t.Fatalf("AAVMF vars not copied: %v", err)
	}
	waitSerial(t, v, "BdsDxe", 180*time.Second)
	t.Logf("arm64 VM reached AAVMF's boot manager in %v", time.Since(start).Round(10*time.Millisecond))
}

// TestNetworkFirst: with Config.NetworkFirst a boot device set through the
// BMC is stored and reads back, but the qemu boot order keeps the NIC first
// (the server whose BMC ignores the override), and the effective device is
// PXE; the Config survives Open (the chassis_control program's view).
func TestNetworkFirst(t *testing.T) {
	dir := t.TempDir()
	v, err := New(Config{Name: "nf", Dir: dir, Disk: "/images/os.qcow2", NetworkFirst: true,
		NICs: []NIC{{Tap: "tap0", MAC: "52:54:00:00:00:01"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.SetBootOverride(context.Background(), "Hdd", "Continuous"); err != nil {
		t.Fatal(err)
	}
	if dev, p := v.BootDevice(); dev != BootDisk || !p {
		t.Errorf("BootDevice = %s,%v; want the stored disk,true", dev, p)
	}
	if d := v.EffectiveBootDevice(); d != BootPXE {
		t.Errorf("EffectiveBootDevice = %s, want pxe", d)
	}
	args := strings.Join(v.Args(), " ")
	for _, want := range []string{"mac=52:54:00:00:00:01,bootindex=1", "id=vdisk0,bootindex=2"} {
		if !strings.Contains(args, want) {
			t.Errorf("Args() lacks %q:\n%s", want, args)
		}
	}
	o, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := o.EffectiveBootDevice(); d != BootPXE {
		t.Errorf("opened VM: EffectiveBootDevice = %s, want pxe", d)
	}
}

// TestSetExtraArgs: a changed device list is in the next start's command
// line and in vm.json (what Open in another process reads), as a drive
// pulled from a powered-off server.
func TestSetExtraArgs(t *testing.T) {
	dir := t.TempDir()
	v, err := New(Config{Name: "extra", Dir: dir, ExtraArgs: []string{"-device", "nvme,drive=a", "-device", "virtio-blk-pci,drive=b"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.SetExtraArgs([]string{"-device", "nvme,drive=a"}); err != nil {
		t.Fatal(err)
	}
	args := strings.Join(v.Args(), " ")
	if !strings.HasSuffix(args, "-device nvme,drive=a") || strings.Contains(args, "drive=b") {
		t.Errorf("Args() after SetExtraArgs: %s", args)
	}
	w, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(w.Config().ExtraArgs, " "); got != "-device nvme,drive=a" {
		t.Errorf("vm.json extra args %q", got)
	}
}
