package ha

import (
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/boot/dhcp"
	"github.com/machina-metal/machina/internal/etcdtest"
	"github.com/machina-metal/machina/state"
)

// TestLeaseAndTokenAcrossTakeover: what leader a handed a machine is
// honoured by b after a dies, because it lives in etcd, not in a. Two
// fenced candidates on etcd, each with its own state store; a leads, holds
// the VIP and serves DHCP from its store, and a machine namespace's busybox
// udhcpc binds 10.77.0.101 from it (.100 is leased to another MAC, so the
// machine's address is not the first free one); a mints the machine's
// report token. Then a dies (its DHCP server stops and the VIP goes, its
// etcd client closes without resigning, so its election lease lapses) and
// the other MAC's lease is removed. b is elected, takes the VIP, and its
// DHCP server, loading the leases from etcd, answers the machine's unicast
// renewal and a fresh DISCOVER with .101 (a server that did not know a's
// lease would offer .100, first free); b's store accepts a's token once
// and refuses it the second time.
func TestLeaseAndTokenAcrossTakeover(t *testing.T) {
	l := newLab(t)
	run(t, "ip", "-n", l.a, "addr", "add", "10.77.0.2/24", "dev", "eth0")
	run(t, "ip", "-n", l.b, "addr", "add", "10.77.0.3/24", "dev", "eth0")
	run(t, "ip", "-n", l.m, "addr", "add", "10.77.0.50/24", "dev", "eth0")
	const vipAddr = "10.77.0.10"
	vipPfx := netip.MustParsePrefix(vipAddr + "/24")
	macM := mac(t, l.m)
	const other = "52:54:00:ff:ff:01"

	cl := etcdtest.Start(t, etcdtest.Options{Members: 1})
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	ops, err := state.OpenEtcd(state.EtcdConfig{Client: cl.Client(t), Prefix: "/site/"}, state.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ops.Close() })
	if _, err := ops.CreateServer(state.Server{Name: "r1-n01", BootMAC: macM.String()}); err != nil {
		t.Fatal(err)
	}
	if err := ops.PutLease(state.Lease{MAC: other, IP: netip.MustParseAddr("10.77.0.100"), Expires: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}

	ca, err := clientv3.New(cl.Config())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ca.Close() })
	a := startFenced(t, "a", ca)
	a.waitElected(t, 10*time.Second)
	b := startFenced(t, "b", cl.Client(t))
	waitLeader(t, b.cand, "a")

	var look boot.MemLookup
	if err := look.Set(boot.Assignment{MAC: macM, Lifecycle: boot.LifecycleReady, Hostname: "r1-n01"}); err != nil {
		t.Fatal(err)
	}
	dcfg := func(st *state.Store) dhcp.Config {
		return dhcp.Config{
			ServerIP: netip.MustParseAddr(vipAddr), Subnet: netip.MustParsePrefix("10.77.0.0/24"),
			PoolStart: netip.MustParseAddr("10.77.0.100"), PoolEnd: netip.MustParseAddr("10.77.0.150"),
			Leases: api.StateLeases{Store: st}, LeaseTime: 10 * time.Minute, Lookup: &look,
			Boot: dhcp.BootFiles{ScriptURL: "http://" + vipAddr + ":8080/boot/ipxe"},
		}
	}
	newHolder := func(name, ns string) *holder {
		v, err := NewVIP(VIPConfig{Prefix: vipPfx, Interface: "eth0", Interval: 100 * time.Millisecond, Logger: log.With("holder", name)})
		if err != nil {
			t.Fatal(err)
		}
		return &holder{name: name, ns: ns, vip: v}
	}
	ha, hb := newHolder("a", l.a), newHolder("b", l.b)

	ha.acquire(t, dcfg(a.store))
	cmd, next := udhcpc(t, l.m)
	if bound := next("EVENT bound"); !strings.Contains(bound, "ip=10.77.0.101 ") || !strings.Contains(bound, "serverid="+vipAddr) {
		t.Fatalf("bound from a: %q, want ip=10.77.0.101 serverid=%s", bound, vipAddr)
	}
	if ip, ok := ops.LeasedIP(macM.String()); !ok || ip.String() != "10.77.0.101" {
		t.Fatalf("lease in etcd after a's ACK: %v %v, want 10.77.0.101", ip, ok)
	}
	value, _, err := a.store.IssueToken(state.TokenSpec{Purpose: state.PurposeReport, Server: "r1-n01"})
	if err != nil {
		t.Fatal(err)
	}

	// a dies: its boot services stop, its client goes without resigning.
	ha.release(t)
	killed := time.Now()
	_ = ca.Close()
	if err := ops.DeleteLease(other); err != nil {
		t.Fatal(err)
	}
	b.waitElected(t, testTTL+5*time.Second)
	t.Logf("b elected %s after a's client closed", time.Since(killed).Round(10*time.Millisecond))
	hb.acquire(t, dcfg(b.store))

	// The machine's renewal, unicast to the VIP (option 54; the machine
	// has no neighbour entry for it yet, udhcpc bound over a raw socket,
	// so it ARPs and b answers), answered by b.
	run(t, "ip", "-n", l.m, "addr", "add", "10.77.0.101/24", "dev", "eth0")
	_ = cmd.Process.Signal(syscall.SIGUSR1)
	if renew := next("EVENT renew"); !strings.Contains(renew, "ip=10.77.0.101 ") || !strings.Contains(renew, "serverid="+vipAddr) {
		t.Fatalf("renew event %q, want ip=10.77.0.101 serverid=%s", renew, vipAddr)
	}
	if st := hb.dhcp.Stats(); st.Acks < 1 || st.Naks != 0 {
		t.Fatalf("b's DHCP stats %+v: want the renewal ACKed, no NAK", st)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	run(t, "ip", "-n", l.m, "addr", "del", "10.77.0.101/24", "dev", "eth0")

	// A fresh DISCOVER (no requested address): b offers a's lease, not the
	// first free address.
	_, next2 := udhcpc(t, l.m)
	if bound := next2("EVENT bound"); !strings.Contains(bound, "ip=10.77.0.101 ") || !strings.Contains(bound, "serverid="+vipAddr) {
		t.Fatalf("bound from b: %q, want a's lease ip=10.77.0.101 serverid=%s", bound, vipAddr)
	}
	hb.release(t)

	// a's token, used on b: once.
	use := func(req string) error {
		_, _, _, err := b.store.UseToken(value, state.TokenUse{Claim: state.TokenClaim{Purpose: state.PurposeReport, Server: "r1-n01"},
			Request: state.RequestFingerprint([]byte(req)),
			Effect:  func(*state.Tx, state.Token) (state.Answer, error) { return state.Answer{Status: 200}, nil }})
		return err
	}
	if err := use("first"); err != nil {
		t.Fatalf("b using the token a minted: %v", err)
	}
	if err := use("second"); !errors.Is(err, state.ErrTokenUsed) {
		t.Fatalf("second use on b = %v, want ErrTokenUsed", err)
	}
}
