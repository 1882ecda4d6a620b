package controller

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	ptftp "github.com/pin/tftp/v3"
	"golang.org/x/sys/unix"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/boot/dhcp"
	"github.com/machina-metal/machina/internal/peertest"
)

// nsRun runs ip(8) with args and fails t with its output on error.
func nsRun(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// newNetns creates a network namespace with loopback up, deleted at cleanup.
func newNetns(t *testing.T, role string) string {
	t.Helper()
	var b [3]byte
	_, _ = rand.Read(b[:])
	ns := "mctl-" + hex.EncodeToString(b[:]) + "-" + role
	nsRun(t, "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	nsRun(t, "-n", ns, "link", "set", "lo", "up")
	return ns
}

// inNetns runs fn in a new goroutine on an OS thread switched into ns and
// never switched back (the runtime discards the thread when fn returns),
// so every socket fn or the servers it runs open lands in ns.
func inNetns(t *testing.T, ns string, fn func()) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open("/run/netns/" + ns)
		if err == nil {
			err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
			f.Close()
		}
		errc <- err
		if err == nil {
			fn()
		}
	}()
	if err := <-errc; err != nil {
		t.Fatalf("setns %s: %v", ns, err)
	}
}

type noLookup struct{}

func (noLookup) Lookup(context.Context, net.HardwareAddr) (boot.Assignment, error) {
	return boot.Assignment{}, boot.ErrNotFound
}

// TestTFTPListensOnProvisioningInterfaceOnly: the controller in a
// namespace with two interfaces, the provisioning one (p0, 10.81.0.1, DHCP
// on it) and a management one (m0, 10.82.0.1). With no TFTP address
// configured, TFTP answers on the provisioning address and not on the
// management one, as the DHCP server answers only there. Before, TFTP
// listened on ":69" and served both.
func TestTFTPListensOnProvisioningInterfaceOnly(t *testing.T) {
	peertest.Root(t, "network namespaces")
	peertest.Command(t, "ip")
	srv, cli := newNetns(t, "s"), newNetns(t, "c")
	for _, l := range []struct{ sif, cif, sip, cip string }{{"p0", "c0", "10.81.0.1/24", "10.81.0.2/24"}, {"m0", "c1", "10.82.0.1/24", "10.82.0.2/24"}} {
		nsRun(t, "-n", srv, "link", "add", l.sif, "type", "veth", "peer", "name", l.cif, "netns", cli)
		nsRun(t, "-n", srv, "addr", "add", l.sip, "dev", l.sif)
		nsRun(t, "-n", cli, "addr", "add", l.cip, "dev", l.cif)
		nsRun(t, "-n", srv, "link", "set", l.sif, "up")
		nsRun(t, "-n", cli, "link", "set", l.cif, "up")
	}
	root := t.TempDir()
	want := bytes.Repeat([]byte("ipxe"), 4096)
	if err := os.WriteFile(filepath.Join(root, "undionly.kpxe"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan error, 1)
	done := make(chan struct{})
	inNetns(t, srv, func() {
		defer close(done)
		runs, err := startNetboot(NetbootConfig{Interfaces: []string{"p0"}, Mode: dhcp.ModeProxy, TFTPRoot: root}, noLookup{}, "http://10.81.0.1:8080", false, nil, nil, secureBootTFTP{}, log)
		started <- err
		if err != nil {
			return
		}
		// DHCP opened its sockets in Listen; TFTP opens one per transfer
		// from the goroutine that runs Serve, so it runs on this thread.
		for _, r := range runs[:len(runs)-1] {
			go func() { _ = r(ctx) }()
		}
		_ = runs[len(runs)-1](ctx)
	})
	t.Cleanup(func() { cancel(); <-done })
	if err := <-started; err != nil {
		t.Fatalf("startNetboot: %v", err)
	}

	get := func(addr string) ([]byte, error) {
		type res struct {
			b   []byte
			err error
		}
		rc := make(chan res, 1)
		inNetns(t, cli, func() {
			c, err := ptftp.NewClient(addr)
			if err != nil {
				rc <- res{nil, err}
				return
			}
			c.SetTimeout(500 * time.Millisecond)
			c.SetRetries(2)
			wt, err := c.Receive("undionly.kpxe", "octet")
			if err != nil {
				rc <- res{nil, err}
				return
			}
			var buf bytes.Buffer
			_, err = wt.WriteTo(&buf)
			rc <- res{buf.Bytes(), err}
		})
		r := <-rc
		return r.b, r.err
	}
	got, err := get("10.81.0.1:69")
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("TFTP from the provisioning address: %d bytes, %v; want %d bytes", len(got), err, len(want))
	}
	if got, err := get("10.82.0.1:69"); err == nil {
		t.Errorf("TFTP answered on the management address: %d bytes", len(got))
	} else if errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}
