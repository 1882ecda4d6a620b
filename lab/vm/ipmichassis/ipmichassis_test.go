package ipmichassis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/lab/vm/qmp"
	"github.com/machina-metal/machina/lab/vm/vmpower"
)

// helperEnv makes the test binary act as the chassis_control program when
// ipmi_sim runs it, so the test needs no separate build step.
const helperEnv = "MACHINA_TEST_CHASSIS_CONTROL"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		// argv: <test binary> VMDIR get|set ...
		if len(os.Args) < 4 {
			fmt.Fprintln(os.Stderr, "usage: VMDIR get|set ...")
			os.Exit(1)
		}
		vm, err := vmpower.Open(os.Args[1], nil)
		if err == nil {
			err = Run(context.Background(), vm, os.Args[2:], os.Stdout)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func need(t *testing.T, bins ...string) {
	t.Helper()
	peertest.Commands(t, bins...)
}

func TestRunProtocol(t *testing.T) {
	need(t, "qemu-system-x86_64")
	ctx := context.Background()
	vm, err := vmpower.New(vmpower.Config{Name: "chassis14", Dir: t.TempDir(), Paused: true, MemoryMiB: 128, CPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = vm.Reset(context.Background(), "ForceOff") })
	get := func(params ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := Run(ctx, vm, append([]string{"get"}, params...), &out); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	set := func(args ...string) error { return Run(ctx, vm, append([]string{"set"}, args...), &bytes.Buffer{}) }
	if got := get("power", "boot"); got != "power:0\nboot:default\n" {
		t.Fatalf("get power boot = %q", got)
	}
	for _, c := range []struct{ val, want string }{{"pxe", "pxe"}, {"cdrom", "cdrom"}, {"none", "default"}, {"default", "default"}} {
		if err := set("boot", c.val); err != nil {
			t.Fatal(err)
		}
		if got := get("boot"); got != "boot:"+c.want+"\n" {
			t.Fatalf("after set boot %s: %q", c.val, got)
		}
	}
	if err := set("reset", "1"); err != nil {
		t.Fatalf("reset while off: %v", err)
	}
	if err := set("power", "1"); err != nil {
		t.Fatal(err)
	}
	if got := get("power"); got != "power:1\n" {
		t.Fatalf("after power on: %q", got)
	}
	if err := set("identify", "15", "0"); err != nil {
		t.Fatal(err)
	}
	if err := set("power", "0"); err != nil {
		t.Fatal(err)
	}
	if got := get("power"); got != "power:0\n" {
		t.Fatalf("after power off: %q", got)
	}
	for _, bad := range [][]string{{"get", "temperature"}, {"set", "boot", "floppy"}, {"set", "power", "2"}, {"set", "power"}, {"frob", "x"}, {"get"}, {"set", "boot", "bios"}} {
		if err := Run(ctx, vm, bad, &bytes.Buffer{}); !errors.Is(err, ErrUsage) {
			t.Errorf("Run(%q) = %v, want ErrUsage", bad, err)
		}
	}
}

func TestLanConfValidation(t *testing.T) {
	ok := LanConfig{Name: "bmc1", Addr: netip.MustParseAddrPort("127.0.0.1:16230"), User: "admin", Password: "pw",
		Program: "/usr/local/bin/lab-chassis-control", VMDir: "/tmp/vm1"}
	b, err := LanConf(ok)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"addr 127.0.0.1 16230", `chassis_control "/usr/local/bin/lab-chassis-control /tmp/vm1"`, `user 2 true "admin" "pw" admin 10 md5`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("lan.conf lacks %q:\n%s", want, b)
		}
	}
	for name, mut := range map[string]func(*LanConfig){
		"shell in dir":   func(c *LanConfig) { c.VMDir = "/tmp/vm1;reboot" },
		"space in prog":  func(c *LanConfig) { c.Program = "/bin/x y" },
		"quote in pw":    func(c *LanConfig) { c.Password = `a"b` },
		"relative prog":  func(c *LanConfig) { c.Program = "lab-chassis-control" },
		"no port":        func(c *LanConfig) { c.Addr = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), 0) },
		"bad name":       func(c *LanConfig) { c.Name = "a b" },
		"backtick arg":   func(c *LanConfig) { c.ProgramArgs = []string{"`id`"} },
		"long password":  func(c *LanConfig) { c.Password = strings.Repeat("x", 17) },
		"empty username": func(c *LanConfig) { c.User = "" },
	} {
		c := ok
		mut(&c)
		if _, err := LanConf(c); err == nil {
			t.Errorf("%s: LanConf accepted", name)
		}
	}
}

// freeUDPPort returns a UDP port that was free on 127.0.0.1 a moment ago
// (ipmi_sim binds with SO_REUSEADDR and would not report a clash,
// LAB-NOTES §3.1, so each simulator gets its own port).
func freeUDPPort(t *testing.T) uint16 {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return uint16(c.LocalAddr().(*net.UDPAddr).Port)
}

// TestIPMISimDrivesQEMU runs the real ipmi_sim with the generated config and
// this test binary as chassis_control, and drives a real qemu VM through
// ipmitool: power status/on/reset/soft/off and bootdev.
func TestIPMISimDrivesQEMU(t *testing.T) {
	need(t, "ipmi_sim", "ipmitool", "qemu-system-x86_64")
	dir := t.TempDir()
	vmDir := filepath.Join(dir, "vm")
	vm, err := vmpower.New(vmpower.Config{Name: "ipmi14", Dir: vmDir, MemoryMiB: 128, CPUs: 1,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = vm.Reset(context.Background(), "ForceOff") })
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freeUDPPort(t))
	const user, password = "admin", "lab14-secret"
	lan, err := LanConf(LanConfig{Name: "labbmc14", Addr: addr, User: user, Password: password, Program: self, VMDir: vmDir})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "lan.conf"), lan, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bmc.emu"), EmuConf(), 0o600); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(dir, "state")
	if err := os.Mkdir(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	sim := exec.Command("ipmi_sim", "-c", filepath.Join(dir, "lan.conf"), "-f", filepath.Join(dir, "bmc.emu"), "-s", stateDir, "-n")
	// The race detector sleeps 1 s at exit by default; ipmi_sim needs the
	// chassis_control answer well within ~1 s (LAB-NOTES §3.1).
	sim.Env = append(os.Environ(), helperEnv+"=1", "GORACE=atexit_sleep_ms=0")
	var simLog bytes.Buffer
	sim.Stdout, sim.Stderr = &simLog, &simLog
	if err := sim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sim.Process.Kill()
		_ = sim.Wait()
		if t.Failed() {
			t.Logf("ipmi_sim output:\n%s", simLog.String())
		}
	})

	ipmitool := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		// -E: the password comes from IPMI_PASSWORD, never argv.
		full := append([]string{"-I", "lanplus", "-C", "3", "-H", addr.Addr().String(), "-p", fmt.Sprint(addr.Port()), "-U", user, "-E"}, args...)
		cmd := exec.CommandContext(ctx, "ipmitool", full...)
		cmd.Env = append(os.Environ(), "IPMI_PASSWORD="+password)
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	mustIPMI := func(want string, args ...string) {
		t.Helper()
		start := time.Now()
		out, err := ipmitool(args...)
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("ipmitool %v = %q, %v; want %q", args, out, err, want)
		}
		t.Logf("ipmitool %s: %q in %v", strings.Join(args, " "), out, time.Since(start).Round(time.Millisecond))
	}
	// ipmi_sim has no readiness signal: retry the first request until it answers.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if out, err := ipmitool("chassis", "power", "status"); err == nil && strings.Contains(out, "Chassis Power is off") {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("ipmi_sim not answering: %q %v", out, err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	mustIPMI("Set Boot Device to pxe", "chassis", "bootdev", "pxe")
	if dev, _ := vm.BootDevice(); dev != vmpower.BootPXE {
		t.Fatalf("after ipmitool bootdev pxe: BootDevice = %s", dev)
	}
	mustIPMI("Up/On", "chassis", "power", "on")
	pid := vm.Pid()
	if pid == 0 {
		t.Fatal("no qemu after power on")
	}
	// Boot order pxe, disk, cd: this NIC-less, disk-less VM's CD-ROM is third.
	if args := strings.Join(vmArgs(t, pid), " "); !strings.Contains(args, "id=cdrom0,bus=ide.1,bootindex=3") {
		t.Fatalf("qemu started with boot order other than pxe first: %s", args)
	}
	mustIPMI("Chassis Power is on", "chassis", "power", "status")

	c, err := vm.QMP(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mustIPMI("Reset", "chassis", "power", "reset")
	waitEvent(t, c, "RESET")
	if vm.Pid() != pid {
		t.Fatalf("IPMI reset with unchanged boot device restarted qemu")
	}
	mustIPMI("Soft", "chassis", "power", "soft")
	waitEvent(t, c, "POWERDOWN")
	mustIPMI("Down/Off", "chassis", "power", "off")
	if vm.Pid() != 0 {
		t.Fatal("qemu still running after IPMI power off")
	}
	mustIPMI("Chassis Power is off", "chassis", "power", "status")
	mustIPMI("Set Boot Device to disk", "chassis", "bootdev", "disk")
	if dev, _ := vm.BootDevice(); dev != vmpower.BootDisk {
		t.Fatalf("after ipmitool bootdev disk: BootDevice = %s", dev)
	}

	// Power cycle: ipmi_sim runs `set power 0`, then `set power 1` from its
	// own 1 s timer, so the new qemu (booting disk first) appears later.
	mustIPMI("Up/On", "chassis", "power", "on")
	before := vm.Pid()
	mustIPMI("Cycle", "chassis", "power", "cycle")
	deadline = time.Now().Add(20 * time.Second)
	for p := vm.Pid(); p == 0 || p == before; p = vm.Pid() {
		if time.Now().After(deadline) {
			t.Fatalf("no new qemu within 20s of power cycle (pid before %d, now %d)", before, p)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if args := strings.Join(vmArgs(t, vm.Pid()), " "); !strings.Contains(args, "id=cdrom0,bus=ide.1,bootindex=2") {
		t.Fatalf("after bootdev disk + cycle, boot order is not disk first: %s", args)
	}
	mustIPMI("Down/Off", "chassis", "power", "off")
}

func vmArgs(t *testing.T, pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(string(b), "\x00")
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
