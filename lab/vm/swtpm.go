package vm

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// swtpm is a lab VM's TPM 2.0: swtpm (Debian package swtpm) serving a
// state folder manufactured once by swtpm_setup (swtpm-tools), on a
// control socket qemu's tpm emulator backend connects to. qemu sends swtpm
// CMD_SHUTDOWN when it exits and swtpm ends, so ensure runs before every
// qemu start (vmpower SetPreStart), as libvirt does; the EK stays the same
// across the starts because the state folder does. The one starter of the
// host lab and the Secure Boot lab.
type swtpm struct {
	dir  string // state in dir/state, the socket and the log beside it
	sock string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// newSWTPM manufactures a TPM 2.0 in dir with `swtpm_setup --tpm2
// --tpmstate dir/state setup...` (the EK and what else setup asks for: an
// EK certificate as a TPM vendor makes one, PCR banks) and returns it, not
// started.
func newSWTPM(dir string, setup ...string) (*swtpm, error) {
	state := filepath.Join(dir, "state")
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, fmt.Errorf("swtpm: %w", err)
	}
	args := append([]string{"--tpm2", "--tpmstate", state}, setup...)
	if out, err := exec.Command("swtpm_setup", args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("swtpm_setup %s: %w: %s", dir, err, out)
	}
	return &swtpm{dir: dir, sock: filepath.Join(dir, "swtpm.sock")}, nil
}

// qemuArgs attaches the TPM to a qemu VM as device model ("tpm-crb" or
// "tpm-tis").
func (t *swtpm) qemuArgs(model string) []string {
	return []string{"-chardev", "socket,id=chrtpm,path=" + t.sock, "-tpmdev", "emulator,id=tpm0,chardev=chrtpm", "-device", model + ",tpmdev=tpm0"}
}

// ensure starts swtpm on the state unless the last one still runs, and
// waits (30 s at most) for its control socket.
func (t *swtpm) ensure() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cmd != nil {
		select {
		case <-t.done:
		default:
			return nil
		}
	}
	_ = os.Remove(t.sock)
	logf, err := os.OpenFile(filepath.Join(t.dir, "swtpm.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("swtpm: %w", err)
	}
	cmd := exec.Command("swtpm", "socket", "--tpm2", "--tpmstate", "dir="+filepath.Join(t.dir, "state"), "--ctrl", "type=unixio,path="+t.sock,
		"--log", "level=1")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("swtpm: start: %w", err)
	}
	done := make(chan struct{})
	t.cmd, t.done = cmd, done
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(t.sock); err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("swtpm: exited (see %s)", filepath.Join(t.dir, "swtpm.log"))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("swtpm: no control socket after 30s")
		}
	}
}

// stop ends swtpm by its PID, if it runs. Safe on a nil t.
func (t *swtpm) stop() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cmd == nil {
		return
	}
	select {
	case <-t.done:
	default:
		_ = t.cmd.Process.Kill()
		<-t.done
	}
	t.cmd = nil
}
