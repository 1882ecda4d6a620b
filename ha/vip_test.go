package ha

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/boot/dhcp"
	"github.com/machina-metal/machina/internal/peertest"
)

func TestNewVIPValidates(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  VIPConfig
		want string
	}{
		{"no prefix", VIPConfig{Interface: "eth0"}, "address/prefix is required"},
		{"ipv6", VIPConfig{Prefix: netip.MustParsePrefix("fd00::2/64"), Interface: "eth0"}, "only IPv4"},
		{"multicast", VIPConfig{Prefix: netip.MustParsePrefix("224.0.0.5/24"), Interface: "eth0"}, "not a unicast"},
		{"no interface", VIPConfig{Prefix: netip.MustParsePrefix("10.0.0.2/24")}, "not a valid interface name"},
		{"slash", VIPConfig{Prefix: netip.MustParsePrefix("10.0.0.2/24"), Interface: "a/b"}, "not a valid interface name"},
		{"space", VIPConfig{Prefix: netip.MustParsePrefix("10.0.0.2/24"), Interface: "a b"}, "not a valid interface name"},
		{"long", VIPConfig{Prefix: netip.MustParsePrefix("10.0.0.2/24"), Interface: "abcdefghijklmnop"}, "not a valid interface name"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewVIP(c.cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("NewVIP(%+v) = %v, want error containing %q", c.cfg, err, c.want)
			}
		})
	}
}

func TestGARPFrame(t *testing.T) {
	hw := net.HardwareAddr{0x52, 0x54, 0, 1, 2, 3}
	b := garpFrame(hw, netip.MustParseAddr("10.1.2.3"), 1, net.HardwareAddr{0, 0, 0, 0, 0, 0})
	want := "ffffffffffff" + "525400010203" + "0806" + "0001" + "0800" + "06" + "04" + "0001" + "525400010203" + "0a010203" + "000000000000" + "0a010203"
	if got := fmt.Sprintf("%x", b); got != want {
		t.Fatalf("garpFrame = %s, want %s", got, want)
	}
}

// holder is what one controller namespace runs while it holds the VIP: the
// project's DHCP server answering as the VIP, and an HTTP server that
// answers iPXE-shaped GETs with its name. The HTTP server keeps running
// after Release, so a GET that reaches the old holder would show.
type holder struct {
	name string
	ns   string
	vip  *VIP
	dhcp *dhcp.Server
	stop context.CancelFunc
	done chan error

	mu   sync.Mutex
	gets []string // "UA path" of every GET served
}

func (h *holder) serveHTTP(t *testing.T) {
	t.Helper()
	var ln net.Listener
	if err := inNS(h.ns, func() error {
		var err error
		ln, err = net.Listen("tcp4", "0.0.0.0:8080")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		h.gets = append(h.gets, r.UserAgent()+" "+r.URL.RequestURI())
		h.mu.Unlock()
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "#!ipxe\necho holder=%s\n", h.name)
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
}

func (h *holder) acquire(t *testing.T, cfg dhcp.Config) {
	t.Helper()
	if err := inNS(h.ns, func() error { return h.vip.Acquire(context.Background()) }); err != nil {
		t.Fatal(err)
	}
	cfg.Interfaces = []string{"eth0"}
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})).With("holder", h.name)
	if err := inNS(h.ns, func() error {
		var err error
		if h.dhcp, err = dhcp.New(cfg); err != nil {
			return err
		}
		return h.dhcp.Listen(context.Background())
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.stop, h.done = cancel, make(chan error, 1)
	go func() { h.done <- h.dhcp.Serve(ctx) }()
}

func (h *holder) release(t *testing.T) {
	t.Helper()
	if h.stop != nil {
		h.stop()
		if err := <-h.done; err != nil {
			t.Errorf("%s: DHCP Serve after cancel: %v", h.name, err)
		}
		h.stop = nil
	}
	if err := inNS(h.ns, h.vip.Release); err != nil {
		t.Fatal(err)
	}
}

func (h *holder) served() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.gets...)
}

// udhcpc runs busybox udhcpc in ns on eth0 and returns its script's
// event lines ("EVENT bound ip=… serverid=…") and the process.
func udhcpc(t *testing.T, ns string) (*exec.Cmd, func(prefix string) string) {
	t.Helper()
	bin := peertest.Command(t, "udhcpc")
	script := filepath.Join(t.TempDir(), "udhcpc.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho \"EVENT $1 ip=$ip serverid=$serverid\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", ns, bin, "-f", "-i", "eth0", "-s", script, "-t", "5", "-T", "1")
	cmd.Stderr = t.Output()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// ip netns exec execs udhcpc in place, so this PID is udhcpc's.
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return cmd, func(prefix string) string {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("udhcpc exited before %q", prefix)
				}
				t.Logf("udhcpc: %s", l)
				if strings.HasPrefix(l, prefix) {
					return l
				}
			case <-timeout:
				t.Fatalf("timed out waiting for udhcpc %q", prefix)
			}
		}
	}
}

// ipxeGET fetches url from namespace ns the way iPXE's HTTP client asks
// (HTTP/1.1, User-Agent iPXE/<version>, Connection: keep-alive), with curl.
func ipxeGET(t *testing.T, ns, url string) string {
	t.Helper()
	bin := peertest.Command(t, "curl")
	out, err := exec.Command("ip", "netns", "exec", ns, bin, "-sS", "--max-time", "10", "--http1.1",
		"-A", "iPXE/1.21.1+ (g4bd064de)", "-H", "Connection: keep-alive", url).CombinedOutput()
	if err != nil {
		t.Fatalf("GET %s from %s: %v\n%s", url, ns, err, out)
	}
	return string(out)
}

// TestVIPMovesBetweenNamespaces moves the provisioning VIP from controller
// namespace a to b across a bridge and checks what a machine on the
// segment sees: its neighbour entry for the VIP changes to b's MAC from
// b's gratuitous ARP alone (the machine sends nothing in between), a DHCP
// renewal unicast to the VIP (option 54) and a fresh DORA by busybox
// udhcpc are answered by b's DHCP server, and an iPXE-shaped GET to the VIP
// reaches b's HTTP server, not a's (still listening).
func TestVIPMovesBetweenNamespaces(t *testing.T) {
	l := newLab(t)
	run(t, "ip", "-n", l.a, "addr", "add", "10.77.0.2/24", "dev", "eth0")
	run(t, "ip", "-n", l.b, "addr", "add", "10.77.0.3/24", "dev", "eth0")
	run(t, "ip", "-n", l.m, "addr", "add", "10.77.0.50/24", "dev", "eth0")
	const vipAddr = "10.77.0.10"
	vipPfx := netip.MustParsePrefix(vipAddr + "/24")
	macA, macB, macM := mac(t, l.a), mac(t, l.b), mac(t, l.m)

	var look boot.MemLookup
	if err := look.Set(boot.Assignment{MAC: macM, Lifecycle: boot.LifecycleReady, Hostname: "r1-n01"}); err != nil {
		t.Fatal(err)
	}
	dcfg := dhcp.Config{
		ServerIP: netip.MustParseAddr(vipAddr), Subnet: netip.MustParsePrefix("10.77.0.0/24"),
		PoolStart: netip.MustParseAddr("10.77.0.100"), PoolEnd: netip.MustParseAddr("10.77.0.150"),
		// One lease store for both holders, as the shared state store is
		// in production: b knows a's lease when the renewal arrives.
		Leases:    &dhcp.MemLeases{},
		LeaseTime: 10 * time.Minute, Lookup: &look, Boot: dhcp.BootFiles{ScriptURL: "http://" + vipAddr + ":8080/boot/ipxe"},
	}
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	newHolder := func(name, ns string) *holder {
		v, err := NewVIP(VIPConfig{Prefix: vipPfx, Interface: "eth0", Interval: 100 * time.Millisecond, Logger: log.With("holder", name)})
		if err != nil {
			t.Fatal(err)
		}
		h := &holder{name: name, ns: ns, vip: v}
		h.serveHTTP(t)
		return h
	}
	a, b := newHolder("a", l.a), newHolder("b", l.b)

	a.acquire(t, dcfg)
	if !strings.Contains(addrs(t, l.a), vipAddr+"/24") {
		t.Fatalf("a lacks the VIP after Acquire:\n%s", addrs(t, l.a))
	}
	if err := inNS(l.a, func() error { return a.vip.Acquire(context.Background()) }); err != nil {
		t.Fatalf("second Acquire (idempotent) = %v", err)
	}
	cmd, next := udhcpc(t, l.m)
	bound := next("EVENT bound")
	if !strings.Contains(bound, "serverid="+vipAddr) || !strings.Contains(bound, "ip=10.77.0.100") {
		t.Fatalf("bound from a: %q, want ip=10.77.0.100 serverid=%s", bound, vipAddr)
	}
	if got := ipxeGET(t, l.m, "http://"+vipAddr+":8080/boot/ipxe?mac="+macM.String()); !strings.Contains(got, "holder=a") {
		t.Fatalf("GET before the move answered %q, want holder=a", got)
	}
	if got := neighbour(t, l.m, vipAddr); got != macA.String() {
		t.Fatalf("machine's neighbour entry for the VIP = %q, want a's %s", got, macA)
	}

	// Move: a steps down, b takes over. The machine sends nothing until its
	// neighbour entry shows b, so only b's gratuitous ARP can change it.
	a.release(t)
	if strings.Contains(addrs(t, l.a), vipAddr) {
		t.Fatalf("a still has the VIP after Release:\n%s", addrs(t, l.a))
	}
	if err := inNS(l.a, a.vip.Release); err != nil {
		t.Fatalf("second Release (idempotent) = %v", err)
	}
	b.acquire(t, dcfg)
	waitNeighbour(t, l.m, vipAddr, macB.String())

	// A renewal goes unicast to the server identifier, the VIP: b answers.
	run(t, "ip", "-n", l.m, "addr", "add", "10.77.0.100/24", "dev", "eth0")
	_ = cmd.Process.Signal(syscall.SIGUSR1)
	if renew := next("EVENT renew"); !strings.Contains(renew, "serverid="+vipAddr) {
		t.Fatalf("renew event %q, want serverid=%s", renew, vipAddr)
	}
	if st := b.dhcp.Stats(); st.Acks < 1 {
		t.Fatalf("b's DHCP stats %+v: the renewal did not reach b", st)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	run(t, "ip", "-n", l.m, "addr", "del", "10.77.0.100/24", "dev", "eth0")

	// A fresh client DORA against the new holder.
	_, next2 := udhcpc(t, l.m)
	if bound := next2("EVENT bound"); !strings.Contains(bound, "serverid="+vipAddr) {
		t.Fatalf("bound from b: %q, want serverid=%s", bound, vipAddr)
	}
	if st := b.dhcp.Stats(); st.Acks < 2 || st.Offers < 1 {
		t.Fatalf("b's DHCP stats %+v, want >=1 offer and >=2 acks", st)
	}

	aBefore := len(a.served())
	if got := ipxeGET(t, l.m, "http://"+vipAddr+":8080/boot/ipxe?mac="+macM.String()); !strings.Contains(got, "holder=b") {
		t.Fatalf("GET after the move answered %q, want holder=b", got)
	}
	if n := len(a.served()); n != aBefore {
		t.Fatalf("a served %d GETs after stepping down", n-aBefore)
	}
	gets := b.served()
	if len(gets) != 1 || !strings.HasPrefix(gets[0], "iPXE/") || !strings.HasSuffix(gets[0], "/boot/ipxe?mac="+macM.String()) {
		t.Fatalf("b served %q, want one iPXE GET of /boot/ipxe", gets)
	}
	b.release(t)
	if strings.Contains(addrs(t, l.b), vipAddr) {
		t.Fatalf("b still has the VIP after Release:\n%s", addrs(t, l.b))
	}
}

// TestVIPAcquireMissingInterface: a missing interface is an error naming
// it, and nothing is held.
func TestVIPAcquireMissingInterface(t *testing.T) {
	l := newLab(t)
	v, err := NewVIP(VIPConfig{Prefix: netip.MustParsePrefix("10.77.0.10/24"), Interface: "nope0"})
	if err != nil {
		t.Fatal(err)
	}
	err = inNS(l.a, func() error { return v.Acquire(context.Background()) })
	if err == nil || !strings.Contains(err.Error(), "nope0") {
		t.Fatalf("Acquire on a missing interface = %v, want an error naming nope0", err)
	}
	if v.Held() {
		t.Fatal("Held after a failed Acquire")
	}
	if err := inNS(l.a, v.Release); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("Release of a VIP on a missing interface = %v, want nil", err)
	}
}
