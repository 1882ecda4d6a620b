package node

import (
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Checkpoint is the network configuration of a running host at one moment,
// read through netlink: every link (its master, MTU and up flag), every
// address of each link except IPv6 link-local ones (the kernel manages
// those), and the main table's routes except the kernel's own (proto
// kernel: prefix routes that follow the addresses). Rollback puts the host
// back to it, as `netplan try` and nmstate's checkpoints do. It holds no
// netlink handle.
type Checkpoint struct {
	links  map[int]linkState
	addrs  map[int][]netlink.Addr
	routes []netlink.Route
}

type linkState struct {
	name   string
	master int
	mtu    int
	up     bool
}

// TakeCheckpoint reads the current configuration through h (nil: the
// current network namespace). Errors name the netlink list that failed.
func TakeCheckpoint(h *netlink.Handle) (*Checkpoint, error) {
	h, done, err := routeHandle(h)
	if err != nil {
		return nil, err
	}
	defer done()
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("node: checkpoint: list links: %w", err)
	}
	cp := &Checkpoint{links: map[int]linkState{}, addrs: map[int][]netlink.Addr{}}
	for _, l := range links {
		a := l.Attrs()
		cp.links[a.Index] = linkState{name: a.Name, master: a.MasterIndex, mtu: a.MTU, up: a.Flags&net.FlagUp != 0}
		if cp.addrs[a.Index], err = addrsOf(h, l); err != nil {
			return nil, fmt.Errorf("node: checkpoint: %w", err)
		}
	}
	if cp.routes, err = mainRoutes(h); err != nil {
		return nil, fmt.Errorf("node: checkpoint: %w", err)
	}
	return cp, nil
}

// Rollback restores cp through h (nil: the current namespace): it deletes
// the bridges and VLAN links created since (their ports fall back out of
// them), gives every link of cp its master, MTU and up flag back, removes
// addresses added since and re-adds those removed, and does the same for
// the main table's routes. It carries on past a failure and returns every
// failure joined.
func (cp *Checkpoint) Rollback(h *netlink.Handle) error {
	h, done, err := routeHandle(h)
	if err != nil {
		return err
	}
	defer done()
	links, err := h.LinkList()
	if err != nil {
		return fmt.Errorf("node: rollback: list links: %w", err)
	}
	var errs []error
	note := func(op string, err error) {
		if err != nil && !errors.Is(err, unix.EEXIST) && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.EADDRNOTAVAIL) {
			errs = append(errs, fmt.Errorf("%s: %w", op, err))
		}
	}
	for _, l := range links {
		if _, had := cp.links[l.Attrs().Index]; had {
			continue
		}
		switch l.(type) {
		case *netlink.Bridge, *netlink.Vlan:
			note("delete "+l.Attrs().Name, h.LinkDel(l))
		}
	}
	for idx, want := range cp.links {
		if l, err := h.LinkByIndex(idx); err == nil { // gone since: nothing to give back to
			cp.restoreLink(h, l, want, note)
		}
	}
	cp.restoreRoutes(h, note)
	if len(errs) > 0 {
		return fmt.Errorf("node: rollback: %w", errors.Join(errs...))
	}
	return nil
}

// restoreLink gives l its checkpointed master, MTU, up flag and addresses
// back, passing each failure to note.
func (cp *Checkpoint) restoreLink(h *netlink.Handle, l netlink.Link, want linkState, note func(string, error)) {
	a := l.Attrs()
	if a.MasterIndex != want.master {
		if want.master == 0 {
			note("release "+a.Name, h.LinkSetNoMaster(l))
		} else {
			note("re-enslave "+a.Name, h.LinkSetMasterByIndex(l, want.master))
		}
	}
	if a.MTU != want.mtu && want.mtu > 0 {
		note("mtu "+a.Name, h.LinkSetMTU(l, want.mtu))
	}
	if up := a.Flags&net.FlagUp != 0; up != want.up {
		if want.up {
			note("up "+a.Name, h.LinkSetUp(l))
		} else {
			note("down "+a.Name, h.LinkSetDown(l))
		}
	}
	now, err := addrsOf(h, l)
	if err != nil {
		note("addresses of "+a.Name, err)
		return
	}
	had := cp.addrs[a.Index]
	for _, x := range now {
		if !slices.ContainsFunc(had, func(y netlink.Addr) bool { return sameAddr(x, y) }) {
			note("remove "+x.IPNet.String()+" from "+a.Name, h.AddrDel(l, &x))
		}
	}
	for _, y := range had {
		if !slices.ContainsFunc(now, func(x netlink.Addr) bool { return sameAddr(x, y) }) {
			y.LinkIndex = a.Index
			note("restore "+y.IPNet.String()+" on "+a.Name, h.AddrReplace(l, &y))
		}
	}
}

// restoreRoutes removes the main table's routes added since cp and
// re-adds those removed (after the addresses: gateways are reachable).
func (cp *Checkpoint) restoreRoutes(h *netlink.Handle, note func(string, error)) {
	now, err := mainRoutes(h)
	if err != nil {
		note("routes", err)
		return
	}
	for _, r := range now {
		if !slices.ContainsFunc(cp.routes, func(y netlink.Route) bool { return sameRoute(r, y) }) {
			note("remove route "+r.String(), h.RouteDel(&r))
		}
	}
	for _, r := range cp.routes {
		if !slices.ContainsFunc(now, func(x netlink.Route) bool { return sameRoute(x, r) }) {
			note("restore route "+r.String(), h.RouteReplace(&r))
		}
	}
}

// routeHandle returns h, or a new NETLINK_ROUTE handle in the current
// namespace (and a func closing it) when h is nil.
func routeHandle(h *netlink.Handle) (*netlink.Handle, func(), error) {
	if h != nil {
		return h, func() {}, nil
	}
	// Route sockets only: NewHandle() with no families also opens XFRM
	// and netfilter sockets, which fail on kernels without those modules.
	nh, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, nil, fmt.Errorf("node: netlink: %w", err)
	}
	return nh, nh.Close, nil
}

// addrsOf lists l's addresses but IPv6 link-local ones.
func addrsOf(h *netlink.Handle, l netlink.Link) ([]netlink.Addr, error) {
	all, err := h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list addresses of %s: %w", l.Attrs().Name, err)
	}
	out := all[:0]
	for _, a := range all {
		if a.IP.To4() == nil && a.IP.IsLinkLocalUnicast() {
			continue
		}
		out = append(out, a)
	}
	return out, nil
}

// mainRoutes lists the main table's routes but the kernel's own.
func mainRoutes(h *netlink.Handle) ([]netlink.Route, error) {
	all, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	out := all[:0]
	for _, r := range all {
		if r.Protocol == unix.RTPROT_KERNEL {
			continue
		}
		out = append(out, r)
	}
	return out, nil
}

func sameAddr(a, b netlink.Addr) bool { return a.IPNet.String() == b.IPNet.String() }

func sameRoute(a, b netlink.Route) bool {
	dst := func(r netlink.Route) string {
		if isDefault(r) {
			return "default"
		}
		return r.Dst.String()
	}
	return dst(a) == dst(b) && a.Gw.Equal(b.Gw) && a.LinkIndex == b.LinkIndex && a.Priority == b.Priority && a.Family == b.Family
}

// flushNeighbours deletes the learnt ARP and NDP entries (not permanent or
// NOARP ones) of every link through h, so a check after a change resolves
// its next hop over the new path: with cached entries a host whose
// address sat on an enslaved port still answered for a while and was cut
// off only once they expired (tens of seconds later).
func flushNeighbours(h *netlink.Handle) error {
	h, done, err := routeHandle(h)
	if err != nil {
		return err
	}
	defer done()
	var errs []error
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		ns, err := h.NeighList(0, fam)
		if err != nil {
			errs = append(errs, fmt.Errorf("list neighbours: %w", err))
			continue
		}
		for _, n := range ns {
			if n.State&(netlink.NUD_PERMANENT|netlink.NUD_NOARP) != 0 || n.IP == nil {
				continue
			}
			if err := h.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("delete neighbour %s: %w", n.IP, err))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("node: flush neighbours: %w", errors.Join(errs...))
	}
	return nil
}
