package dhcp

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
	"github.com/machina-metal/machina/boot"
)

var testFiles = BootFiles{ScriptURL: "http://10.99.0.1:8080/boot/ipxe", HTTPx64: "http://10.99.0.1:8080/boot/efi/snponly.efi"}

func init() { testFiles.setDefaults() }

func pxeDiscover(t testing.TB, mac net.HardwareAddr, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	d, err := dhcpv4.NewDiscovery(mac, mods...)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func withArch(a int) dhcpv4.Modifier {
	return dhcpv4.WithOption(dhcpv4.OptClientArch(iana.Arch(a)))
}

func withClass(c string) dhcpv4.Modifier { return dhcpv4.WithOption(dhcpv4.OptClassIdentifier(c)) }

// withIPXE sets option 77 the way iPXE does: the bare string "iPXE".
func withIPXE() dhcpv4.Modifier { return dhcpv4.WithUserClass("iPXE", false) }

func TestSelectBoot(t *testing.T) {
	mac := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}
	tests := []struct {
		name string
		mods []dhcpv4.Modifier
		want Boot
		err  error
	}{
		{"plain client", nil, Boot{}, nil},
		{"bios pxe", []dhcpv4.Modifier{withClass("PXEClient:Arch:00000:UNDI:002001"), withArch(0)}, Boot{File: "undionly.kpxe"}, nil},
		{"pxe without option 93", []dhcpv4.Modifier{withClass("PXEClient")}, Boot{File: "undionly.kpxe"}, nil},
		{"uefi arch 7 (OVMF)", []dhcpv4.Modifier{withClass("PXEClient:Arch:00007:UNDI:003000"), withArch(7)}, Boot{File: "snponly.efi"}, nil},
		{"uefi arch 9", []dhcpv4.Modifier{withClass("PXEClient:Arch:00009:UNDI:003016"), withArch(9)}, Boot{File: "snponly.efi"}, nil},
		{"arm64 uefi", []dhcpv4.Modifier{withClass("PXEClient:Arch:00011:UNDI:003000"), withArch(11)}, Boot{File: "grubnetaa64.efi"}, nil},
		{"http boot x64", []dhcpv4.Modifier{withClass("HTTPClient:Arch:00016:UNDI:003000"), withArch(16)}, Boot{File: "http://10.99.0.1:8080/boot/efi/snponly.efi", HTTPClient: true}, nil},
		{"http boot arm64 unconfigured", []dhcpv4.Modifier{withClass("HTTPClient:Arch:00019:UNDI:003000"), withArch(19)}, Boot{}, ErrNoBoot},
		{"ipxe bios", []dhcpv4.Modifier{withClass("PXEClient:Arch:00000:UNDI:002001"), withArch(0), withIPXE()}, Boot{File: "http://10.99.0.1:8080/boot/ipxe", IPXE: true}, nil},
		{"ipxe uefi rfc3004 form", []dhcpv4.Modifier{withArch(7), dhcpv4.WithUserClass("iPXE", true)}, Boot{File: "http://10.99.0.1:8080/boot/ipxe", IPXE: true}, nil},
		{"unknown arch", []dhcpv4.Modifier{withClass("PXEClient"), withArch(2)}, Boot{}, ErrNoBoot},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := SelectBoot(pxeDiscover(t, mac, tt.mods...), testFiles)
			if !errors.Is(err, tt.err) {
				t.Fatalf("SelectBoot err = %v, want %v", err, tt.err)
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Fatalf("SelectBoot (-want +got):\n%s", d)
			}
		})
	}
}

// replyView is the decoded part of a reply the tests compare.
type replyView struct {
	Type              string
	YourIP, ServerIP  string
	File              string
	Options           map[uint8]string
	Broadcast         bool
	TransactionIDSame bool
}

func view(req, r *dhcpv4.DHCPv4) replyView {
	v := replyView{Type: r.MessageType().String(), YourIP: r.YourIPAddr.String(), ServerIP: r.ServerIPAddr.String(),
		File: r.BootFileName, Options: map[uint8]string{}, Broadcast: r.IsBroadcast(), TransactionIDSame: r.TransactionID == req.TransactionID}
	for code, val := range r.Options {
		if code == dhcpv4.OptionDHCPMessageType.Code() {
			continue
		}
		v.Options[code] = string(val)
	}
	return v
}

func TestBuildReply(t *testing.T) {
	mac := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}
	n := Network{ServerIP: netip.MustParseAddr("10.99.0.1"), Mask: net.CIDRMask(24, 32), Router: netip.MustParseAddr("10.99.0.254"),
		DNS: []netip.Addr{netip.MustParseAddr("10.99.0.53")}, Domain: "lab.example"}
	uuid := []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	tests := []struct {
		name string
		req  *dhcpv4.DHCPv4
		d    Decision
		want replyView
	}{
		{
			name: "full offer to uefi pxe",
			req:  pxeDiscover(t, mac, withClass("PXEClient:Arch:00007:UNDI:003000"), withArch(7), dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, uuid)),
			d: Decision{Type: dhcpv4.MessageTypeOffer, YourIP: netip.MustParseAddr("10.99.0.100"), LeaseTime: time.Hour,
				Hostname: "r1-n01", Boot: Boot{File: "snponly.efi"}, NoPXEDHCP: true},
			want: replyView{Type: "OFFER", YourIP: "10.99.0.100", ServerIP: "10.99.0.1", File: "snponly.efi", TransactionIDSame: true,
				Options: map[uint8]string{
					1: "\xff\xff\xff\x00", 3: "\x0a\x63\x00\xfe", 6: "\x0a\x63\x00\x35", 15: "lab.example", 12: "r1-n01",
					51: "\x00\x00\x0e\x10", 58: "\x00\x00\x07\x08", 59: "\x00\x00\x0c\x4e", 54: "\x0a\x63\x00\x01",
					67: "snponly.efi", 175: "\xb0\x01\x01", 97: string(uuid),
				}},
		},
		{
			name: "full ack to plain client has no boot options",
			req:  pxeDiscover(t, mac, dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest)),
			d:    Decision{Type: dhcpv4.MessageTypeAck, YourIP: netip.MustParseAddr("10.99.0.101"), LeaseTime: time.Hour},
			want: replyView{Type: "ACK", YourIP: "10.99.0.101", ServerIP: "0.0.0.0", TransactionIDSame: true,
				Options: map[uint8]string{
					1: "\xff\xff\xff\x00", 3: "\x0a\x63\x00\xfe", 6: "\x0a\x63\x00\x35", 15: "lab.example",
					51: "\x00\x00\x0e\x10", 58: "\x00\x00\x07\x08", 59: "\x00\x00\x0c\x4e", 54: "\x0a\x63\x00\x01",
				}},
		},
		{
			name: "proxy offer to bios pxe",
			req:  pxeDiscover(t, mac, withClass("PXEClient:Arch:00000:UNDI:002001"), withArch(0)),
			d:    Decision{Type: dhcpv4.MessageTypeOffer, Proxy: true, Boot: Boot{File: "undionly.kpxe"}},
			want: replyView{Type: "OFFER", YourIP: "0.0.0.0", ServerIP: "10.99.0.1", File: "undionly.kpxe", TransactionIDSame: true,
				Options: map[uint8]string{54: "\x0a\x63\x00\x01", 67: "undionly.kpxe", 60: "PXEClient", 43: "\x06\x01\x08\xff"}},
		},
		{
			name: "http boot offer echoes HTTPClient",
			req:  pxeDiscover(t, mac, withClass("HTTPClient:Arch:00016:UNDI:003000"), withArch(16)),
			d: Decision{Type: dhcpv4.MessageTypeOffer, YourIP: netip.MustParseAddr("10.99.0.102"), LeaseTime: time.Minute,
				Boot: Boot{File: "http://10.99.0.1:8080/boot/efi/snponly.efi", HTTPClient: true}},
			want: replyView{Type: "OFFER", YourIP: "10.99.0.102", ServerIP: "10.99.0.1", File: "http://10.99.0.1:8080/boot/efi/snponly.efi", TransactionIDSame: true,
				Options: map[uint8]string{
					1: "\xff\xff\xff\x00", 3: "\x0a\x63\x00\xfe", 6: "\x0a\x63\x00\x35", 15: "lab.example",
					51: "\x00\x00\x00\x3c", 58: "\x00\x00\x00\x1e", 59: "\x00\x00\x00\x34", 54: "\x0a\x63\x00\x01",
					67: "http://10.99.0.1:8080/boot/efi/snponly.efi", 60: "HTTPClient",
				}},
		},
		{
			name: "nak",
			req:  pxeDiscover(t, mac, dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest)),
			d:    Decision{Type: dhcpv4.MessageTypeNak, Message: "wrong network"},
			want: replyView{Type: "NAK", YourIP: "0.0.0.0", ServerIP: "0.0.0.0", TransactionIDSame: true,
				Options: map[uint8]string{54: "\x0a\x63\x00\x01", 56: "wrong network"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := BuildReply(tt.req, n, tt.d)
			if err != nil {
				t.Fatal(err)
			}
			// round trip through the wire format, as a client sees it
			r, err = dhcpv4.FromBytes(r.ToBytes())
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, view(tt.req, r)); d != "" {
				t.Fatalf("BuildReply (-want +got):\n%s", d)
			}
		})
	}
}

func newUnitServer(t *testing.T, mode Mode, look *boot.MemLookup, auto bool) *Server {
	t.Helper()
	cfg := Config{
		Mode: mode, Interfaces: []string{"unit0"}, ServerIP: netip.MustParseAddr("10.99.0.1"),
		Subnet: netip.MustParsePrefix("10.99.0.0/24"), PoolStart: netip.MustParseAddr("10.99.0.100"), PoolEnd: netip.MustParseAddr("10.99.0.102"),
		Boot: testFiles, Lookup: look, LeaseTime: time.Hour, Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if auto {
		cfg.AutoEnroll, cfg.Enroller = true, look
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var anyPeer = netip.MustParseAddrPort("0.0.0.0:68")

func exchange(t *testing.T, s *Server, req *dhcpv4.DHCPv4) (*dhcpv4.DHCPv4, netip.AddrPort) {
	t.Helper()
	b, dst, ok := s.Handle(context.Background(), req.ToBytes(), anyPeer, false)
	if !ok {
		return nil, dst
	}
	r, err := dhcpv4.FromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	return r, dst
}

func TestHandleFullLifecycle(t *testing.T) {
	var look boot.MemLookup
	known := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}
	reserved := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 2}
	_ = look.Set(boot.Assignment{MAC: known, Lifecycle: boot.LifecycleCommissioning, Hostname: "r1-n01"})
	_ = look.Set(boot.Assignment{MAC: reserved, Lifecycle: boot.LifecycleReady, IP: netip.MustParseAddr("10.99.0.20")})
	s := newUnitServer(t, ModeFull, &look, false)

	offer, dst := exchange(t, s, pxeDiscover(t, known, withClass("PXEClient:Arch:00000:UNDI:002001"), withArch(0)))
	if offer == nil || offer.MessageType() != dhcpv4.MessageTypeOffer || offer.YourIPAddr.String() != "10.99.0.100" || offer.BootFileName != "undionly.kpxe" {
		t.Fatalf("offer = %v", offer)
	}
	if dst.String() != "255.255.255.255:68" {
		t.Fatalf("offer dst = %s, want broadcast", dst)
	}
	req, _ := dhcpv4.NewRequestFromOffer(offer)
	ack, _ := exchange(t, s, req)
	if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck || ack.YourIPAddr.String() != "10.99.0.100" || ack.HostName() != "r1-n01" {
		t.Fatalf("ack = %v", ack)
	}
	leases, _ := s.cfg.Leases.Leases(context.Background())
	if len(leases) != 1 || leases[0].IP.String() != "10.99.0.100" || leases[0].MAC.String() != known.String() {
		t.Fatalf("leases = %+v", leases)
	}
	// renew: unicast, ciaddr set
	renew, _ := dhcpv4.NewRenewFromAck(ack)
	rack, dst := exchange(t, s, renew)
	if rack == nil || rack.MessageType() != dhcpv4.MessageTypeAck || dst.String() != "10.99.0.100:68" {
		t.Fatalf("renew ack = %v to %s", rack, dst)
	}
	// reservation
	roffer, _ := exchange(t, s, pxeDiscover(t, reserved))
	if roffer == nil || roffer.YourIPAddr.String() != "10.99.0.20" {
		t.Fatalf("reserved offer = %v", roffer)
	}
	// requesting another address than offered: NAK
	bad, _ := dhcpv4.NewRequestFromOffer(roffer, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 99, 0, 100))))
	nak, _ := exchange(t, s, bad)
	if nak == nil || nak.MessageType() != dhcpv4.MessageTypeNak {
		t.Fatalf("conflicting request = %v, want NAK", nak)
	}
	// other subnet: NAK
	bad2, _ := dhcpv4.NewRequestFromOffer(roffer, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(192, 168, 1, 5))))
	if nak, _ := exchange(t, s, bad2); nak == nil || nak.MessageType() != dhcpv4.MessageTypeNak {
		t.Fatalf("foreign request = %v, want NAK", nak)
	}
	// release frees the address for the next client
	rel, _ := dhcpv4.NewReleaseFromACK(ack)
	if r, _ := exchange(t, s, rel); r != nil {
		t.Fatalf("release answered %v", r)
	}
	if leases, _ := s.cfg.Leases.Leases(context.Background()); len(leases) != 0 {
		t.Fatalf("leases after release = %+v", leases)
	}
	// unknown mac ignored with auto-enrol off
	if r, _ := exchange(t, s, pxeDiscover(t, net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x99})); r != nil {
		t.Fatalf("unknown mac answered %v", r)
	}
	st := s.Stats()
	want := Stats{Offers: 2, Acks: 2, Naks: 2, Releases: 1, Ignored: 1}
	if d := cmp.Diff(want, st); d != "" {
		t.Fatalf("stats (-want +got):\n%s", d)
	}
}

func TestHandlePoolExhaustedAndAutoEnroll(t *testing.T) {
	var look boot.MemLookup
	s := newUnitServer(t, ModeFull, &look, true)
	for i := 1; i <= 4; i++ {
		r, _ := exchange(t, s, pxeDiscover(t, net.HardwareAddr{0x52, 0x54, 0, 0, 1, byte(i)}, withClass("PXEClient"), withArch(9)))
		if i <= 3 && (r == nil || r.BootFileName != "snponly.efi") {
			t.Fatalf("client %d: offer = %v", i, r)
		}
		if i == 4 && r != nil {
			t.Fatalf("client 4 got %v from a pool of 3", r)
		}
	}
	if d := look.DiscoveredMACs(); len(d) != 4 || d[0].Source != "dhcp" || d[0].Arch != 9 {
		t.Fatalf("discovered = %+v", d)
	}
	// the same client asking again keeps its address
	r, _ := exchange(t, s, pxeDiscover(t, net.HardwareAddr{0x52, 0x54, 0, 0, 1, 2}))
	if r == nil || r.YourIPAddr.String() != "10.99.0.101" {
		t.Fatalf("repeat discover = %v, want 10.99.0.101", r)
	}
}

func TestHandleMalformed(t *testing.T) {
	var look boot.MemLookup
	s := newUnitServer(t, ModeFull, &look, true)
	good := pxeDiscover(t, net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}).ToBytes()
	mutate := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	cases := map[string][]byte{
		"empty":       nil,
		"short":       good[:100],
		"bad cookie":  mutate(func(b []byte) []byte { b[236] = 0; return b }),
		"bootreply":   mutate(func(b []byte) []byte { b[0] = 2; return b }),
		"hlen 16":     mutate(func(b []byte) []byte { b[2] = 16; return b }),
		"zero mac":    mutate(func(b []byte) []byte { copy(b[28:34], make([]byte, 6)); return b }),
		"multicast":   mutate(func(b []byte) []byte { b[28] = 1; return b }),
		"no msg type": mutate(func(b []byte) []byte { return append(b[:240], 255) }),
		"option overrun": mutate(func(b []byte) []byte {
			return append(b[:240], 53, 200, 1)
		}),
	}
	for name, pkt := range cases {
		if _, _, ok := s.Handle(context.Background(), pkt, anyPeer, false); ok {
			t.Errorf("%s: answered", name)
		}
	}
	if got := s.Stats().Malformed; got != uint64(len(cases)) {
		t.Fatalf("Malformed = %d, want %d", got, len(cases))
	}
}

func TestHandleProxy(t *testing.T) {
	var look boot.MemLookup
	mac := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}
	_ = look.Set(boot.Assignment{MAC: mac, Lifecycle: boot.LifecycleCommissioning})
	s := newUnitServer(t, ModeProxy, &look, false)
	if r, _ := exchange(t, s, pxeDiscover(t, mac)); r != nil {
		t.Fatalf("proxy answered a plain client: %v", r)
	}
	r, _ := exchange(t, s, pxeDiscover(t, mac, withClass("PXEClient:Arch:00007:UNDI:003000"), withArch(7)))
	if r == nil || r.YourIPAddr.String() != "0.0.0.0" || r.BootFileName != "snponly.efi" || r.ClassIdentifier() != "PXEClient" {
		t.Fatalf("proxy offer = %v", r)
	}
	req := pxeDiscover(t, mac, dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), withClass("PXEClient:Arch:00007:UNDI:003000"), withArch(7),
		dhcpv4.WithClientIP(net.IPv4(192, 168, 7, 9)))
	b, dst, ok := s.Handle(context.Background(), req.ToBytes(), netip.MustParseAddrPort("192.168.7.9:4011"), true)
	if !ok || dst.String() != "192.168.7.9:4011" {
		t.Fatalf("4011 request: ok=%v dst=%s", ok, dst)
	}
	ack, _ := dhcpv4.FromBytes(b)
	if ack.MessageType() != dhcpv4.MessageTypeAck || ack.BootFileName != "snponly.efi" {
		t.Fatalf("4011 ack = %v", ack)
	}
}

func FuzzHandle(f *testing.F) {
	mac := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}
	for _, p := range []*dhcpv4.DHCPv4{
		pxeDiscover(f, mac), pxeDiscover(f, mac, withClass("PXEClient"), withArch(7), withIPXE()),
		pxeDiscover(f, mac, dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 99, 0, 100)))),
	} {
		f.Add(p.ToBytes(), false)
	}
	f.Fuzz(func(t *testing.T, pkt []byte, proxyPort bool) {
		if len(pkt) > 1500 {
			return
		}
		var look boot.MemLookup
		for _, mode := range []Mode{ModeFull, ModeProxy} {
			s, err := New(Config{Mode: mode, Interfaces: []string{"f0"}, ServerIP: netip.MustParseAddr("10.99.0.1"),
				Subnet: netip.MustParsePrefix("10.99.0.0/24"), PoolStart: netip.MustParseAddr("10.99.0.100"), PoolEnd: netip.MustParseAddr("10.99.0.110"),
				Boot: testFiles, Lookup: &look, AutoEnroll: true, Enroller: &look})
			if err != nil {
				t.Fatal(err)
			}
			b, _, ok := s.Handle(context.Background(), pkt, anyPeer, proxyPort)
			if ok {
				if _, err := dhcpv4.FromBytes(b); err != nil {
					t.Fatalf("reply does not decode: %v", err)
				}
			}
			st := s.Stats()
			if st.Malformed > 1 {
				t.Fatalf("stats %+v", st)
			}
		}
	})
}
