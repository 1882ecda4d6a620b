package ha

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/machina-metal/machina/internal/peertest"
)

// lab is one L2 segment for the VIP tests: namespace sw holds bridge br0;
// controller namespaces a and b and machine namespace m each have eth0, the
// far end of a veth pair whose other end is a port of br0. Names carry the
// issue number and a random suffix; everything is deleted in t.Cleanup.
type lab struct {
	sw, a, b, m string
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func newLab(t testing.TB) *lab {
	t.Helper()
	peertest.Root(t, "network namespaces")
	peertest.Command(t, "ip")
	var r [3]byte
	_, _ = rand.Read(r[:])
	sfx := hex.EncodeToString(r[:])
	l := &lab{sw: "i20-" + sfx + "-sw", a: "i20-" + sfx + "-a", b: "i20-" + sfx + "-b", m: "i20-" + sfx + "-m"}
	for _, ns := range []string{l.sw, l.a, l.b, l.m} {
		run(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	run(t, "ip", "-n", l.sw, "link", "add", "br0", "type", "bridge")
	run(t, "ip", "-n", l.sw, "link", "set", "br0", "up")
	for i, ns := range []string{l.a, l.b, l.m} {
		port := fmt.Sprintf("p%d", i)
		run(t, "ip", "-n", l.sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
		run(t, "ip", "-n", l.sw, "link", "set", port, "master", "br0")
		run(t, "ip", "-n", l.sw, "link", "set", port, "up")
		run(t, "ip", "-n", ns, "link", "set", "eth0", "up")
	}
	return l
}

// inNS runs fn on an OS thread switched into namespace ns; sockets fn opens
// stay in ns. If switching back fails the thread stays locked, so the
// runtime discards it.
func inNS(ns string, fn func() error) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns %s: %w", ns, err)
	}
	ferr := fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("setns back: %w (fn: %v)", err, ferr)
	}
	runtime.UnlockOSThread()
	return ferr
}

// mac returns eth0's hardware address in ns.
func mac(t testing.TB, ns string) net.HardwareAddr {
	t.Helper()
	var hw net.HardwareAddr
	if err := inNS(ns, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err == nil {
			hw = ifi.HardwareAddr
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return hw
}

// neighbour returns the lladdr of ip in ns's neighbour table ("" if none),
// from `ip neigh show`.
func neighbour(t testing.TB, ns, ip string) string {
	t.Helper()
	f := strings.Fields(run(t, "ip", "-n", ns, "neigh", "show", ip, "dev", "eth0"))
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "lladdr" {
			return f[i+1]
		}
	}
	return ""
}

// waitNeighbour waits up to 10 s (polling every 20 ms) until ns's neighbour
// entry for ip is want.
func waitNeighbour(t testing.TB, ns, ip, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := neighbour(t, ns, ip)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("neighbour entry for %s in %s is %q, want %q:\n%s", ip, ns, got, want, run(t, "ip", "-n", ns, "neigh", "show"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func addrs(t testing.TB, ns string) string {
	t.Helper()
	return run(t, "ip", "-n", ns, "-4", "addr", "show", "dev", "eth0")
}
