package node

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/join/spec"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ErrLinkConflict: a link with the bridge's or VLAN's name exists but is of
// another kind or on another parent; ApplyNetwork does not replace it.
var ErrLinkConflict = errors.New("existing link conflicts with the network")

// ApplyNetwork builds n through h (a netlink handle, possibly in another
// network namespace; nil means the current one): validates it, checks the
// NIC exists, creates the 802.1Q link NIC.VLAN when VLAN > 0, creates the
// bridge, enslaves the NIC (or VLAN link) to it, brings all up and, with a
// CIDR, adds the address to the bridge. Idempotent: existing matching
// links are kept. It returns a one-line summary of what it did.
func ApplyNetwork(h *netlink.Handle, n v1.JoinNetwork) (string, error) {
	if err := spec.Network(0, n); err != nil {
		return "", fmt.Errorf("node: network %s: %w", n.Name, err)
	}
	if h == nil {
		var err error
		// Route sockets only: NewHandle() with no families also opens XFRM
		// and netfilter sockets, which fail on kernels without those modules.
		if h, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
			return "", fmt.Errorf("node: network %s: %w", n.Name, err)
		}
		defer h.Close()
	}
	var did []string
	nic, err := h.LinkByName(n.NIC)
	if err != nil {
		return "", fmt.Errorf("node: network %s: NIC %s: %w", n.Name, n.NIC, err)
	}
	port, did, err := ensureVLAN(h, n, nic, did)
	if err != nil {
		return "", err
	}
	br, did, err := ensureBridge(h, n, did)
	if err != nil {
		return "", err
	}
	if m := port.Attrs().MasterIndex; m != br.Attrs().Index {
		if m != 0 {
			return "", fmt.Errorf("node: network %s: %s is enslaved to another master (index %d): %w", n.Name, port.Attrs().Name, m, ErrLinkConflict)
		}
		if err := h.LinkSetMaster(port, br); err != nil {
			return "", fmt.Errorf("node: network %s: enslave %s to %s: %w", n.Name, port.Attrs().Name, n.Bridge, err)
		}
		did = append(did, fmt.Sprintf("enslaved %s to %s", port.Attrs().Name, n.Bridge))
	}
	for _, l := range []netlink.Link{nic, port, br} {
		if l.Attrs().Flags&net.FlagUp == 0 {
			if err := h.LinkSetUp(l); err != nil {
				return "", fmt.Errorf("node: network %s: up %s: %w", n.Name, l.Attrs().Name, err)
			}
		}
	}
	if n.CIDR != "" {
		pfx := netip.MustParsePrefix(n.CIDR) // validated by spec.Network
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: pfx.Addr().AsSlice(), Mask: net.CIDRMask(pfx.Bits(), pfx.Addr().BitLen())}}
		if err := h.AddrReplace(br, addr); err != nil {
			return "", fmt.Errorf("node: network %s: address %s on %s: %w", n.Name, n.CIDR, n.Bridge, err)
		}
	}
	if len(did) == 0 {
		return fmt.Sprintf("network %s: bridge %s over %s already in place", n.Name, n.Bridge, port.Attrs().Name), nil
	}
	return fmt.Sprintf("network %s: %v", n.Name, did), nil
}

// ensureVLAN returns the bridge port of n: the NIC, or its VLAN
// interface (created when missing; one of that name that is not this
// VLAN over this NIC is ErrLinkConflict). did gains what was done.
func ensureVLAN(h *netlink.Handle, n v1.JoinNetwork, nic netlink.Link, did []string) (netlink.Link, []string, error) {
	if n.VLAN <= 0 {
		return nic, did, nil
	}
	name := spec.VLANName(n.NIC, n.VLAN)
	l, err := h.LinkByName(name)
	switch {
	case err == nil:
		v, ok := l.(*netlink.Vlan)
		if !ok || v.VlanId != n.VLAN || v.ParentIndex != nic.Attrs().Index {
			return nil, did, fmt.Errorf("node: network %s: link %s: %w", n.Name, name, ErrLinkConflict)
		}
		return l, did, nil
	case isNotFound(err):
		la := netlink.NewLinkAttrs()
		la.Name, la.ParentIndex = name, nic.Attrs().Index
		v := &netlink.Vlan{LinkAttrs: la, VlanId: n.VLAN, VlanProtocol: netlink.VLAN_PROTOCOL_8021Q}
		if err := h.LinkAdd(v); err != nil {
			return nil, did, fmt.Errorf("node: network %s: add vlan %s: %w", n.Name, name, err)
		}
		port, err := h.LinkByName(name)
		if err != nil {
			return nil, did, fmt.Errorf("node: network %s: %w", n.Name, err)
		}
		return port, append(did, "created vlan "+name), nil
	default:
		return nil, did, fmt.Errorf("node: network %s: link %s: %w", n.Name, name, err)
	}
}

// ensureBridge returns n's bridge, created when missing (a link of that
// name that is not a bridge is ErrLinkConflict). did gains what was done.
func ensureBridge(h *netlink.Handle, n v1.JoinNetwork, did []string) (netlink.Link, []string, error) {
	br, err := h.LinkByName(n.Bridge)
	switch {
	case err == nil:
		if _, ok := br.(*netlink.Bridge); !ok {
			return nil, did, fmt.Errorf("node: network %s: link %s is a %s, not a bridge: %w", n.Name, n.Bridge, br.Type(), ErrLinkConflict)
		}
	case isNotFound(err):
		la := netlink.NewLinkAttrs()
		la.Name = n.Bridge
		if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil {
			return nil, did, fmt.Errorf("node: network %s: add bridge %s: %w", n.Name, n.Bridge, err)
		}
		if br, err = h.LinkByName(n.Bridge); err != nil {
			return nil, did, fmt.Errorf("node: network %s: %w", n.Name, err)
		}
		return br, append(did, "created bridge "+n.Bridge), nil
	default:
		return nil, did, fmt.Errorf("node: network %s: link %s: %w", n.Name, n.Bridge, err)
	}
	return br, did, nil
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}
