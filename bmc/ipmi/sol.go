package ipmi

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/machina-metal/machina/bmc"
)

// solReadyBanner is the line ipmitool 1.8.x prints on stdout once the SOL
// payload is active (ipmitool lib/ipmi_sol.c).
const solReadyBanner = "[SOL Session operational"

// solCloseWait bounds how long Close waits for ipmitool to leave after the
// "~." escape before it is killed.
const solCloseWait = 3 * time.Second

var _ bmc.Console = (*Driver)(nil)

// OpenConsole activates IPMI Serial-over-LAN (Activate Payload, payload type
// 01h, IPMI v2.0 §24.1) by running ipmitool ("ipmitool -I lanplus -C suite -H
// host -p port -U user -E sol activate"). The password reaches ipmitool in
// the IPMI_PASSWORD environment variable (-E), never on its command line.
// go-ipmi v0.9.1's SOL loop expects an answer to every packet, which
// ipmi_sim does not give, hence ipmitool.
//
// The cipher suite is the one cached by the last session (a session is
// opened first if none is cached). OpenConsole returns once ipmitool reports
// the session operational, or an error wrapping bmc.ErrRefused when the BMC
// says the payload is already active elsewhere. The returned *SOLConsole
// must be closed; ctx ending also closes it.
func (d *Driver) OpenConsole(ctx context.Context) (_ io.ReadWriteCloser, err error) {
	defer func() { err = bmc.WithBMC(d.cfg.Address, err) }()
	d.mu.Lock()
	_, err = d.session(ctx)
	suite := d.suite
	d.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return d.startSOL(ctx, suite)
}

// solArgs returns ipmitool's argv for a SOL verb; it never contains the password.
func (d *Driver) solArgs(suite uint8, verb string) []string {
	return []string{"-I", "lanplus", "-C", strconv.Itoa(int(suite)), "-H", d.host, "-p", strconv.Itoa(d.port),
		"-U", d.cfg.Username, "-E", "sol", verb}
}

// solEnv is the whole environment of ipmitool: PATH to find helpers, a fixed
// locale, and the password.
func (d *Driver) solEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "IPMI_PASSWORD=" + d.cfg.Password}
}

func (d *Driver) startSOL(ctx context.Context, suite uint8) (*SOLConsole, error) {
	for _, r := range d.cfg.Username {
		if r < 0x20 || r == 0x7f {
			return nil, errors.New("ipmi: open console: username contains control characters")
		}
	}
	// ipmitool writes console output with stdio, fully buffered on a pipe:
	// stdbuf (coreutils) makes it unbuffered, and execs ipmitool in place so
	// the PID stays ipmitool's.
	name, args := d.cfg.IPMITool, d.solArgs(suite, "activate")
	if sb, err := exec.LookPath("stdbuf"); err == nil {
		name, args = sb, append([]string{"-o0", "-e0", d.cfg.IPMITool}, args...)
	}
	cmd := exec.Command(name, args...)
	cmd.Env = d.solEnv()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("ipmi: open console: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("ipmi: open console: %w", err)
	}
	stderr := &limitedBuffer{max: 4096}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("ipmi: open console: start %s: %w", d.cfg.IPMITool, err)
	}
	s := &SOLConsole{d: d, suite: suite, cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout), done: make(chan struct{}), stderr: stderr}
	go func() {
		s.waitErr = cmd.Wait()
		close(s.done)
	}()

	// Wait for the banner line, ipmitool's exit, or ctx.
	type lineResult struct {
		line string
		err  error
	}
	lines := make(chan lineResult, 1)
	go func() {
		l, err := s.out.ReadString('\n')
		lines <- lineResult{l, err}
	}()
	select {
	case r := <-lines:
		if r.err == nil && strings.HasPrefix(r.line, solReadyBanner) {
			s.stop = context.AfterFunc(ctx, func() { _ = s.Close() })
			d.log.Info("ipmi sol console opened", "pid", cmd.Process.Pid, "cipherSuite", suite)
			return s, nil
		}
		_ = s.kill()
		msg := strings.TrimSpace(stderr.String() + " " + r.line)
		if strings.Contains(msg, "already active") {
			return nil, fmt.Errorf("ipmi: open console: %w: %s", bmc.ErrRefused, msg)
		}
		return nil, fmt.Errorf("ipmi: open console: ipmitool sol activate: %s", msg)
	case <-ctx.Done():
		_ = s.kill()
		return nil, fmt.Errorf("ipmi: open console: %w", ctx.Err())
	}
}

// SOLConsole is an active IPMI SOL session run by an ipmitool child process.
// Read returns console output, Write types on the console. Safe for one
// reader and one writer at a time; Close may be called concurrently and more
// than once.
type SOLConsole struct {
	d      *Driver
	suite  uint8
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *bufio.Reader
	stderr *limitedBuffer
	stop   func() bool

	done    chan struct{}
	waitErr error

	closeOnce sync.Once
	closeErr  error
}

// PID returns the process ID of the ipmitool child.
func (s *SOLConsole) PID() int { return s.cmd.Process.Pid }

// Read reads console output.
func (s *SOLConsole) Read(p []byte) (int, error) { return s.out.Read(p) }

// Write types p on the console. Note that ipmitool treats "~." at the start
// of a line as its escape and leaves.
func (s *SOLConsole) Write(p []byte) (int, error) { return s.stdin.Write(p) }

// Close leaves the SOL session: it types ipmitool's escape "~." so ipmitool
// deactivates the payload, waits up to 3s for it to exit, and otherwise
// kills it by PID and sends "sol deactivate" so the BMC's SOL payload is free
// for the next session.
func (s *SOLConsole) Close() error {
	s.closeOnce.Do(func() {
		if s.stop != nil {
			s.stop()
		}
		_, _ = s.stdin.Write([]byte("\r~."))
		_ = s.stdin.Close()
		t := time.NewTimer(solCloseWait)
		defer t.Stop()
		select {
		case <-s.done:
			s.d.log.Info("ipmi sol console closed", "pid", s.cmd.Process.Pid)
			return
		case <-t.C:
		}
		s.closeErr = s.kill()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		deact := exec.CommandContext(ctx, s.d.cfg.IPMITool, s.d.solArgs(s.suite, "deactivate")...)
		deact.Env = s.d.solEnv()
		if out, err := deact.CombinedOutput(); err != nil {
			s.d.log.Warn("ipmi sol deactivate after kill", "err", err, "output", strings.TrimSpace(string(out)))
		}
	})
	return s.closeErr
}

// kill ends the child by its PID and waits for it.
func (s *SOLConsole) kill() error {
	_ = s.stdin.Close()
	select {
	case <-s.done:
		return nil
	default:
	}
	if err := s.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("ipmi: close console: kill ipmitool: %w", err)
	}
	<-s.done
	return nil
}

// limitedBuffer keeps the first max bytes written; safe for concurrent use.
type limitedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *limitedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
