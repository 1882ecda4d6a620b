// Package ipmisim runs OpenIPMI's ipmi_sim on loopback for tests: a
// lan.conf with known users, a chassis_control program that keeps power and
// boot device in files and logs every call (LAB-NOTES §3: ipmi_sim handles
// power and boot only through chassis_control after set_working_mc), and
// ipmitool as a second client with the password in its environment.
//
// The simulated lab (machina sim) runs it with Launch; tests start it with
// the ipmisimtest package, which binds it to a test. Imports no Machina
// package and no test helper.
package ipmisim

import (
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

// chassisScript is the chassis_control program ipmi_sim runs (LAB-NOTES §3.1):
// "<prog> get power|boot" and "<prog> set power 1|0 / reset 1 / boot X /
// shutdown 1". State lives in files next to it; every call is logged to
// calls.log, a set before it changes the state and a get once it has read
// it (so a logged "get power" saw the power the set lines before it left,
// and a follower of the log can tell the BMC has answered with it). A
// file "stuck" makes "set power" a no-op that still succeeds,
// like a BMC that acknowledges and does nothing; "ignore-shutdown" makes the
// soft shutdown a no-op, like an OS ignoring the ACPI power button.
const chassisScript = `#!/bin/sh
D=$(dirname "$0")
call="$*"
op=$1; shift
[ "$op" = get ] || echo "$call" >> "$D/calls.log"
case $op in
get)
  out=
  for p in "$@"; do
    case $p in
      power) out="$out power:$(cat "$D/power" 2>/dev/null || echo 0)" ;;
      boot) out="$out boot:$(cat "$D/boot" 2>/dev/null || echo default)" ;;
      *) echo "$call" >> "$D/calls.log"; echo "Invalid parameter: $p"; exit 1 ;;
    esac
  done
  echo "$call" >> "$D/calls.log"
  for o in $out; do echo "$o"; done ;;
set)
  while [ $# -gt 0 ]; do
    p=$1; v=$2; shift 2
    case $p in
      power) [ -e "$D/stuck" ] || echo "$v" > "$D/power" ;;
      reset) ;;
      boot) echo "$v" > "$D/boot" ;;
      shutdown) [ -e "$D/stuck" ] || [ -e "$D/ignore-shutdown" ] || echo 0 > "$D/power" ;;
      identify) shift ;;
      *) echo "Invalid parameter: $p"; exit 1 ;;
    esac
  done ;;
check) exit 1 ;;
*) echo "Unknown operation: $op"; exit 1 ;;
esac
exit 0
`

// Sim is one ipmi_sim process on 127.0.0.1:Port. Dir holds lan.conf,
// the chassis_control script, its state files (power, boot) and calls.log;
// creating Dir/stuck makes power commands succeed without effect, and
// Dir/ignore-shutdown makes the soft shutdown a no-op.
type Sim struct {
	Dir  string
	Port int
	cmd  *exec.Cmd
}

// LaunchConfig configures Launch.
type LaunchConfig struct {
	// Dir receives lan.conf, the chassis_control script, its state files
	// and the simulator's log. Required.
	Dir string
	// Port is the UDP port on 127.0.0.1; zero picks a free one.
	Port int
	// SerialAddr is the simulated host's SOL serial port ("host:port" of a
	// TCP listener); "" points it at an unused port.
	SerialAddr string
	// Emu is the sim.emu content (the fixtures' ipmi/sim.emu). Required.
	Emu []byte
	// Password is the admin user's password (at most 16 bytes, IPMI v2.0
	// §13.20); "" means "password".
	Password string
}

// Launch starts ipmi_sim outside a test (the simulated lab): same
// lan.conf, users and chassis_control program as Start. The caller stops
// it with Stop. Errors: ipmi_sim missing, a port that does not answer.
func Launch(cfg LaunchConfig) (*Sim, error) {
	if _, err := exec.LookPath("ipmi_sim"); err != nil {
		return nil, fmt.Errorf("ipmisim: %w (Debian package openipmi)", err)
	}
	if cfg.Port == 0 {
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		cfg.Port = pc.LocalAddr().(*net.UDPAddr).Port
		pc.Close()
	}
	if cfg.SerialAddr == "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		cfg.SerialAddr = ln.Addr().String()
		ln.Close()
	}
	if cfg.Password == "" {
		cfg.Password = "password"
	}
	if len(cfg.Password) > 16 || strings.ContainsAny(cfg.Password, "\"\n") {
		return nil, errors.New("ipmisim: password must be at most 16 bytes without quotes or newlines")
	}
	s := &Sim{Dir: cfg.Dir, Port: cfg.Port}
	if err := os.MkdirAll(filepath.Join(s.Dir, "state"), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(s.Dir, "chassis.sh"), []byte(chassisScript), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(s.Dir, "sim.emu"), cfg.Emu, 0o644); err != nil {
		return nil, err
	}
	conf := fmt.Sprintf(`name "machina-test"
set_working_mc 0x20
  startlan 1
    addr 127.0.0.1 %d
    priv_limit admin
    allowed_auths_callback none
    allowed_auths_user md5
    allowed_auths_operator md5
    allowed_auths_admin md5
    guid a123456789abcdefa123456789abcdef
  endlan
  chassis_control "%s"
  sol "tcp:%s" 115200
  user 2 true "admin" "%s" admin 10 md5
  user 3 true "reader" "readerpw" user 10 md5
  user 4 false "disabled" "disabledpw" admin 10 md5
  user 5 true "solop" "S3cret-SOL-pw" admin 10 md5
`, s.Port, filepath.Join(s.Dir, "chassis.sh"), cfg.SerialAddr, cfg.Password)
	if err := os.WriteFile(filepath.Join(s.Dir, "lan.conf"), []byte(conf), 0o600); err != nil {
		return nil, err
	}
	if err := s.launch(); err != nil {
		return nil, err
	}
	return s, nil
}

// launch runs ipmi_sim and waits until it answers an RMCP presence ping.
func (s *Sim) launch() error {
	log, err := os.OpenFile(filepath.Join(s.Dir, "sim.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command("ipmi_sim", "-c", filepath.Join(s.Dir, "lan.conf"), "-f", filepath.Join(s.Dir, "sim.emu"),
		"-s", filepath.Join(s.Dir, "state"), "-n")
	cmd.Stdout, cmd.Stderr, cmd.Dir = log, log, s.Dir
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start ipmi_sim: %w", err)
	}
	log.Close()
	s.cmd = cmd
	if err := rmcpPing(s.Port, 5*time.Second); err != nil {
		s.Stop()
		b, _ := os.ReadFile(filepath.Join(s.Dir, "sim.log"))
		return fmt.Errorf("ipmi_sim on port %d not answering: %v\n%s", s.Port, err, b)
	}
	return nil
}

// Stop ends ipmi_sim by its own PID. Safe to call twice.
func (s *Sim) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart stops ipmi_sim and starts a new one on the same port and state:
// a BMC reboot, after which old RMCP+ sessions are unknown.
func (s *Sim) Restart() error {
	s.Stop()
	return s.launch()
}

// rmcpPing sends ASF presence pings (DSP0136 §3.2.4.1) until a pong arrives.
func rmcpPing(port int, within time.Duration) error {
	conn, err := net.Dial("udp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return err
	}
	defer conn.Close()
	ping := []byte{0x06, 0x00, 0xff, 0x06, 0x00, 0x00, 0x11, 0xbe, 0x80, 0x00, 0x00, 0x00}
	deadline := time.Now().Add(within)
	buf := make([]byte, 512)
	for time.Now().Before(deadline) {
		if _, err := conn.Write(ping); err != nil {
			// ICMP refused until ipmi_sim binds: try again after the read wait.
			_ = err
		}
		_ = conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, err := conn.Read(buf)
		if err == nil && n >= 12 && buf[8] == 0x40 {
			return nil
		}
		if err != nil && !isTimeout(err) {
			// Refused: ipmi_sim not bound yet; wait on the deadline instead of spinning.
			time.Sleep(20 * time.Millisecond)
		}
	}
	return errors.New("no RMCP presence pong")
}

// Calls returns the chassis_control invocations logged so far.
func (s *Sim) Calls() []string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "calls.log"))
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// ResetCalls clears the invocation log.
func (s *Sim) ResetCalls() {
	_ = os.Remove(filepath.Join(s.Dir, "calls.log"))
}

// SetCalls returns only the "set ..." invocations.
func (s *Sim) SetCalls() []string {
	var out []string
	for _, c := range s.Calls() {
		if strings.HasPrefix(c, "set ") {
			out = append(out, c)
		}
	}
	return out
}

// Ipmitool runs ipmitool as a second client; the password goes through the
// environment (-E). Errors carry ipmitool's output.
func (s *Sim) Ipmitool(args ...string) (string, error) {
	full := append([]string{"-I", "lanplus", "-C", "3", "-H", "127.0.0.1", "-p", strconv.Itoa(s.Port), "-U", "admin", "-E"}, args...)
	cmd := exec.Command("ipmitool", full...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "IPMI_PASSWORD=password"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ipmitool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Addr is "127.0.0.1:port", the address the ipmi driver takes.
func (s *Sim) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) }

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
