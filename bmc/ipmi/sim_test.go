package ipmi

import (
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bougou/go-ipmi/pkg/crypto"
	"github.com/bougou/go-ipmi/pkg/types"
)

// requireTools skips (or fails in CI) when ipmi_sim or ipmitool is missing.
func requireTools(t *testing.T) {
	t.Helper()
	for _, bin := range []string{"ipmi_sim", "ipmitool"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s not found in PATH: CI must install Debian packages openipmi and ipmitool (.ci/run)", bin)
			}
			t.Skipf("%s not found in PATH (install Debian packages openipmi and ipmitool)", bin)
		}
	}
}

// fixturesDir finds the shared fixtures: $MACHINA_FIXTURES, else the copy in
// <repo>/testdata/fixtures (scripts/sync-fixtures.sh), else <repo>/../shared/fixtures.
func fixturesDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("MACHINA_FIXTURES"); d != "" {
		return d
	}
	root, err := filepath.Abs("../..")
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

// freeUDPPort returns a port nothing listens on at the moment of the call.
func freeUDPPort(t *testing.T) int {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	return pc.LocalAddr().(*net.UDPAddr).Port
}

// chassisScript is the chassis_control program ipmi_sim runs (LAB-NOTES §3.1):
// "<prog> get power|boot" and "<prog> set power 1|0 / reset 1 / boot X /
// shutdown 1". State lives in files next to it; every call is logged to
// calls.log. A file "stuck" makes "set power" a no-op that still succeeds,
// like a BMC that acknowledges and does nothing; "ignore-shutdown" makes the
// soft shutdown a no-op, like an OS ignoring the ACPI power button.
const chassisScript = `#!/bin/sh
D=$(dirname "$0")
echo "$*" >> "$D/calls.log"
op=$1; shift
case $op in
get)
  for p in "$@"; do
    case $p in
      power) echo "power:$(cat "$D/power" 2>/dev/null || echo 0)" ;;
      boot) echo "boot:$(cat "$D/boot" 2>/dev/null || echo default)" ;;
      *) echo "Invalid parameter: $p"; exit 1 ;;
    esac
  done ;;
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

// sim is one ipmi_sim process on 127.0.0.1:port.
type sim struct {
	t    *testing.T
	dir  string
	port int
	cmd  *exec.Cmd
}

// startSim writes lan.conf and the chassis_control script into a fresh
// directory and starts ipmi_sim on a free UDP port.
func startSim(t *testing.T) *sim {
	t.Helper()
	return startSimSerial(t, "")
}

// startSimSerial is startSim with the SOL serial port of the simulated host
// at serialAddr ("host:port" of a TCP listener the test owns; ipmi_sim
// connects to it at start and retries about every 10 s). "" points it at an
// unused port.
func startSimSerial(t *testing.T, serialAddr string) *sim {
	t.Helper()
	requireTools(t)
	s := &sim{t: t, dir: t.TempDir(), port: freeUDPPort(t)}
	if serialAddr == "" {
		serialAddr = "127.0.0.1:" + strconv.Itoa(freeUDPPort(t))
	}
	if err := os.MkdirAll(filepath.Join(s.dir, "state"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.dir, "chassis.sh"), []byte(chassisScript), 0o755); err != nil {
		t.Fatal(err)
	}
	emu, err := os.ReadFile(filepath.Join(fixturesDir(t), "ipmi", "sim.emu"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.dir, "sim.emu"), emu, 0o644); err != nil {
		t.Fatal(err)
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
  user 2 true "admin" "password" admin 10 md5
  user 3 true "reader" "readerpw" user 10 md5
  user 4 false "disabled" "disabledpw" admin 10 md5
  user 5 true "solop" "S3cret-SOL-pw" admin 10 md5
`, s.port, filepath.Join(s.dir, "chassis.sh"), serialAddr)
	if err := os.WriteFile(filepath.Join(s.dir, "lan.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	s.start()
	t.Cleanup(s.stop)
	return s
}

// start runs ipmi_sim and waits until it answers an RMCP presence ping.
func (s *sim) start() {
	t := s.t
	t.Helper()
	log, err := os.OpenFile(filepath.Join(s.dir, "sim.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ipmi_sim", "-c", filepath.Join(s.dir, "lan.conf"), "-f", filepath.Join(s.dir, "sim.emu"),
		"-s", filepath.Join(s.dir, "state"), "-n")
	cmd.Stdout, cmd.Stderr, cmd.Dir = log, log, s.dir
	if err := cmd.Start(); err != nil {
		t.Fatalf("start ipmi_sim: %v", err)
	}
	log.Close()
	s.cmd = cmd
	if err := rmcpPing(s.port, 5*time.Second); err != nil {
		s.stop()
		b, _ := os.ReadFile(filepath.Join(s.dir, "sim.log"))
		t.Fatalf("ipmi_sim on port %d not answering: %v\n%s", s.port, err, b)
	}
}

// stop ends ipmi_sim by its own PID.
func (s *sim) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// restart stops ipmi_sim and starts a new one on the same port and state:
// a BMC reboot, after which old RMCP+ sessions are unknown.
func (s *sim) restart() {
	s.stop()
	s.start()
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

// calls returns the chassis_control invocations logged so far.
func (s *sim) calls() []string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "calls.log"))
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// resetCalls clears the invocation log.
func (s *sim) resetCalls() {
	_ = os.Remove(filepath.Join(s.dir, "calls.log"))
}

// setCalls returns only the "set ..." invocations.
func (s *sim) setCalls() []string {
	var out []string
	for _, c := range s.calls() {
		if strings.HasPrefix(c, "set ") {
			out = append(out, c)
		}
	}
	return out
}

// ipmitool runs ipmitool as a second client; the password goes through the
// environment (-E).
func (s *sim) ipmitool(args ...string) string {
	s.t.Helper()
	full := append([]string{"-I", "lanplus", "-C", "3", "-H", "127.0.0.1", "-p", strconv.Itoa(s.port), "-U", "admin", "-E"}, args...)
	cmd := exec.Command("ipmitool", full...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "IPMI_PASSWORD=password"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		s.t.Fatalf("ipmitool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// newDriver returns a driver for addr with short test timeouts.
func newDriver(t *testing.T, addr, user, pass string, mod func(*Config)) *Driver {
	t.Helper()
	cfg := Config{
		Address: addr, Username: user, Password: pass,
		// 1s like the defaults: the machine is shared and ipmi_sim runs the
		// chassis_control program synchronously.
		HandshakeTimeout: time.Second, Timeout: time.Second, Retries: 1,
		PowerTimeout: 5 * time.Second, SoftOffTimeout: 2 * time.Second, PollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if mod != nil {
		mod(&cfg)
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	return d
}

func (s *sim) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// ---- UDP proxy that decrypts, reads and rewrites RMCP+ IPMI messages ----

// proxy relays UDP between one client and ipmi_sim. It watches the RAKP
// exchange (IPMI v2.0 §13.20-13.23), derives the session keys from the
// known password (§13.31-13.32: SIK, K1, K2) for cipher suite 3, and so can
// decrypt (AES-CBC-128, §13.29) and re-sign (HMAC-SHA1-96, §13.28.4) session
// messages: it records requests and applies the rules below.
type proxy struct {
	t        *testing.T
	ln       *net.UDPConn
	backend  *net.UDPAddr
	user     string
	password string

	mu sync.Mutex
	// reject maps a Chassis Control value to the completion code to answer
	// with; the request is rewritten to an undefined control value (06h,
	// which ipmi_sim acknowledges and ignores) so the BMC does nothing.
	reject map[uint8]uint8
	// dropResponses is how many Get Chassis Status responses to drop.
	dropResponses int
	pending       map[uint8]uint8 // rqSeq → completion code to put in its response
	requests      []ipmiMsg
	client        *net.UDPAddr

	// openSessionAlgs records the authentication algorithm of every RMCP+
	// Open Session Request (01h = RAKP-HMAC-SHA1, suite 3; 03h =
	// RAKP-HMAC-SHA256, suite 17).
	openSessionAlgs []uint8
	// silenceSHA256 drops Open Session Requests proposing RAKP-HMAC-SHA256,
	// like a BMC that ignores cipher suite 17.
	silenceSHA256 bool

	rc, rm []byte // console and BMC random numbers of the current RAKP exchange
	role   uint8
	k1, k2 []byte
}

// ipmiMsg is one IPMI LAN request seen by the proxy.
type ipmiMsg struct {
	NetFn, Cmd, Seq uint8
	Data            []byte
}

func startProxy(t *testing.T, backendPort int, user, password string) *proxy {
	t.Helper()
	ln, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, ln: ln, backend: &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: backendPort},
		user: user, password: password, reject: map[uint8]uint8{}, pending: map[uint8]uint8{}}
	be, err := net.DialUDP("udp4", nil, p.backend)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}, 2)
	go func() { // client → BMC
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 2048)
		for {
			n, from, err := ln.ReadFromUDP(buf)
			if err != nil {
				return
			}
			p.mu.Lock()
			p.client = from
			pkt := p.onPacket(append([]byte(nil), buf[:n]...), true)
			p.mu.Unlock()
			_, _ = be.Write(pkt)
		}
	}()
	go func() { // BMC → client
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 2048)
		for {
			n, err := be.Read(buf)
			if err != nil {
				return
			}
			p.mu.Lock()
			pkt := p.onPacket(append([]byte(nil), buf[:n]...), false)
			to := p.client
			p.mu.Unlock()
			if pkt != nil && to != nil {
				_, _ = ln.WriteToUDP(pkt, to)
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		be.Close()
		<-done
		<-done
	})
	return p
}

func (p *proxy) port() int { return p.ln.LocalAddr().(*net.UDPAddr).Port }

func (p *proxy) set(f func(p *proxy)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(p)
}

// onPacket inspects one datagram and returns it (possibly rewritten), or nil to drop it.
func (p *proxy) onPacket(pkt []byte, toBMC bool) []byte {
	// RMCP header (4) + auth type 06h + payload type + session ID (4) + seq (4) + length (2).
	if len(pkt) < 16 || pkt[0] != 0x06 || pkt[3] != 0x07 || pkt[4] != 0x06 {
		return pkt
	}
	ptype := pkt[5] & 0x3F
	n := int(binary.LittleEndian.Uint16(pkt[14:16]))
	if 16+n > len(pkt) {
		return pkt
	}
	payload := pkt[16 : 16+n]
	switch {
	case ptype == 0x10 && toBMC && n >= 32: // RMCP+ Open Session Request (table 13-9)
		p.openSessionAlgs = append(p.openSessionAlgs, payload[12])
		if p.silenceSHA256 && payload[12] == 0x03 {
			return nil
		}
		return pkt
	case ptype == 0x12 && toBMC && n >= 28: // RAKP Message 1
		p.rc = append([]byte(nil), payload[8:24]...)
		p.role = payload[24]
		return pkt
	case ptype == 0x13 && !toBMC && n >= 40: // RAKP Message 2
		p.rm = append([]byte(nil), payload[8:24]...)
		_, k1, k2, err := crypto.DeriveSessionKeys(types.AuthAlg_HMAC_SHA1, p.rc, p.rm, p.role, p.user, crypto.PadPassword20([]byte(p.password)))
		if err != nil {
			p.t.Errorf("proxy: derive keys: %v", err)
		}
		p.k1, p.k2 = k1, k2
		return pkt
	case ptype != 0x00 || pkt[5]&0xC0 != 0xC0 || p.k2 == nil: // not an encrypted, signed IPMI message
		return pkt
	}
	plain, err := crypto.DecryptAESPayload(payload, p.k2)
	if err != nil || len(plain) < 7 {
		return pkt
	}
	changed := false
	if toBMC {
		msg := ipmiMsg{NetFn: plain[1] >> 2, Seq: plain[4] >> 2, Cmd: plain[5], Data: append([]byte(nil), plain[6:len(plain)-1]...)}
		p.requests = append(p.requests, msg)
		if msg.NetFn == 0x00 && msg.Cmd == 0x02 && len(msg.Data) == 1 {
			if cc, ok := p.reject[msg.Data[0]]; ok {
				p.pending[msg.Seq] = cc
				plain[6] = 0x06
				plain[len(plain)-1] = checksum(plain[3 : len(plain)-1])
				changed = true
			}
		}
	} else {
		netFn, seq, cmd := plain[1]>>2, plain[4]>>2, plain[5]
		if netFn == 0x01 && cmd == 0x01 && p.dropResponses > 0 {
			p.dropResponses--
			return nil
		}
		if cc, ok := p.pending[seq]; ok && netFn == 0x01 && cmd == 0x02 {
			delete(p.pending, seq)
			// Response: rqAddr netFn chk1 rsAddr seq cmd cc chk2.
			plain[6] = cc
			plain[len(plain)-1] = checksum(plain[3 : len(plain)-1])
			changed = true
		}
	}
	if !changed {
		return pkt
	}
	enc, err := crypto.EncryptAESPayload(plain, p.k2, payload[:16])
	if err != nil || len(enc) != n {
		p.t.Errorf("proxy: re-encrypt: %v (len %d, want %d)", err, len(enc), n)
		return pkt
	}
	copy(payload, enc)
	// Session trailer: integrity pad, pad length, next header, 12-byte AuthCode
	// = HMAC-SHA1(K1, auth type .. next header)[:12].
	mac := hmac.New(sha1.New, p.k1)
	mac.Write(pkt[4 : len(pkt)-12])
	copy(pkt[len(pkt)-12:], mac.Sum(nil)[:12])
	return pkt
}

// checksum is the IPMB two's complement checksum (IPMI v2.0 §13.8).
func checksum(b []byte) uint8 {
	var s uint8
	for _, x := range b {
		s += x
	}
	return -s
}

// sent returns the recorded requests with netFn and cmd.
func (p *proxy) sent(netFn, cmd uint8) [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out [][]byte
	for _, m := range p.requests {
		if m.NetFn == netFn && m.Cmd == cmd {
			out = append(out, m.Data)
		}
	}
	return out
}
