//go:build machina_vmguest

// This file builds only with the tag machina_vmguest: TestNetworksInVM
// compiles the package's tests with it and runs them in a qemu guest booted
// with Debian's kernel and its 8021q module, because the kernels of CI and
// development machines (this one) may have no 802.1Q support. On a host
// whose kernel has 8021q it also runs directly:
// go test -tags machina_vmguest -run TestApplyVLANNetworkInNetns ./join/node
// (root).

package node_test

import (
	"errors"
	"strings"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/join/node"
	"github.com/machina-metal/machina/join/spec"
	"github.com/vishvananda/netlink"
)

// needVLAN fails when the kernel cannot create 802.1Q links.
func needVLAN(t *testing.T, h *netlink.Handle) {
	t.Helper()
	la := netlink.NewLinkAttrs()
	la.Name = "probe0"
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "probe0p"}); err != nil {
		t.Fatal(err)
	}
	p, _ := h.LinkByName("probe0")
	vla := netlink.NewLinkAttrs()
	vla.Name, vla.ParentIndex = "probe0.9", p.Attrs().Index
	err := h.LinkAdd(&netlink.Vlan{LinkAttrs: vla, VlanId: 9})
	_ = h.LinkDel(p)
	if err != nil {
		t.Fatalf("kernel cannot create 802.1Q links (8021q): %v", err)
	}
}

func TestApplyVLANNetworkInNetns(t *testing.T) {
	needRoot(t)
	h := netnsHandle(t)
	needVLAN(t, h)
	addDummy(t, h, "eth1")
	addDummy(t, h, "eth2")
	addDummy(t, h, "notbr")
	nws := []v1.JoinNetwork{
		{Name: "prod", Bridge: "br-prod", NIC: "eth1", VLAN: 20, CIDR: "10.20.0.5/24"},
		{Name: "mgmt", Bridge: "br-mgmt", NIC: "eth2"},
	}
	for _, n := range nws {
		msg, err := node.ApplyNetwork(h, n)
		if err != nil {
			t.Fatalf("ApplyNetwork(%s): %v", n.Name, err)
		}
		if !strings.Contains(msg, "created bridge "+n.Bridge) {
			t.Errorf("ApplyNetwork(%s) = %q, want it to create the bridge", n.Name, msg)
		}
	}
	br, err := h.LinkByName("br-prod")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := br.(*netlink.Bridge); !ok {
		t.Fatalf("br-prod is a %s, want bridge", br.Type())
	}
	vl, err := h.LinkByName("eth1.20")
	if err != nil {
		t.Fatal(err)
	}
	eth1, _ := h.LinkByName("eth1")
	v, ok := vl.(*netlink.Vlan)
	if !ok || v.VlanId != 20 || v.ParentIndex != eth1.Attrs().Index || v.MasterIndex != br.Attrs().Index {
		t.Fatalf("eth1.20 = %#v, want VLAN 20 on eth1 enslaved to br-prod", vl)
	}
	// The CIDR is the network's prefix, never configured as an address.
	addrs, err := h.AddrList(br, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 0 {
		t.Fatalf("br-prod addresses = %v, %v; want none", addrs, err)
	}
	eth2, _ := h.LinkByName("eth2")
	mg, _ := h.LinkByName("br-mgmt")
	if eth2.Attrs().MasterIndex != mg.Attrs().Index {
		t.Fatal("eth2 not enslaved to br-mgmt")
	}
	// Idempotent: applying again changes nothing.
	for _, n := range nws {
		msg, err := node.ApplyNetwork(h, n)
		if err != nil || !strings.Contains(msg, "already in place") {
			t.Fatalf("re-apply %s = %q, %v; want already in place", n.Name, msg, err)
		}
	}
	links, _ := h.LinkList()
	if len(links) != 10 { // lo, eth1(p), eth2(p), notbr(p), eth1.20, br-prod, br-mgmt
		t.Fatalf("%d links after re-apply, want 10", len(links))
	}
	// Conflicts and missing NICs are refused.
	if _, err := node.ApplyNetwork(h, v1.JoinNetwork{Name: "x", Bridge: "notbr", NIC: "eth2"}); !errors.Is(err, node.ErrLinkConflict) {
		t.Fatalf("bridge over a veth = %v, want ErrLinkConflict", err)
	}
	if _, err := node.ApplyNetwork(h, v1.JoinNetwork{Name: "y", Bridge: "br-y", NIC: "eth9"}); err == nil || !strings.Contains(err.Error(), "NIC eth9") {
		t.Fatalf("missing NIC = %v", err)
	}
	if _, err := node.ApplyNetwork(h, v1.JoinNetwork{Name: "z", Bridge: "br-z", NIC: "eth1; reboot"}); !errors.Is(err, spec.ErrInvalid) {
		t.Fatalf("bad NIC name = %v, want spec.ErrInvalid", err)
	}
}
