// Package pyghmibmc runs a test BMC on pyghmi's pyghmi.ipmi.bmc.Bmc class
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
// Power is pluggable (Config.Power): a state file, or a qemu QMP socket
// for the VM lab. The script is pyghmibmc.py beside this file, embedded.
// Test helper: no product package imports it.
package pyghmibmc

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
	"testing"
	"time"

	"github.com/machina-metal/machina/internal/peertest"
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
	// Port is the UDP port on 127.0.0.1; 0 picks a free one.
	Port int
	// User and Password are the one IPMI user; "" means admin/password.
	// The password reaches the script on its standard input, never argv.
	User, Password string
	// Power is the power backend: "file:PATH" or "qmp:SOCKET"; "" means
	// a file Dir/power starting "off".
	Power string
	// ApplyAtPowerOn makes a boot device set while the machine runs read
	// back stale and take effect at the next power-on (VirtualBMC over
	// libvirt).
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
	args := []string{sp, "--port", strconv.Itoa(b.Port), "--user", b.cfg.User, "--power", b.cfg.Power,
		"--boots", filepath.Join(b.Dir, "boots.log")}
	if b.cfg.ApplyAtPowerOn {
		args = append(args, "--apply-at-power-on")
	}
	cmd := exec.Command(Python, args...)
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

// Addr is "127.0.0.1:port", the address the ipmi driver takes.
func (b *BMC) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port)) }

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

// Require ends t (fail, or skip in the quick mode) when Debian's python3
// or python3-pyghmi is missing.
func Require(t testing.TB) {
	t.Helper()
	peertest.File(t, Python, "python3")
	peertest.File(t, Module, "python3-pyghmi")
}

// Start launches a test BMC for t in a fresh directory (cfg.Dir is
// replaced), stopped by its PID when t ends. Power starts off.
func Start(t testing.TB, cfg Config) *BMC {
	t.Helper()
	Require(t)
	cfg.Dir = t.TempDir()
	b, err := Launch(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	return b
}

// SetPower sets the file backend's state, as a machine switched by hand.
func (b *BMC) SetPower(t testing.TB, on bool) {
	t.Helper()
	s := "off\n"
	if on {
		s = "on\n"
	}
	if err := os.WriteFile(b.PowerFile(), []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
