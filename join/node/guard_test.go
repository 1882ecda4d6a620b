package node_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/join/node"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// mgmtLab is a host namespace whose only NIC, eth0, carries its management
// address 10.77.0.2/24 and default route via 10.77.0.1, cabled by a veth
// pair to a controller namespace (10.77.0.1) where a TCP listener stands
// for the controller: each connection gets "ok\n".
type mgmtLab struct {
	h      *netlink.Handle // in the host namespace
	hostNS netns.NsHandle
	ctl    string // the listener's address
}

func newMgmtLab(t *testing.T) *mgmtLab {
	t.Helper()
	needRoot(t, "ip")
	sfx := rnd()
	host, ctl := "m11-"+sfx+"-h", "m11-"+sfx+"-c"
	for _, ns := range []string{host, ctl} {
		run(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	run(t, "ip", "-n", ctl, "link", "add", "vc0", "type", "veth", "peer", "name", "eth0", "netns", host)
	run(t, "ip", "-n", ctl, "addr", "add", "10.77.0.1/24", "dev", "vc0")
	run(t, "ip", "-n", ctl, "link", "set", "vc0", "up")
	run(t, "ip", "-n", host, "addr", "add", "10.77.0.2/24", "dev", "eth0")
	run(t, "ip", "-n", host, "link", "set", "eth0", "up")
	run(t, "ip", "-n", host, "route", "add", "default", "via", "10.77.0.1")
	l := &mgmtLab{}
	var ln net.Listener
	inNS(t, ctl, func() error {
		var err error
		ln, err = net.Listen("tcp", "10.77.0.1:0")
		return err
	})
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("ok\n"))
			c.Close()
		}
	}()
	l.ctl = ln.Addr().String()
	var err error
	if l.hostNS, err = netns.GetFromName(host); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.hostNS.Close() })
	if l.h, err = netlink.NewHandleAt(l.hostNS, unix.NETLINK_ROUTE); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.h.Close)
	ctlNS, err := netns.GetFromName(ctl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctlNS.Close() })
	hc, err := netlink.NewHandleAt(ctlNS, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hc.Close)
	waitOperUp(t, hc, "vc0")
	waitOperUp(t, l.h, "eth0")
	if err := l.reach(t.Context()); err != nil {
		t.Fatalf("controller not reachable from the host before any change: %v", err)
	}
	return l
}

// waitOperUp waits, up to 10 s, until link name (in h's namespace) is
// operationally up. `ip link set up` returns before a veth end carries
// traffic: the kernel's linkwatch brings the carrier up and swaps the noop
// qdisc (which drops every packet) for the real one later, up to a second
// later when link events are rate-limited, as on a loaded machine. A dial
// before then loses its ARP request or SYN, and its retransmission comes a
// second later: after reach's 1 s bound.
func waitOperUp(t *testing.T, h *netlink.Handle, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		lk, err := h.LinkByName(name)
		if err == nil && lk.Attrs().OperState == netlink.OperUp {
			return
		}
		if time.Now().After(deadline) {
			state := "absent"
			if err == nil {
				state = lk.Attrs().OperState.String()
			}
			t.Fatalf("link %s not operationally up after 10 s: %s", name, state)
		}
		<-tick.C
	}
}

// inNS runs fn on a thread in namespace ns; sockets fn opens stay there.
// The thread is never unlocked, so the runtime discards it.
func inNS(t *testing.T, ns string, fn func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open("/run/netns/" + ns)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	if err := <-errc; err != nil {
		t.Fatalf("in netns %s: %v", ns, err)
	}
}

// reach is one round trip from the host namespace to the controller,
// bounded by ctx and 1 s: the management path a heartbeat takes.
func (l *mgmtLab) reach(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread leaves with the goroutine
		if err := netns.Set(l.hostNS); err != nil {
			errc <- err
			return
		}
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", l.ctl)
		if err != nil {
			errc <- err
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err == nil && line != "ok\n" {
			err = fmt.Errorf("controller answered %q", line)
		}
		errc <- err
	}()
	return <-errc
}

// state is the host side as `ip` would show it: eth0's master and IPv4
// addresses, br0's IPv4 addresses (or "absent"), the default route's device.
func (l *mgmtLab) state(t *testing.T) string {
	t.Helper()
	v4 := func(name string) string {
		lk, err := l.h.LinkByName(name)
		if err != nil {
			return "absent"
		}
		as, _ := l.h.AddrList(lk, netlink.FAMILY_V4)
		var s []string
		for _, a := range as {
			s = append(s, a.IPNet.String())
		}
		return "[" + strings.Join(s, " ") + "]"
	}
	eth0, err := l.h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	master := "none"
	if m := eth0.Attrs().MasterIndex; m != 0 {
		ml, _ := l.h.LinkByIndex(m)
		master = ml.Attrs().Name
	}
	dflt := "none"
	rs, _ := l.h.RouteList(nil, netlink.FAMILY_V4)
	for _, r := range rs {
		if r.Dst == nil || r.Dst.String() == "0.0.0.0/0" {
			lk, _ := l.h.LinkByIndex(r.LinkIndex)
			dflt = lk.Attrs().Name + " via " + r.Gw.String()
		}
	}
	return fmt.Sprintf("eth0 master=%s addrs=%s; br0 addrs=%s; default dev %s", master, v4("eth0"), v4("br0"), dflt)
}

// TestJoinBridgeOverOnlyNICStaysReachable is the lab's failure: the
// profile's network bridges the host's only NIC, which carries the
// management address, with cidr set. The address and the default route
// move to the bridge (which takes the NIC's MAC), the cidr is not
// configured, the controller answers throughout the check and after, and
// the step is logged applied. Before, the cidr went on the bridge as an
// address, the NIC's address stayed on the enslaved NIC and the host
// stopped heartbeating.
func TestJoinBridgeOverOnlyNICStaysReachable(t *testing.T) {
	l := newMgmtLab(t)
	resp := v1.JoinResponse{Networks: []v1.JoinNetwork{{Name: "mgmt", Bridge: "br0", NIC: "eth0", CIDR: "10.77.0.0/24"}}}
	var steps []v1.JoinStep
	done := node.Apply(t.Context(), resp, l.h, nil, node.Guard{Reach: l.reach, Within: 10 * time.Second, Every: 100 * time.Millisecond},
		func(s v1.JoinStep) { steps = append(steps, s) })
	if !done.OK || len(steps) != 1 || !steps[0].OK {
		t.Fatalf("Apply = %+v, steps %+v; host %s", done, steps, l.state(t))
	}
	for _, want := range []string{"moved 10.77.0.2/24 from eth0 to br0", "moved route default via 10.77.0.1 to br0", "prefix 10.77.0.0/24: br0 has [10.77.0.2/24]"} {
		if !strings.Contains(steps[0].Message, want) {
			t.Errorf("step message %q lacks %q", steps[0].Message, want)
		}
	}
	if got, want := l.state(t), "eth0 master=br0 addrs=[]; br0 addrs=[10.77.0.2/24]; default dev br0 via 10.77.0.1"; got != want {
		t.Errorf("host after the join:\n got %s\nwant %s", got, want)
	}
	br, _ := l.h.LinkByName("br0")
	eth0, _ := l.h.LinkByName("eth0")
	if br.Attrs().HardwareAddr.String() != eth0.Attrs().HardwareAddr.String() {
		t.Errorf("br0 MAC %s, want eth0's %s", br.Attrs().HardwareAddr, eth0.Attrs().HardwareAddr)
	}
	for i := range 3 { // heartbeats after the join
		if err := l.reach(t.Context()); err != nil {
			t.Fatalf("heartbeat %d after the join: %v", i, err)
		}
	}
}

// TestGuardRollsBackCutOff: a change that cuts the host off (the old join
// step's: the NIC into a new bridge without its address, the prefix as the
// bridge's address) is rolled back by itself once the controller has not
// answered within the bound: eth0 has its address and default route back,
// the bridge is gone, and the controller answers again. Nothing changes
// when the controller does not answer before the change.
func TestGuardRollsBackCutOff(t *testing.T) {
	l := newMgmtLab(t)
	before := l.state(t)
	cut := func() error {
		la := netlink.NewLinkAttrs()
		la.Name = "br0"
		if err := l.h.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil {
			return err
		}
		br, err := l.h.LinkByName("br0")
		if err != nil {
			return err
		}
		eth0, err := l.h.LinkByName("eth0")
		if err != nil {
			return err
		}
		a, _ := netlink.ParseAddr("10.77.0.0/24")
		return errors.Join(l.h.LinkSetMaster(eth0, br), l.h.LinkSetUp(br), l.h.AddrReplace(br, a))
	}
	t0 := time.Now()
	err := node.ApplyGuarded(t.Context(), l.h, node.Guard{Reach: l.reach, Within: 5 * time.Second, Every: 100 * time.Millisecond}, cut)
	if !errors.Is(err, node.ErrCutOff) || !strings.Contains(err.Error(), "rolled back to the checkpoint; the controller answers again") {
		t.Fatalf("ApplyGuarded = %v, want ErrCutOff and a rollback after which the controller answers; host %s", err, l.state(t))
	}
	t.Logf("cut off, rolled back and answering again after %v: %v", time.Since(t0).Round(time.Millisecond), err)
	if got := l.state(t); got != before {
		t.Errorf("host after the rollback:\n got %s\nwant %s", got, before)
	}
	if err := l.reach(t.Context()); err != nil {
		t.Fatalf("controller after the rollback: %v", err)
	}

	unreachable := func(context.Context) error { return errors.New("connection refused") }
	changed := false
	err = node.ApplyGuarded(t.Context(), l.h, node.Guard{Reach: unreachable, Within: 300 * time.Millisecond}, func() error { changed = true; return nil })
	if !errors.Is(err, node.ErrUnreachableBefore) || changed {
		t.Fatalf("ApplyGuarded with the controller down before = %v (changed %v), want ErrUnreachableBefore and no change", err, changed)
	}
}

// TestApplyReportsRollback: when the controller stops answering after the
// networks are applied (here: a switch that drops the host once bridge
// br1 exists, standing in for any path the change breaks), every network
// is rolled back and logged failed with the applied summary and why, and
// the join fails naming it; the bridges are gone.
func TestApplyReportsRollback(t *testing.T) {
	l := newMgmtLab(t)
	addDummy(t, l.h, "eth1")
	reach := func(ctx context.Context) error {
		if _, err := l.h.LinkByName("br1"); err == nil {
			return errors.New("i/o timeout")
		}
		return l.reach(ctx)
	}
	resp := v1.JoinResponse{Networks: []v1.JoinNetwork{{Name: "mgmt", Bridge: "br0", NIC: "eth0"}, {Name: "vms", Bridge: "br1", NIC: "eth1"}}}
	var steps []v1.JoinStep
	done := node.Apply(t.Context(), resp, l.h, nil, node.Guard{Reach: reach, Within: 5 * time.Second, Every: 100 * time.Millisecond},
		func(s v1.JoinStep) { steps = append(steps, s) })
	if done.OK || !strings.Contains(done.Reason, "network mgmt: "+node.ErrCutOff.Error()) {
		t.Fatalf("Apply = %+v, want failed with the cut-off", done)
	}
	if len(steps) != 2 {
		t.Fatalf("steps = %+v, want both networks", steps)
	}
	for _, s := range steps {
		if s.OK || !strings.Contains(s.Message, "then "+node.ErrCutOff.Error()) || !strings.Contains(s.Message, "rolled back to the checkpoint") {
			t.Errorf("step %+v, want failed: applied, then cut off and rolled back", s)
		}
	}
	for _, br := range []string{"br0", "br1"} {
		if _, err := l.h.LinkByName(br); err == nil {
			t.Errorf("%s still there after the rollback", br)
		}
	}
	if got, want := l.state(t), "eth0 master=none addrs=[10.77.0.2/24]; br0 addrs=absent; default dev eth0 via 10.77.0.1"; got != want {
		t.Errorf("host after the rollback:\n got %s\nwant %s", got, want)
	}
}
