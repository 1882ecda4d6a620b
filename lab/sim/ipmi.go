package sim

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/bmc/ipmi/ipmisim"
)

// startIPMI gives m an IPMI BMC: OpenIPMI's ipmi_sim on 127.0.0.1 with a
// chassis_control program that records power and boot device in files and
// logs every command. The machine follows the log (power on, off, reset,
// soft shutdown) and writes its own power changes (the agent powering off
// after commissioning) back, so chassis status tells the truth. The BMC's
// Serial-over-LAN is wired to the machine's serial port (startSerial): a
// SOL session shows what the machine prints and types on its console.
func (l *Lab) startIPMI(m *Machine) (string, error) {
	fixtures, err := bmcsim.FixturesDir()
	if err != nil {
		return "", err
	}
	emu, err := os.ReadFile(filepath.Join(fixtures, "ipmi", "sim.emu"))
	if err != nil {
		return "", fmt.Errorf("sim: ipmi_sim emulation file: %w", err)
	}
	serial, err := m.startSerial(l.ctx, &l.wg)
	if err != nil {
		return "", fmt.Errorf("sim: serial port: %w", err)
	}
	s, err := ipmisim.Launch(ipmisim.LaunchConfig{Dir: filepath.Join(filepath.Dir(m.root), "bmc"), Emu: emu, Password: l.cfg.Password, SerialAddr: serial})
	if err != nil {
		return "", err
	}
	l.ipmiSims = append(l.ipmiSims, s)
	m.powerFile = filepath.Join(s.Dir, "power")
	_ = os.WriteFile(m.powerFile, []byte("0\n"), 0o644)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		m.followChassis(l.ctx, filepath.Join(s.Dir, "calls.log"))
	}()
	return s.Addr(), nil
}

// IPMIMissing is why an IPMI server runs a Redfish BMC when OpenIPMI's
// ipmi_sim is not installed.
const IPMIMissing = "ipmi_sim not in PATH (Debian package openipmi)"

// IPMIAvailable reports whether OpenIPMI's ipmi_sim is in PATH, so the
// inventory's IPMI servers get an IPMI BMC.
func IPMIAvailable() bool {
	_, err := exec.LookPath("ipmi_sim")
	return err == nil
}

// followChassis applies the chassis_control commands ipmi_sim ran (logged
// one per line: "set power 1", "set reset 1", "set shutdown 1", ...).
func (m *Machine) followChassis(ctx context.Context, calls string) {
	var off int64
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f, err := os.Open(calls)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return
		}
		if _, err := f.Seek(off, 0); err != nil {
			f.Close()
			return
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := sc.Text()
			off += int64(len(line)) + 1
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "get" && slices.Contains(f[1:], "power") {
				// ipmi_sim answered a Get Chassis Status (the line is
				// logged once the state is read): the BMC saw the power.
				m.bmcReadOn()
				continue
			}
			if len(f) < 3 || f[0] != "set" {
				continue
			}
			switch {
			case f[1] == "power" && f[2] == "1":
				m.power(true, false, true)
			case f[1] == "power" && f[2] == "0", f[1] == "shutdown":
				m.power(false, false, true)
			case f[1] == "reset":
				m.power(true, true, true)
			}
		}
		f.Close()
	}
}

// syncPowerFile writes the machine's power to the chassis_control state
// file (IPMI machines only), so a power change the machine made itself
// shows in Get Chassis Status.
func (m *Machine) syncPowerFile(on bool) {
	if m.powerFile == "" {
		return
	}
	v := "0\n"
	if on {
		v = "1\n"
	}
	_ = os.WriteFile(m.powerFile, []byte(v), 0o644)
}
