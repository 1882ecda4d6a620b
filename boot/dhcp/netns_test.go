package dhcp

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/boot/internal/netnstest"
)

// notifyLeases wraps MemLeases and reports every write, so tests wait for the
// server's side of a transaction without sleeping.
type notifyLeases struct {
	MemLeases
	puts, deletes chan Lease
}

func newNotifyLeases() *notifyLeases {
	return &notifyLeases{puts: make(chan Lease, 64), deletes: make(chan Lease, 64)}
}

func (n *notifyLeases) PutLease(ctx context.Context, l Lease) error {
	err := n.MemLeases.PutLease(ctx, l)
	n.puts <- l
	return err
}

func (n *notifyLeases) DeleteLease(ctx context.Context, mac net.HardwareAddr) error {
	err := n.MemLeases.DeleteLease(ctx, mac)
	n.deletes <- Lease{MAC: mac}
	return err
}

func waitLease(t *testing.T, ch chan Lease, what string) Lease {
	t.Helper()
	select {
	case l := <-ch:
		return l
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for lease %s", what)
		return Lease{}
	}
}

// startServer opens the server's sockets inside the pair's server namespace
// and serves until the test ends.
func startServer(t *testing.T, p *netnstest.Pair, cfg Config) *Server {
	t.Helper()
	cfg.Interfaces = []string{p.ServerIf}
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	var s *Server
	err := netnstest.Do(p.Server, func() error {
		var err error
		if s, err = New(cfg); err != nil {
			return err
		}
		return s.Listen(context.Background())
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve returned %v after cancel, want nil", err)
		}
	})
	return s
}

func clientMAC(t *testing.T, p *netnstest.Pair) net.HardwareAddr {
	t.Helper()
	var mac net.HardwareAddr
	err := netnstest.Do(p.Client, func() error {
		ifi, err := net.InterfaceByName(p.ClientIf)
		if err == nil {
			mac = ifi.HardwareAddr
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return mac
}

func fullConfig(look *boot.MemLookup, leases LeaseStore) Config {
	return Config{
		Subnet: netip.MustParsePrefix("10.66.0.0/24"), PoolStart: netip.MustParseAddr("10.66.0.100"), PoolEnd: netip.MustParseAddr("10.66.0.150"),
		Router: netip.MustParseAddr("10.66.0.1"), DNS: []netip.Addr{netip.MustParseAddr("10.66.0.1")}, Domain: "prov.test",
		LeaseTime: 10 * time.Minute, Lookup: look, Leases: leases,
		Boot: BootFiles{ScriptURL: "http://10.66.0.1:8080/boot/ipxe"},
	}
}

// TestUdhcpcDORARenewRelease runs busybox udhcpc in the client namespace
// against the server: DISCOVER/OFFER/REQUEST/ACK, then a renew (SIGUSR1) and a
// release (SIGUSR2), and checks what udhcpc's script received.
func TestUdhcpcDORARenewRelease(t *testing.T) {
	udhcpc := netnstest.RequireCommand(t, "udhcpc")
	p := netnstest.NewPair(t, "10.66.0.1/24")
	mac := clientMAC(t, p)
	var look boot.MemLookup
	if err := look.Set(boot.Assignment{MAC: mac, Lifecycle: boot.LifecycleReady, Hostname: "r1-n01"}); err != nil {
		t.Fatal(err)
	}
	leases := newNotifyLeases()
	s := startServer(t, p, fullConfig(&look, leases))

	script := filepath.Join(t.TempDir(), "udhcpc.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho \"EVENT $1 ip=$ip subnet=$subnet router=$router dns=$dns domain=$domain hostname=$hostname serverid=$serverid lease=$lease\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := netnstest.Command(p.Client, udhcpc, "-f", "-i", p.ClientIf, "-s", script, "-t", "5", "-T", "1", "-O", "hostname")
	cmd.Stderr = t.Output()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func(prefix string) string {
		t.Helper()
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
			case <-time.After(30 * time.Second):
				t.Fatalf("timed out waiting for %q", prefix)
			}
		}
	}
	bound := next("EVENT bound")
	for _, want := range []string{"ip=10.66.0.100", "subnet=255.255.255.0", "router=10.66.0.1", "dns=10.66.0.1", "domain=prov.test", "hostname=r1-n01", "serverid=10.66.0.1", "lease=600"} {
		if !strings.Contains(bound, want) {
			t.Errorf("bound event %q lacks %q", bound, want)
		}
	}
	if l := waitLease(t, leases.puts, "ack"); l.IP.String() != "10.66.0.100" || l.MAC.String() != mac.String() {
		t.Fatalf("stored lease %+v", l)
	}
	// udhcpc's script did not configure the address; add it so the renew
	// (unicast from ciaddr) and its answer can flow.
	netnstest.Run(t, "ip", "-n", p.Client, "addr", "add", "10.66.0.100/24", "dev", p.ClientIf)

	_ = cmd.Process.Signal(syscall.SIGUSR1) // renew
	renew := next("EVENT renew")
	if !strings.Contains(renew, "ip=10.66.0.100") {
		t.Fatalf("renew event %q", renew)
	}
	waitLease(t, leases.puts, "renew")

	_ = cmd.Process.Signal(syscall.SIGUSR2) // release
	next("EVENT deconfig")
	if l := waitLease(t, leases.deletes, "release"); l.MAC.String() != mac.String() {
		t.Fatalf("deleted lease %+v", l)
	}
	st := s.Stats()
	if st.Offers < 1 || st.Acks < 2 || st.Releases != 1 || st.Malformed != 0 {
		t.Fatalf("stats %+v, want >=1 offer, >=2 acks, 1 release", st)
	}
}

// TestPXEClientsInNetns drives the server with the library's own client
// (nclient4, raw sockets on the veth) shaped like PXE firmware and iPXE, and
// sends malformed datagrams over the wire.
func TestPXEClientsInNetns(t *testing.T) {
	p := netnstest.NewPair(t, "10.66.0.1/24")
	mac := clientMAC(t, p)
	var look boot.MemLookup
	_ = look.Set(boot.Assignment{MAC: mac, Lifecycle: boot.LifecycleCommissioning})
	s := startServer(t, p, fullConfig(&look, nil))

	var c *nclient4.Client
	if err := netnstest.Do(p.Client, func() error {
		var err error
		c, err = nclient4.New(p.ClientIf, nclient4.WithTimeout(2*time.Second), nclient4.WithRetry(3))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	tests := []struct {
		name     string
		mods     []dhcpv4.Modifier
		wantFile string
		want175  bool
	}{
		{"uefi firmware arch 7", []dhcpv4.Modifier{withClass("PXEClient:Arch:00007:UNDI:003000"), withArch(7)}, "snponly.efi", true},
		{"uefi firmware arch 9", []dhcpv4.Modifier{withClass("PXEClient:Arch:00009:UNDI:003016"), withArch(9)}, "snponly.efi", true},
		{"bios firmware", []dhcpv4.Modifier{withClass("PXEClient:Arch:00000:UNDI:002001"), withArch(0)}, "undionly.kpxe", true},
		{"ipxe", []dhcpv4.Modifier{withClass("PXEClient:Arch:00000:UNDI:002001"), withArch(0), withIPXE()}, "http://10.66.0.1:8080/boot/ipxe", true},
		{"plain", nil, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lease, err := c.Request(ctx, tt.mods...)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range []*dhcpv4.DHCPv4{lease.Offer, lease.ACK} {
				if m.YourIPAddr.String() != "10.66.0.100" {
					t.Errorf("%s yiaddr = %s", m.MessageType(), m.YourIPAddr)
				}
				if m.BootFileName != tt.wantFile || m.BootFileNameOption() != tt.wantFile {
					t.Errorf("%s file = %q / option 67 %q, want %q", m.MessageType(), m.BootFileName, m.BootFileNameOption(), tt.wantFile)
				}
				if got := m.Options.Get(dhcpv4.GenericOptionCode(175)); (string(got) == "\xb0\x01\x01") != tt.want175 {
					t.Errorf("%s option 175 = %x, want present=%v", m.MessageType(), got, tt.want175)
				}
				if tt.wantFile != "" && m.ServerIPAddr.String() != "10.66.0.1" {
					t.Errorf("%s siaddr = %s", m.MessageType(), m.ServerIPAddr)
				}
			}
		})
	}

	// Malformed datagrams from the client namespace, then one good DISCOVER:
	// the server handles packets in order, so once the OFFER is back every
	// malformed one has been counted.
	before := s.Stats().Malformed
	junk := [][]byte{{}, []byte("hello"), make([]byte, 300), append(pxeDiscover(t, mac).ToBytes()[:236], 9, 9, 9, 9)}
	netnstestAddr(t, p)
	if err := netnstest.Do(p.Client, func() error {
		conn, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(10, 66, 0, 1), Port: 67})
		if err != nil {
			return err
		}
		defer conn.Close()
		for _, j := range junk {
			if _, err := conn.Write(j); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DiscoverOffer(ctx); err != nil {
		t.Fatal(err)
	}
	if got := s.Stats().Malformed - before; got != uint64(len(junk)) {
		t.Fatalf("malformed counted %d, want %d", got, len(junk))
	}
}

var addrAdded = map[string]bool{}

// netnstestAddr gives the client veth an address once, so plain UDP sockets
// can reach the server by unicast.
func netnstestAddr(t *testing.T, p *netnstest.Pair) {
	t.Helper()
	if addrAdded[p.Client] {
		return
	}
	addrAdded[p.Client] = true
	netnstest.Run(t, "ip", "-n", p.Client, "addr", "add", "10.66.0.200/24", "dev", p.ClientIf)
}

// TestProxyDHCPInNetns runs the server in proxy mode: a PXE DISCOVER on 67
// gets an address-less offer with option 60 "PXEClient" and option 43, a
// plain client gets nothing, and a REQUEST to 4011 gets an ACK unicast back.
func TestProxyDHCPInNetns(t *testing.T) {
	p := netnstest.NewPair(t, "10.66.0.1/24")
	mac := clientMAC(t, p)
	var look boot.MemLookup
	_ = look.Set(boot.Assignment{MAC: mac, Lifecycle: boot.LifecycleCommissioning})
	cfg := fullConfig(&look, nil)
	cfg.Mode = ModeProxy
	s := startServer(t, p, cfg)

	var c *nclient4.Client
	if err := netnstest.Do(p.Client, func() error {
		var err error
		c, err = nclient4.New(p.ClientIf, nclient4.WithTimeout(2*time.Second), nclient4.WithRetry(2))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	offer, err := c.DiscoverOffer(ctx, withClass("PXEClient:Arch:00007:UNDI:003000"), withArch(7))
	if err != nil {
		t.Fatal(err)
	}
	if !offer.YourIPAddr.IsUnspecified() || offer.BootFileName != "snponly.efi" || offer.ClassIdentifier() != "PXEClient" ||
		string(offer.Options.Get(dhcpv4.OptionVendorSpecificInformation)) != "\x06\x01\x08\xff" || offer.SubnetMask() != nil {
		t.Fatalf("proxy offer = %v", offer)
	}
	shortCtx, cancel2 := context.WithTimeout(ctx, 3*time.Second)
	defer cancel2()
	if r, err := c.DiscoverOffer(shortCtx); err == nil {
		t.Fatalf("proxy answered a plain client: %v", r)
	}

	// Port 4011: the client (now holding an address from "the other" DHCP
	// server) asks the proxy directly, by unicast.
	netnstestAddr(t, p)
	err = netnstest.Do(p.Client, func() error {
		conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 66, 0, 200)})
		if err != nil {
			return err
		}
		defer conn.Close()
		req := pxeDiscover(t, mac, dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), withClass("PXEClient:Arch:00000:UNDI:002001"),
			withArch(0), withIPXE(), dhcpv4.WithClientIP(net.IPv4(10, 66, 0, 200)))
		if _, err := conn.WriteToUDP(req.ToBytes(), &net.UDPAddr{IP: net.IPv4(10, 66, 0, 1), Port: 4011}); err != nil {
			return err
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 1500)
		n, from, err := conn.ReadFromUDP(buf)
		if err != nil {
			return err
		}
		ack, err := dhcpv4.FromBytes(buf[:n])
		if err != nil {
			return err
		}
		if from.Port != 4011 || ack.MessageType() != dhcpv4.MessageTypeAck || ack.BootFileName != "http://10.66.0.1:8080/boot/ipxe" || ack.TransactionID != req.TransactionID {
			t.Errorf("4011 answer from %s: %v", from, ack)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Offers != 1 || st.Acks != 1 {
		t.Fatalf("stats %+v, want 1 offer and 1 ack", st)
	}
}

// TestDhclientDORA runs ISC dhclient (a second real client implementation)
// for one lease in the client namespace and reads the lease it recorded.
func TestDhclientDORA(t *testing.T) {
	dhclient := netnstest.RequireCommand(t, "dhclient")
	p := netnstest.NewPair(t, "10.66.0.1/24")
	mac := clientMAC(t, p)
	var look boot.MemLookup
	_ = look.Set(boot.Assignment{MAC: mac, Name: "r1-n02", Lifecycle: boot.LifecycleReady, IP: netip.MustParseAddr("10.66.0.20")})
	leases := newNotifyLeases()
	startServer(t, p, fullConfig(&look, leases))
	dir := t.TempDir()
	lf, pf := filepath.Join(dir, "leases"), filepath.Join(dir, "pid")
	// -1: try once and exit; -sf /bin/true: record the lease, configure nothing.
	cmd := netnstest.Command(p.Client, dhclient, "-1", "-d", "-sf", "/bin/true", "-lf", lf, "-pf", pf, p.ClientIf)
	done := make(chan error, 1)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	go func() { done <- cmd.Wait() }()
	// With -d dhclient stays in the foreground after binding; the stored
	// lease tells us the ACK went out, then we check what dhclient recorded.
	if l := waitLease(t, leases.puts, "dhclient ack"); l.IP.String() != "10.66.0.20" || l.Hostname != "r1-n02" {
		t.Fatalf("stored lease %+v, want the reservation 10.66.0.20", l)
	}
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		b, _ := os.ReadFile(lf)
		if strings.Contains(string(b), "fixed-address 10.66.0.20;") {
			for _, want := range []string{"option subnet-mask 255.255.255.0;", "option routers 10.66.0.1;", "option host-name \"r1-n02\";", "option dhcp-server-identifier 10.66.0.1;"} {
				if !strings.Contains(string(b), want) {
					t.Errorf("dhclient lease lacks %q:\n%s", want, b)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("dhclient recorded no lease; output:\n%s\nlease file:\n%s", out.String(), b)
		}
		<-tick.C
	}
}
