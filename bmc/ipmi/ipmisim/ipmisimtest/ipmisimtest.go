// Package ipmisimtest starts OpenIPMI's ipmi_sim (package ipmisim) for a
// test: fixtures from the shared tree, a free loopback port, stopped by its
// own PID when the test ends. A missing ipmi_sim or ipmitool fails the test
// naming the Debian package (internal/peertest); only the quick mode skips.
// Test helper: no product package imports it.
package ipmisimtest

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/machina-metal/machina/bmc/ipmi/ipmisim"
	"github.com/machina-metal/machina/internal/peertest"
)

// Sim is an ipmisim.Sim bound to a test: Restart and Ipmitool fail it on error.
type Sim struct {
	*ipmisim.Sim
	t testing.TB
}

// RequireTools ends t (fail, or skip in the quick mode) when ipmi_sim or
// ipmitool is missing, naming openipmi and ipmitool.
func RequireTools(t testing.TB) {
	t.Helper()
	peertest.Commands(t, "ipmi_sim", "ipmitool")
}

// Start writes lan.conf and the chassis_control script into a fresh
// directory and starts ipmi_sim on a free UDP port of 127.0.0.1. Users:
// admin/password (admin), reader/readerpw (user), disabled/disabledpw
// (disabled), solop/S3cret-SOL-pw (admin). It is stopped by its own PID
// when the test ends.
func Start(t testing.TB) *Sim {
	t.Helper()
	return StartSerial(t, "")
}

// StartSerial is Start with the SOL serial port of the simulated host
// at serialAddr ("host:port" of a TCP listener the test owns; ipmi_sim
// connects to it at start and retries about every 10 s). "" points it at an
// unused port.
func StartSerial(t testing.TB, serialAddr string) *Sim {
	t.Helper()
	RequireTools(t)
	emu, err := os.ReadFile(filepath.Join(fixturesDir(t), "ipmi", "sim.emu"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := ipmisim.Launch(ipmisim.LaunchConfig{Dir: t.TempDir(), Port: FreeUDPPort(t), SerialAddr: serialAddr, Emu: emu})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return &Sim{Sim: s, t: t}
}

// Restart stops ipmi_sim and starts a new one on the same port and state
// (a BMC reboot); it fails the test on error.
func (s *Sim) Restart() {
	s.t.Helper()
	if err := s.Sim.Restart(); err != nil {
		s.t.Fatal(err)
	}
}

// Ipmitool runs ipmitool as a second client and fails the test on error.
func (s *Sim) Ipmitool(args ...string) string {
	s.t.Helper()
	out, err := s.Sim.Ipmitool(args...)
	if err != nil {
		s.t.Fatal(err)
	}
	return out
}

// FreeUDPPort returns a port nothing listens on at the moment of the call.
func FreeUDPPort(t testing.TB) int {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	return pc.LocalAddr().(*net.UDPAddr).Port
}

// fixturesDir finds the shared fixtures: $MACHINA_FIXTURES, else the copy in
// <repo>/testdata/fixtures (scripts/sync-fixtures.sh), else <repo>/../shared/fixtures.
func fixturesDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("MACHINA_FIXTURES"); d != "" {
		return d
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Join(root, "testdata", "fixtures"), filepath.Join(root, "..", "shared", "fixtures")} {
		if _, err := os.Stat(filepath.Join(d, "ipmi", "sim.emu")); err == nil {
			return d
		}
	}
	t.Fatalf("ipmi fixtures not found: set MACHINA_FIXTURES or run scripts/sync-fixtures.sh")
	return ""
}

// repoRoot walks up from the working directory to the folder with go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("ipmisimtest: go.mod not found above the working directory")
		}
		dir = parent
	}
}
