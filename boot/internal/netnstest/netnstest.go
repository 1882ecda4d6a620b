// Package netnstest creates throw-away network namespaces for the boot
// servers' tests: a server namespace and a client namespace joined by a veth
// pair, or one namespace with a bridge and tap devices for qemu. Names carry
// the issue number and a random suffix ("m6-ab12cd-s"); everything is deleted
// in t.Cleanup. Tests that need root or a missing command fail naming what to
// do (internal/peertest); only the quick mode skips.
package netnstest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/machina-metal/machina/internal/peertest"
)

// RequireRoot fails t (skips it in the quick mode) when not root.
func RequireRoot(t testing.TB) {
	t.Helper()
	peertest.Root(t, "network namespaces")
}

// RequireCommand fails t (skips it in the quick mode) when name is not in
// PATH, naming its Debian package.
func RequireCommand(t testing.TB, name string) string {
	t.Helper()
	return peertest.Command(t, name)
}

// Run runs a command and fails t with its output on error.
func Run(t testing.TB, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// Pair is two namespaces joined by a veth pair: Server ("vs0", with
// ServerCIDR) and Client ("vc0", no address).
type Pair struct {
	Server, Client string // namespace names
	ServerIf       string // "vs0"
	ClientIf       string // "vc0"
}

func suffix() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// NewPair creates the namespaces, veth pair and server address serverCIDR
// (e.g. "10.66.0.1/24"), with loopback up on both sides.
func NewPair(t testing.TB, serverCIDR string) *Pair {
	t.Helper()
	RequireRoot(t)
	RequireCommand(t, "ip")
	sfx := suffix()
	p := &Pair{Server: "m6-" + sfx + "-s", Client: "m6-" + sfx + "-c", ServerIf: "vs0", ClientIf: "vc0"}
	Run(t, "ip", "netns", "add", p.Server)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", p.Server).Run() })
	Run(t, "ip", "netns", "add", p.Client)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", p.Client).Run() })
	noDAD(t, p.Server)
	noDAD(t, p.Client)
	Run(t, "ip", "-n", p.Server, "link", "add", p.ServerIf, "type", "veth", "peer", "name", p.ClientIf, "netns", p.Client)
	Run(t, "ip", "-n", p.Server, "addr", "add", serverCIDR, "dev", p.ServerIf)
	for _, c := range [][]string{
		{"-n", p.Server, "link", "set", "lo", "up"}, {"-n", p.Server, "link", "set", p.ServerIf, "up"},
		{"-n", p.Client, "link", "set", "lo", "up"}, {"-n", p.Client, "link", "set", p.ClientIf, "up"},
	} {
		Run(t, "ip", c...)
	}
	return p
}

// noDAD turns off IPv6 duplicate address detection for links created later
// in ns, so link-local addresses are usable as soon as a link has carrier
// (no waiting in tests; nothing else shares these private segments).
func noDAD(t testing.TB, ns string) {
	t.Helper()
	// /proc/sys/net is per network namespace; no dependency on procps' sysctl.
	Run(t, "ip", "netns", "exec", ns, "sh", "-c",
		"echo 0 > /proc/sys/net/ipv6/conf/all/accept_dad && echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad")
}

// Bridge is one namespace with bridge "br0" (address BridgeCIDR) and taps
// "tap0".."tapN-1" enslaved to it, for qemu guests.
type Bridge struct {
	NS   string
	Taps []string
}

// NewBridge creates the namespace, bridge and taps. STP is off, so ports
// forward at once.
func NewBridge(t testing.TB, bridgeCIDR string, taps int) *Bridge {
	t.Helper()
	RequireRoot(t)
	RequireCommand(t, "ip")
	b := &Bridge{NS: "m6-" + suffix() + "-b"}
	Run(t, "ip", "netns", "add", b.NS)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", b.NS).Run() })
	noDAD(t, b.NS)
	Run(t, "ip", "-n", b.NS, "link", "set", "lo", "up")
	Run(t, "ip", "-n", b.NS, "link", "add", "br0", "type", "bridge")
	Run(t, "ip", "-n", b.NS, "addr", "add", bridgeCIDR, "dev", "br0")
	Run(t, "ip", "-n", b.NS, "link", "set", "br0", "up")
	for i := range taps {
		tap := fmt.Sprintf("tap%d", i)
		Run(t, "ip", "-n", b.NS, "tuntap", "add", "dev", tap, "mode", "tap")
		Run(t, "ip", "-n", b.NS, "link", "set", tap, "master", "br0")
		Run(t, "ip", "-n", b.NS, "link", "set", tap, "up")
		b.Taps = append(b.Taps, tap)
	}
	return b
}

// Do runs fn on an OS thread switched into namespace ns. Sockets fn opens
// stay in ns after Do returns. If switching back fails, the thread is left
// locked so the Go runtime discards it.
func Do(ns string, fn func() error) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open current netns: %w", err)
	}
	defer orig.Close()
	target, err := os.Open("/run/netns/" + ns)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open netns %s: %w", ns, err)
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

// Go runs fn in a new goroutine on an OS thread switched into namespace ns
// and left there: the goroutine never unlocks the thread, so the runtime
// discards it when fn returns. Use it for servers that open sockets while
// serving (TFTP opens one per transfer).
func Go(ns string, fn func()) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		target, err := os.Open("/run/netns/" + ns)
		if err != nil {
			errc <- fmt.Errorf("open netns %s: %w", ns, err)
			return
		}
		err = unix.Setns(int(target.Fd()), unix.CLONE_NEWNET)
		target.Close()
		errc <- err
		if err == nil {
			fn()
		}
	}()
	return <-errc
}

// WaitLinkLocal waits (up to 10 s, checking every 20 ms) until ifname in ns
// has a usable IPv6 link-local address; the kernel adds it asynchronously
// once the link has carrier.
func WaitLinkLocal(t testing.TB, ns, ifname string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		out, err := exec.Command("ip", "-n", ns, "-6", "addr", "show", "dev", ifname, "scope", "link").CombinedOutput()
		if err == nil && strings.Contains(string(out), "inet6 fe80:") && !strings.Contains(string(out), "tentative") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s in %s has no link-local address: %s", ifname, ns, out)
		}
		<-tick.C
	}
}

// Command returns an exec.Cmd running name inside namespace ns.
func Command(ns, name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", ns, name}, args...)...)
}
