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
// bridge (with the port's MAC, so DHCP leases, ARP caches and switch port
// security still know the host), enslaves the NIC (or VLAN link) to it and
// brings all up. A port enslaved to a bridge no longer takes IP traffic, so
// its addresses (but IPv6 link-local ones) and the main table's routes
// through it move to the bridge: a host whose only NIC carries its
// management address stays reachable (a dynamic address moves as a
// permanent one: the DHCP client still runs on the NIC). The CIDR is the
// network's prefix for validation and reporting: it is never configured
// as an address; the summary says whether the bridge has an address in it.
// Idempotent: existing matching links are kept, and addresses left on an
// already enslaved port move. It returns a one-line summary of what it
// did. Run it inside [ApplyGuarded] on a running host, which rolls back a
// change that cuts the host off its controller.
func ApplyNetwork(h *netlink.Handle, n v1.JoinNetwork) (string, error) {
	if err := spec.Network(0, n); err != nil {
		return "", fmt.Errorf("node: network %s: %w", n.Name, err)
	}
	h, closeH, err := routeHandle(h)
	if err != nil {
		return "", fmt.Errorf("node: network %s: %w", n.Name, err)
	}
	defer closeH()
	var did []string
	nic, err := h.LinkByName(n.NIC)
	if err != nil {
		return "", fmt.Errorf("node: network %s: NIC %s: %w", n.Name, n.NIC, err)
	}
	port, did, err := ensureVLAN(h, n, nic, did)
	if err != nil {
		return "", err
	}
	br, did, err := ensureBridge(h, n, port.Attrs().HardwareAddr, did)
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
	moved, err := moveL3(h, port, br)
	if err != nil {
		return "", fmt.Errorf("node: network %s: %w", n.Name, err)
	}
	did = append(did, moved...)
	note := prefixNote(h, n, br)
	if len(did) == 0 {
		return fmt.Sprintf("network %s: bridge %s over %s already in place%s", n.Name, n.Bridge, port.Attrs().Name, note), nil
	}
	return fmt.Sprintf("network %s: %v%s", n.Name, did, note), nil
}

// moveL3 moves port's addresses (but IPv6 link-local ones) and the main
// table's routes through port to br, once port is br's port: addresses
// first (the kernel then adds br's prefix routes), then the routes
// (gateways are reachable by then), then the addresses leave port, which
// takes its prefix routes with it. It returns what it moved.
func moveL3(h *netlink.Handle, port, br netlink.Link) ([]string, error) {
	addrs, err := addrsOf(h, port)
	if err != nil {
		return nil, err
	}
	if len(addrs) == 0 {
		return nil, nil
	}
	routes, err := mainRoutes(h)
	if err != nil {
		return nil, err
	}
	pi, bi := port.Attrs().Index, br.Attrs().Index
	var did []string
	for _, a := range addrs {
		b := a
		b.LinkIndex, b.Label = bi, ""
		b.ValidLft, b.PreferedLft = 0, 0 // permanent on the bridge: no DHCP client renews it there
		b.Flags &^= unix.IFA_F_DADFAILED | unix.IFA_F_TENTATIVE
		if err := h.AddrReplace(br, &b); err != nil {
			return did, fmt.Errorf("move address %s to %s: %w", a.IPNet, br.Attrs().Name, err)
		}
		did = append(did, fmt.Sprintf("moved %s from %s to %s", a.IPNet, port.Attrs().Name, br.Attrs().Name))
	}
	for _, r := range routes {
		if r.LinkIndex != pi {
			continue
		}
		nr := r
		nr.LinkIndex = bi
		if err := h.RouteReplace(&nr); err != nil {
			return did, fmt.Errorf("move route %s to %s: %w", r, br.Attrs().Name, err)
		}
		if err := h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			return did, fmt.Errorf("remove route %s from %s: %w", r, port.Attrs().Name, err)
		}
		did = append(did, fmt.Sprintf("moved route %s to %s", routeText(r), br.Attrs().Name))
	}
	for _, a := range addrs {
		if err := h.AddrDel(port, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return did, fmt.Errorf("remove address %s from %s: %w", a.IPNet, port.Attrs().Name, err)
		}
	}
	return did, nil
}

// routeText names a route as `ip route` does: "default via GW" or "DST
// via GW".
func routeText(r netlink.Route) string {
	dst := "default"
	if !isDefault(r) {
		dst = r.Dst.String()
	}
	if r.Gw != nil {
		return dst + " via " + r.Gw.String()
	}
	return dst
}

// isDefault reports whether r is a default route (no destination, or a
// zero-length one as newer kernels and netlink report it).
func isDefault(r netlink.Route) bool {
	if r.Dst == nil {
		return true
	}
	ones, _ := r.Dst.Mask.Size()
	return ones == 0 && r.Dst.IP.IsUnspecified()
}

// prefixNote reports n.CIDR against br's addresses: which lie in the
// prefix, or that none does; "" without a CIDR.
func prefixNote(h *netlink.Handle, n v1.JoinNetwork, br netlink.Link) string {
	if n.CIDR == "" {
		return ""
	}
	pfx := netip.MustParsePrefix(n.CIDR).Masked() // validated by spec.Network
	addrs, err := addrsOf(h, br)
	if err != nil {
		return fmt.Sprintf("; prefix %s (addresses of %s unreadable: %v)", pfx, n.Bridge, err)
	}
	var in []string
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && pfx.Contains(ip.Unmap()) {
			in = append(in, a.IPNet.String())
		}
	}
	if len(in) == 0 {
		return fmt.Sprintf("; prefix %s: %s has no address in it (the prefix is not configured as one)", pfx, n.Bridge)
	}
	return fmt.Sprintf("; prefix %s: %s has %v", pfx, n.Bridge, in)
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

// ensureBridge returns n's bridge, created with MAC mac when missing (a
// link of that name that is not a bridge is ErrLinkConflict). did gains
// what was done.
func ensureBridge(h *netlink.Handle, n v1.JoinNetwork, mac net.HardwareAddr, did []string) (netlink.Link, []string, error) {
	br, err := h.LinkByName(n.Bridge)
	switch {
	case err == nil:
		if _, ok := br.(*netlink.Bridge); !ok {
			return nil, did, fmt.Errorf("node: network %s: link %s is a %s, not a bridge: %w", n.Name, n.Bridge, br.Type(), ErrLinkConflict)
		}
	case isNotFound(err):
		la := netlink.NewLinkAttrs()
		la.Name, la.HardwareAddr = n.Bridge, mac
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
