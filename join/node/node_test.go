package node_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/join/node"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

func needRoot(t *testing.T, tools ...string) {
	t.Helper()
	peertest.Root(t, "network namespaces, loop devices, LVM")
	peertest.Commands(t, tools...)
}

func rnd() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "LVM_SUPPRESS_FD_WARNINGS=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// netnsHandle creates a named network namespace m11-<rand> (bind-mounted
// under /var/run/netns, like `ip netns add`) and returns a netlink handle
// inside it; both are removed when the test ends.
func netnsHandle(t *testing.T) *netlink.Handle {
	t.Helper()
	name := "m11-" + rnd()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	ns, err := netns.NewNamed(name) // switches this thread into it
	if serr := netns.Set(orig); serr != nil {
		t.Fatalf("return to the test's namespace: %v", serr) // thread stays locked: Go discards it
	}
	orig.Close()
	runtime.UnlockOSThread()
	if err != nil {
		t.Fatalf("create netns %s: %v", name, err)
	}
	t.Cleanup(func() {
		ns.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("delete netns %s: %v", name, err)
		}
	})
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func addDummy(t *testing.T, h *netlink.Handle, name string) {
	t.Helper()
	// A veth pair (this kernel may lack the dummy module); the peer stays
	// outside the bridge.
	la := netlink.NewLinkAttrs()
	la.Name = name
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: name + "p"}); err != nil {
		t.Fatalf("add veth %s: %v", name, err)
	}
}

func TestApplyBridgeInNetns(t *testing.T) {
	needRoot(t)
	h := netnsHandle(t)
	addDummy(t, h, "eth2")
	addDummy(t, h, "notbr")
	n := v1.JoinNetwork{Name: "mgmt", Bridge: "br-mgmt", NIC: "eth2", CIDR: "10.30.0.7/16"}
	msg, err := node.ApplyNetwork(h, n)
	if err != nil || !strings.Contains(msg, "created bridge br-mgmt") || !strings.Contains(msg, "enslaved eth2 to br-mgmt") {
		t.Fatalf("ApplyNetwork = %q, %v", msg, err)
	}
	br, err := h.LinkByName("br-mgmt")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := br.(*netlink.Bridge); !ok || br.Attrs().Flags&net.FlagUp == 0 {
		t.Fatalf("br-mgmt = %s flags %v, want an up bridge", br.Type(), br.Attrs().Flags)
	}
	eth2, _ := h.LinkByName("eth2")
	if eth2.Attrs().MasterIndex != br.Attrs().Index {
		t.Fatal("eth2 not enslaved to br-mgmt")
	}
	// The CIDR is the network's prefix, for validation and reporting: it
	// is never configured as an address (a lab host lost its controller
	// when it was).
	addrs, err := h.AddrList(br, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 0 || !strings.Contains(msg, "prefix 10.30.0.0/16: br-mgmt has no address in it") {
		t.Fatalf("br-mgmt addresses = %v, %v; summary %q", addrs, err, msg)
	}
	if msg, err := node.ApplyNetwork(h, n); err != nil || !strings.Contains(msg, "already in place") {
		t.Fatalf("re-apply = %q, %v", msg, err)
	}
	if _, err := node.ApplyNetwork(h, v1.JoinNetwork{Name: "x", Bridge: "notbr", NIC: "eth2"}); !errors.Is(err, node.ErrLinkConflict) {
		t.Fatalf("bridge over a veth = %v, want ErrLinkConflict", err)
	}
	if _, err := node.ApplyNetwork(h, v1.JoinNetwork{Name: "y", Bridge: "br-y", NIC: "eth9"}); err == nil || !strings.Contains(err.Error(), "NIC eth9") {
		t.Fatalf("missing NIC = %v", err)
	}
}

func TestApplyDirPool(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	p := v1.JoinPool{Name: "images", Type: v1.PoolDir, Path: dir}
	msg, err := node.ApplyPool(t.Context(), nil, p)
	if err != nil || !strings.Contains(msg, "created directory") {
		t.Fatalf("ApplyPool = %q, %v", msg, err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o750 {
		t.Fatalf("pool dir: %v", err)
	}
	if msg, err := node.ApplyPool(t.Context(), nil, p); err != nil || !strings.Contains(msg, "already in place") {
		t.Fatalf("re-apply = %q, %v", msg, err)
	}
	file := filepath.Join(t.TempDir(), "f")
	os.WriteFile(file, nil, 0o600)
	if _, err := node.ApplyPool(t.Context(), nil, v1.JoinPool{Name: "f", Type: v1.PoolDir, Path: file}); !errors.Is(err, node.ErrPoolConflict) {
		t.Fatalf("pool over a file = %v, want ErrPoolConflict", err)
	}
}

// recRunner records commands and runs them.
type recRunner struct{ cmds []string }

func (r *recRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	r.cmds = append(r.cmds, name+" "+strings.Join(args, " "))
	return node.ExecRunner{}.Run(ctx, name, args...)
}

// loopDevice attaches a 64 MiB file to a free loop device, detached at cleanup.
func loopDevice(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "disk.img")
	run(t, "truncate", "-s", "64M", f)
	dev := strings.TrimSpace(run(t, "losetup", "--find", "--show", f))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
	return dev
}

func TestApplyLVMPoolOnLoop(t *testing.T) {
	needRoot(t, "losetup", "vgcreate", "pvs", "vgremove", "truncate")
	d1, d2 := loopDevice(t), loopDevice(t)
	vg := "m11vg" + rnd()
	t.Cleanup(func() {
		_ = exec.Command("vgremove", "-f", vg).Run()
		_ = exec.Command("pvremove", "-ff", "-y", d1, d2).Run()
	})
	r := &recRunner{}
	p := v1.JoinPool{Name: vg, Type: v1.PoolLVM, Disks: []string{d1, d2}}
	msg, err := node.ApplyPool(t.Context(), r, p)
	if err != nil {
		t.Fatalf("ApplyPool: %v", err)
	}
	if !strings.Contains(msg, "created volume group") {
		t.Fatalf("ApplyPool = %q", msg)
	}
	out := run(t, "vgs", "--noheadings", "-o", "vg_name,pv_count", vg)
	if f := strings.Fields(out); len(f) != 2 || f[0] != vg || f[1] != "2" {
		t.Fatalf("vgs = %q, want %s with 2 PVs", out, vg)
	}
	if want := "vgcreate " + vg + " " + d1 + " " + d2; r.cmds[len(r.cmds)-1] != want {
		t.Fatalf("last command %q, want %q", r.cmds[len(r.cmds)-1], want)
	}
	// Idempotent re-apply runs no vgcreate.
	r.cmds = nil
	if msg, err := node.ApplyPool(t.Context(), r, p); err != nil || !strings.Contains(msg, "already on") {
		t.Fatalf("re-apply = %q, %v", msg, err)
	}
	for _, c := range r.cmds {
		if strings.HasPrefix(c, "vgcreate") {
			t.Fatalf("re-apply ran %q", c)
		}
	}
	// The same VG on other disks, or a disk of this VG for another VG, conflict.
	if _, err := node.ApplyPool(t.Context(), r, v1.JoinPool{Name: vg, Type: v1.PoolLVM, Disks: []string{d1}}); !errors.Is(err, node.ErrPoolConflict) {
		t.Fatalf("VG on fewer disks = %v, want ErrPoolConflict", err)
	}
	if _, err := node.ApplyPool(t.Context(), r, v1.JoinPool{Name: vg + "x", Type: v1.PoolLVM, Disks: []string{d2}}); !errors.Is(err, node.ErrPoolConflict) {
		t.Fatalf("disk of another VG = %v, want ErrPoolConflict", err)
	}
}

func TestApplyReportsEveryStep(t *testing.T) {
	needRoot(t)
	h := netnsHandle(t)
	addDummy(t, h, "eth1")
	pool := filepath.Join(t.TempDir(), "p")
	resp := v1.JoinResponse{
		Networks: []v1.JoinNetwork{{Name: "bad", Bridge: "br-bad", NIC: "eth7"}, {Name: "ok", Bridge: "br0", NIC: "eth1"}},
		Pools:    []v1.JoinPool{{Name: "p", Type: v1.PoolDir, Path: pool}},
	}
	var steps []v1.JoinStep
	done := node.Apply(t.Context(), resp, h, nil, node.Guard{}, func(s v1.JoinStep) { steps = append(steps, s) })
	if done.OK || !strings.Contains(done.Reason, "network bad") {
		t.Fatalf("Apply = %+v, want failed on network bad", done)
	}
	if len(steps) != 3 || steps[0].OK || !steps[1].OK || !steps[2].OK {
		t.Fatalf("steps = %+v, want bad failed, ok and p applied", steps)
	}
	if _, err := h.LinkByName("br0"); err != nil {
		t.Fatalf("later step not applied: %v", err)
	}
}
