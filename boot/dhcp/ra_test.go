package dhcp

import (
	"context"
	"encoding/binary"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/machina-metal/machina/boot/internal/netnstest"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv6"
)

func TestRouterAdvertisementBytes(t *testing.T) {
	b, err := routerAdvertisement(net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1})
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{134, 0, 0, 0, 64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0x52, 0x54, 0, 0, 0, 1}
	if string(b) != string(want) {
		t.Fatalf("RA = % x, want % x", b, want)
	}
}

// TestAdvertiserInNetns sends a Router Solicitation from the client namespace
// and expects our RA back: link-local source, hop limit 255, lifetime 0, M=O=0.
func TestAdvertiserInNetns(t *testing.T) {
	p := netnstest.NewPair(t, "10.66.0.1/24")
	netnstest.WaitLinkLocal(t, p.Server, p.ServerIf)
	netnstest.WaitLinkLocal(t, p.Client, p.ClientIf)
	var a *Advertiser
	err := netnstest.Do(p.Server, func() error {
		var err error
		a, err = NewAdvertiser(RAConfig{Interfaces: []string{p.ServerIf}, Interval: time.Hour,
			Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))})
		if err != nil {
			return err
		}
		return a.Listen()
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Serve(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve = %v", err)
		}
	}()

	var c *icmp.PacketConn
	if err := netnstest.Do(p.Client, func() error {
		var err error
		c, err = icmp.ListenPacket("ip6:ipv6-icmp", "::")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pc := c.IPv6PacketConn()
	_ = pc.SetControlMessage(ipv6.FlagHopLimit, true)
	_ = pc.SetMulticastHopLimit(255)
	rs, _ := (&icmp.Message{Type: ipv6.ICMPTypeRouterSolicitation, Body: &icmp.RawBody{Data: make([]byte, 4)}}).Marshal(nil)
	if _, err := pc.WriteTo(rs, nil, &net.IPAddr{IP: net.ParseIP("ff02::2"), Zone: p.ClientIf}); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 1500)
	for {
		n, cm, src, err := pc.ReadFrom(buf)
		if err != nil {
			t.Fatalf("no router advertisement: %v", err)
		}
		if n < 16 || ipv6.ICMPType(buf[0]) != ipv6.ICMPTypeRouterAdvertisement {
			continue
		}
		ip := src.(*net.IPAddr).IP
		if !ip.IsLinkLocalUnicast() || cm == nil || cm.HopLimit != 255 {
			t.Fatalf("RA from %s hop limit %v: want link-local source and hop limit 255", ip, cm)
		}
		if flags, lifetime := buf[5], binary.BigEndian.Uint16(buf[6:8]); flags != 0 || lifetime != 0 {
			t.Fatalf("RA flags %#x lifetime %d, want 0 and 0", flags, lifetime)
		}
		break
	}
	// The counter is bumped after the send returns, so the RA can arrive
	// here first: wait for it.
	for deadline := time.Now().Add(5 * time.Second); a.Sent() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("Sent() = 0 after an RA was received")
		}
	}
}
