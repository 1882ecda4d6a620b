// Package bmcproc runs a test BMC on pyghmi's pyghmi.ipmi.bmc.Bmc class
// (Debian python3-pyghmi), the class VirtualBMC builds on: a third-party
// IPMI v2.0 / RMCP+ peer for the bmc/ipmi driver's tests.
//
// It behaves as pyghmi and VirtualBMC do: Set System Boot Options
// parameter 5 keeps only the device selector (the persistent and EFI bits
// read back cleared, flags byte 0x80), and every Open Session Request is
// answered with cipher suite 3's algorithms (RAKP-HMAC-SHA1, HMAC-SHA1-96,
// AES-CBC-128) whatever suite was asked for. With ApplyAtPowerOn a new boot
// device reads back stale while the machine runs and takes effect only at
// the next power-on from off, not at a reset, as VirtualBMC over libvirt
// (it defines the inactive domain and reads the running one).
//
// Power is pluggable (Config.Power): a state file for unit tests, or an
// ipmi_sim chassis_control program for a real qemu VM. The VM lab uses the
// latter with its own lab-chassis-control (lab/vm/ipmichassis over
// lab/vm/vmpower), the program its ipmi_sim BMC runs: the Python BMC
// shells out to it for power status, on (qemu started with the boot
// device as its boot order), off (QMP quit), reset (QMP system_reset),
// soft off (QMP system_powerdown) and the boot device, so the lab has one
// QMP client and one boot-order implementation, in Go, and this script
// none. A short-lived process per IPMI command is what ipmi_sim does too
// and keeps no connection to go stale across qemu restarts.
//
// The script is pyghmibmc.py beside this file, embedded. Test helper: no
// product package imports it. It does not import testing, so the VM lab's
// binary (cmd/lab) may link it; internal/pyghmibmc adds the test
// helpers (Start, Require) and aliases its names.
package bmcproc

import (
	"bufio"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

//go:embed pyghmibmc.py
var script []byte

// Python is Debian's interpreter, the one python3-pyghmi installs into
// (a python3 earlier in PATH, e.g. pyenv's, lacks the module).
const Python = "/usr/bin/python3"

// Module is a file of python3-pyghmi the BMC class lives in.
const Module = "/usr/lib/python3/dist-packages/pyghmi/ipmi/bmc.py"

// Config configures Launch. Zero values are usable.
type Config struct {
	// Dir holds the script, the power file and the boot log; required.
	Dir string
	// Address is the IPv4 address to bind; "" means 127.0.0.1.
	Address string
	// Port is the UDP port; 0 picks a free one (in the caller's network
	// namespace: give a fixed one with Netns).
	Port int
	// Netns runs the script inside this network namespace (ip netns
	// exec), as the VM lab's BMCs run beside its controller; "" means the
	// caller's.
	Netns string
	// User and Password are the one IPMI user; "" means admin/password.
	// The password reaches the script on its standard input, never argv.
	User, Password string
	// Power is the power backend: "file:PATH", or "chassis:COMMAND" with
	// COMMAND an ipmi_sim chassis_control program and its first
	// arguments, split at spaces (lab/vm/ipmichassis's protocol: `get
	// power`, `set power 1|0`, `set reset 1`, `set shutdown 1`, `set boot
	// pxe|default|cdrom`); "" means a file Dir/power starting "off".
	Power string
	// ApplyAtPowerOn makes a boot device set while the machine runs read
	// back stale and take effect at the next power-on (VirtualBMC over
	// libvirt): the chassis backend is handed the device just before each
	// power-on from off, not when it is set, so a reset keeps the old one.
	ApplyAtPowerOn bool
	// StartTimeout bounds the wait for the script to bind; zero means 20s.
	StartTimeout time.Duration
}

// BMC is one running test BMC.
type BMC struct {
	// Port is its UDP port on 127.0.0.1.
	Port int
	// Dir is Config.Dir.
	Dir string
	cfg Config
	cmd *exec.Cmd
}

// Launch writes the script into cfg.Dir and starts it, returning once it
// has bound its port. Stop ends it by its PID.
func Launch(cfg Config) (*BMC, error) {
	if cfg.Dir == "" {
		return nil, errors.New("pyghmibmc: Dir is empty")
	}
	if cfg.Address == "" {
		cfg.Address = "127.0.0.1"
	}
	if cfg.User == "" {
		cfg.User, cfg.Password = "admin", "password"
	}
	if cfg.Power == "" {
		pf := filepath.Join(cfg.Dir, "power")
		if err := os.WriteFile(pf, []byte("off\n"), 0o644); err != nil {
			return nil, fmt.Errorf("pyghmibmc: %w", err)
		}
		cfg.Power = "file:" + pf
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 20 * time.Second
	}
	sp := filepath.Join(cfg.Dir, "pyghmibmc.py")
	if err := os.WriteFile(sp, script, 0o644); err != nil {
		return nil, fmt.Errorf("pyghmibmc: %w", err)
	}
	b := &BMC{Port: cfg.Port, Dir: cfg.Dir, cfg: cfg}
	var err error
	for range 3 { // a free port taken by another process before the bind: another
		if cfg.Port == 0 {
			if b.Port, err = freeUDPPort(); err != nil {
				return nil, err
			}
		}
		if err = b.launch(sp); err == nil {
			return b, nil
		}
	}
	return nil, err
}

func (b *BMC) launch(sp string) error {
	args := []string{sp, "--address", b.cfg.Address, "--port", strconv.Itoa(b.Port), "--user", b.cfg.User, "--power", b.cfg.Power,
		"--boots", filepath.Join(b.Dir, "boots.log")}
	if b.cfg.ApplyAtPowerOn {
		args = append(args, "--apply-at-power-on")
	}
	name := Python
	if b.cfg.Netns != "" {
		// ip netns exec execs the interpreter: the pid Stop kills is its.
		name, args = "ip", append([]string{"netns", "exec", b.cfg.Netns, Python}, args...)
	}
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(b.cfg.Password + "\n")
	logf, err := os.OpenFile(filepath.Join(b.Dir, "bmc.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pyghmibmc: %w", err)
	}
	defer logf.Close()
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("pyghmibmc: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pyghmibmc: start %s: %w", Python, err)
	}
	b.cmd = cmd
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(out)
		if s.Scan() {
			line <- s.Text()
		}
		close(line)
		for s.Scan() { // drain: the script prints nothing more
		}
	}()
	timer := time.NewTimer(b.cfg.StartTimeout)
	defer timer.Stop()
	select {
	case l, ok := <-line:
		if ok && l == "listening "+strconv.Itoa(b.Port) {
			return nil
		}
		b.Stop()
		log, _ := os.ReadFile(filepath.Join(b.Dir, "bmc.log"))
		return fmt.Errorf("pyghmibmc: on port %d: first line %q, want \"listening %d\"\n%s", b.Port, l, b.Port, log)
	case <-timer.C:
		b.Stop()
		return fmt.Errorf("pyghmibmc: on port %d: not bound within %s", b.Port, b.cfg.StartTimeout)
	}
}

// Stop ends the script by its own PID. Safe to call twice.
func (b *BMC) Stop() {
	if b.cmd == nil {
		return
	}
	_ = b.cmd.Process.Kill()
	_ = b.cmd.Wait()
	b.cmd = nil
}

// Addr is "address:port", the address the ipmi driver takes.
func (b *BMC) Addr() string { return net.JoinHostPort(b.cfg.Address, strconv.Itoa(b.Port)) }

// PowerFile is the file backend's state file, "" for another backend.
func (b *BMC) PowerFile() string {
	if p, ok := strings.CutPrefix(b.cfg.Power, "file:"); ok {
		return p
	}
	return ""
}

// Boots returns the boots so far, one "power-on DEVICE" or "reset DEVICE"
// each, DEVICE being pyghmi's name of the device in effect ("network",
// "hd", "optical", "setup", "default").
func (b *BMC) Boots() ([]string, error) {
	data, err := os.ReadFile(filepath.Join(b.Dir, "boots.log"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimSpace(string(data)), "\n"), nil
}

func freeUDPPort() (int, error) {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pyghmibmc: free port: %w", err)
	}
	defer pc.Close()
	return pc.LocalAddr().(*net.UDPAddr).Port, nil
}

// SetPower sets the file backend's state, as a machine switched by hand.
func (b *BMC) SetPower(t Fataler, on bool) {
	t.Helper()
	s := "off\n"
	if on {
		s = "on\n"
	}
	if err := os.WriteFile(b.PowerFile(), []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Fataler is the part of testing.TB SetPower uses (the package does not
// import testing).
type Fataler interface {
	Helper()
	Fatal(args ...any)
}
