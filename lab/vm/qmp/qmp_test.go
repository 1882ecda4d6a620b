package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/machina-metal/machina/internal/peertest"
)

// startQEMU starts a paused (-S), device-less TCG qemu whose QMP monitor
// listens on a socket this test created and passed as fd 3, so the client
// can connect at once without polling. It returns the socket path.
func startQEMU(t *testing.T, extra ...string) (string, <-chan struct{}) {
	t.Helper()
	bin := peertest.Command(t, "qemu-system-x86_64")
	dir := t.TempDir()
	sock := filepath.Join(dir, "qmp.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	f, err := l.File()
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close() // f keeps the listening socket open
	args := append([]string{"-accel", "tcg", "-S", "-nodefaults", "-no-user-config", "-display", "none",
		"-m", "64", "-chardev", "socket,id=mon0,fd=3,server=on,wait=off", "-mon", "chardev=mon0,mode=control"}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.ExtraFiles = []*os.File{f}
	cmd.Stderr = &testWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	return sock, exited
}

type testWriter struct{ t *testing.T }

func (w *testWriter) Write(p []byte) (int, error) { w.t.Logf("qemu: %s", p); return len(p), nil }

func dial(t *testing.T, sock string) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, sock)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func waitEvent(t *testing.T, c *Client, name string) Event {
	t.Helper()
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-c.Events():
			if !ok {
				t.Fatalf("connection closed while waiting for event %s", name)
			}
			if ev.Name == name {
				return ev
			}
		case <-timer.C:
			t.Fatalf("no %s event within 30s", name)
		}
	}
}

func TestRunStateCommands(t *testing.T) {
	sock, _ := startQEMU(t)
	c := dial(t, sock)
	ctx := context.Background()
	var ver struct {
		QEMU struct{ Major int } `json:"qemu"`
	}
	if err := json.Unmarshal(c.Greeting, &ver); err != nil || ver.QEMU.Major < 5 {
		t.Fatalf("greeting %s: major=%d err=%v", c.Greeting, ver.QEMU.Major, err)
	}
	st, err := c.QueryStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Running || st.Status != "prelaunch" {
		t.Fatalf("QueryStatus after -S = %+v, want prelaunch, not running", st)
	}
	if err := c.Cont(ctx); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, c, "RESUME")
	if st, _ = c.QueryStatus(ctx); !st.Running || st.Status != "running" {
		t.Fatalf("QueryStatus after cont = %+v, want running", st)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, c, "STOP")
	if st, _ = c.QueryStatus(ctx); st.Running || st.Status != "paused" {
		t.Fatalf("QueryStatus after stop = %+v, want paused", st)
	}
	if err := c.SystemReset(ctx); err != nil {
		t.Fatal(err)
	}
	ev := waitEvent(t, c, "RESET")
	var rd struct {
		Guest  bool   `json:"guest"`
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal(ev.Data, &rd); err != nil || rd.Guest || rd.Reason != "host-qmp-system-reset" {
		t.Fatalf("RESET data %s, want reason host-qmp-system-reset", ev.Data)
	}
	if err := c.SystemPowerdown(ctx); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, c, "POWERDOWN")
}

func TestQuitEndsProcess(t *testing.T) {
	sock, exited := startQEMU(t)
	c := dial(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Quit(ctx); err != nil {
		t.Fatalf("Quit: %v", err)
	}
	select {
	case <-exited:
	case <-ctx.Done():
		t.Fatal("qemu still running 30s after quit")
	}
	err := c.SystemReset(ctx)
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("command after quit: err = %v, want ErrClosed", err)
	}
}

func TestErrors(t *testing.T) {
	sock, _ := startQEMU(t)
	c := dial(t, sock)
	ctx := context.Background()
	err := c.Execute(ctx, "no-such-command", nil, nil)
	var qe *Error
	if !errors.As(err, &qe) || qe.Class != "CommandNotFound" {
		t.Fatalf("unknown command: err = %v, want *Error CommandNotFound", err)
	}
	err = c.Eject(ctx, "nonexistent0", true)
	if !errors.As(err, &qe) || qe.Desc == "" {
		t.Fatalf("eject on missing device: err = %v, want *Error", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := c.Execute(cctx, "query-status", nil, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ctx: err = %v, want context.Canceled", err)
	}
	// The session still works after a cancelled wait.
	if _, err := c.QueryStatus(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestVirtualMedia(t *testing.T) {
	sock, _ := startQEMU(t,
		"-drive", "if=none,id=cd0,media=cdrom,readonly=on",
		"-device", "ide-cd,drive=cd0,id=cdrom0,bus=ide.1")
	c := dial(t, sock)
	ctx := context.Background()
	iso := filepath.Join(t.TempDir(), "media.iso")
	if err := os.WriteFile(iso, make([]byte, 64*2048), 0o644); err != nil {
		t.Fatal(err)
	}
	find := func() BlockInfo {
		t.Helper()
		bs, err := c.QueryBlock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bs {
			if b.Device == "cd0" {
				return b
			}
		}
		t.Fatalf("cd0 not in query-block: %+v", bs)
		return BlockInfo{}
	}
	if b := find(); !b.Removable || b.Inserted != nil {
		t.Fatalf("empty cdrom: %+v, want removable and no medium", b)
	}
	if err := c.ChangeMedium(ctx, "cdrom0", iso, "raw", true); err != nil {
		t.Fatalf("ChangeMedium: %v", err)
	}
	b := find()
	if b.Inserted == nil || b.Inserted.File != iso || !b.Inserted.RO || b.TrayOpen {
		t.Fatalf("after insert: %+v inserted=%+v, want %s read-only, tray closed", b, b.Inserted, iso)
	}
	if err := c.Eject(ctx, "cdrom0", true); err != nil {
		t.Fatalf("Eject: %v", err)
	}
	if b := find(); b.Inserted != nil {
		t.Fatalf("after eject: inserted=%+v, want nil", b.Inserted)
	}
	var qe *Error
	if err := c.ChangeMedium(ctx, "cdrom0", filepath.Join(t.TempDir(), "missing.iso"), "raw", true); !errors.As(err, &qe) {
		t.Fatalf("missing file: err = %v, want *Error", err)
	}
}
