package vm

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/lab/vm/netns"
)

// TestVLANGateway: an ARP request for the gateway address, tagged with
// VLAN 100, sent into a trunk gets a tagged ARP reply from the gateway's
// tap (tag removed on the way in, added on the way out); the same request
// tagged with another VLAN gets no reply. (Untagged frames are the
// bridge's: the trunk's own stack would answer an untagged ARP.)
func TestVLANGateway(t *testing.T) {
	peertest.Root(t, "network namespaces, taps")
	peertest.Commands(t, "ip")
	ctx := context.Background()
	ns, err := netns.Create(ctx, netns.Config{Prefix: "vgw", Taps: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	for _, c := range [][]string{
		{"ip", "-n", ns.Name, "link", "add", "trunk0", "type", "veth", "peer", "name", "far0"},
		{"ip", "-n", ns.Name, "link", "set", "trunk0", "up"},
		{"ip", "-n", ns.Name, "link", "set", "far0", "up"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", c, err, out)
		}
	}
	g, err := startVLANGateway(ns.Name, 100, []string{"trunk0"}, "gw0")
	if err != nil {
		t.Fatal(err)
	}
	defer g.close()
	for _, c := range [][]string{
		{"ip", "-n", ns.Name, "link", "set", "gw0", "up"},
		{"ip", "-n", ns.Name, "addr", "add", "10.77.0.1/24", "dev", "gw0"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", c, err, out)
		}
	}
	far, idx, err := packetSocket(ns.Name, "far0")
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(far)
	src := net.HardwareAddr{0x52, 0x54, 0, 0x77, 0, 2}
	arp := func(vid uint16) []byte {
		var b bytes.Buffer
		b.Write([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
		b.Write(src)
		if vid != 0 {
			_ = binary.Write(&b, binary.BigEndian, [2]uint16{0x8100, vid})
		}
		_ = binary.Write(&b, binary.BigEndian, [4]uint16{0x0806, 1, 0x0800, 0x0604})
		_ = binary.Write(&b, binary.BigEndian, uint16(1)) // request
		b.Write(src)
		b.Write(net.IPv4(10, 77, 0, 2).To4())
		b.Write(make([]byte, 6))
		b.Write(net.IPv4(10, 77, 0, 1).To4())
		return b.Bytes()
	}
	reply := func(vid uint16) (uint16, bool) {
		if err := unix.Sendto(far, arp(vid), 0, &unix.SockaddrLinklayer{Ifindex: idx}); err != nil {
			t.Fatal(err)
		}
		buf, oob := make([]byte, 2048), make([]byte, 256)
		deadline := time.Now().Add(2 * time.Second)
		for time.Now().Before(deadline) {
			frame, got, err := g.recv(far, buf, oob)
			if err != nil {
				t.Fatal(err)
			}
			if len(frame) >= 42 && binary.BigEndian.Uint16(frame[12:]) == 0x0806 && binary.BigEndian.Uint16(frame[20:]) == 2 && bytes.Equal(frame[:6], src) && got == vid {
				return got, true
			}
		}
		return 0, false
	}
	if vid, ok := reply(100); !ok || vid != 100 {
		t.Fatalf("ARP for the gateway on VLAN 100: reply %v with VLAN %d, want one on VLAN 100", ok, vid)
	}
	if _, ok := reply(200); ok {
		t.Fatal("ARP on VLAN 200 answered on VLAN 200")
	}
	// Up: only the VLAN 100 ARP (42 bytes untagged) passed; down: the ARP
	// reply and what the tap's own stack sends (IPv6 solicitations).
	if up, down := g.maxFrames(); up != 42 || down < 42 {
		t.Fatalf("largest frames up %d down %d, want 42 up (the VLAN 100 ARP only) and at least 42 down", up, down)
	}
}
