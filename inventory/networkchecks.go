package inventory

import (
	"fmt"
	"math/big"
	"net/netip"
	"sort"
	"strconv"
	"strings"
)

// defaultMTU is the kernel's MTU of an Ethernet interface none sets.
const defaultMTU = 1500

// netChecker holds one run of the network checks: networks.yaml's
// document and subnets by name, the fixed addresses seen so far, and the
// profiles' pool demand per subnet.
type netChecker struct {
	*crossChecker
	nd          *doc
	haveSubnets bool
	subnets     map[string]int          // name → index
	fixed       map[netip.Addr]fixedUse // each fixed address's first use
}

// networks runs the checks of networks.yaml, of the profiles' network
// layouts and of the servers' network parts. nd is networks.yaml's
// document (nil without the file); haveSubnets reports whether it is
// valid on its own (a missing file is: no subnets).
func (c *crossChecker) networks(nd *doc, haveSubnets bool) {
	n := &netChecker{crossChecker: c, nd: nd, haveSubnets: haveSubnets, subnets: map[string]int{}, fixed: map[netip.Addr]fixedUse{}}
	for i := range c.inv.Subnets {
		n.unique(nd, n.subnets, "subnet", "/subnets/", i, c.inv.Subnets[i].Name)
		n.subnet(i)
	}
	n.overlaps()
	for i := range c.inv.Profiles {
		if p := &c.inv.Profiles[i]; p.Network != nil {
			n.layout("/profiles/"+strconv.Itoa(i)+"/network", p)
		}
		n.joinConflicts(i)
	}
	n.poolDemand()
	if !c.haveServers || !c.haveProfiles {
		return
	}
	for i := range c.inv.Servers {
		n.server(i)
	}
}

// sub returns the subnet named name, or nil.
func (n *netChecker) sub(name string) *Subnet {
	if j, ok := n.subnets[name]; ok {
		return &n.inv.Subnets[j]
	}
	return nil
}

// subnet checks subnets[i] on its own: prefixes without host bits,
// gateways inside them, resolvers that parse, ranges inside the prefix of
// their family, pools that do not overlap.
func (n *netChecker) subnet(i int) {
	sn, base, nd := &n.inv.Subnets[i], "/subnets/"+strconv.Itoa(i), n.nd
	prefix := func(field, s string, v6 bool) {
		if s == "" {
			return
		}
		p, err := netip.ParsePrefix(s)
		switch {
		case err != nil || p.Addr().Is6() != v6 || p.Addr().Is4In6():
			n.errAt(nd, base+"/"+field, SeverityError, fmt.Sprintf("%q is not an IPv%s prefix", s, map[bool]string{false: "4", true: "6"}[v6]))
		case p.Masked() != p:
			n.errAt(nd, base+"/"+field, SeverityError, fmt.Sprintf("%s has host bits set; the prefix is %s", s, p.Masked()))
		}
	}
	prefix("cidr", sn.CIDR, false)
	prefix("cidr6", sn.CIDR6, true)
	gw := func(field, s, cidrField string, v6 bool) {
		if s == "" {
			return
		}
		a, err := netip.ParseAddr(s)
		switch {
		case err != nil || a.Is6() != v6:
			n.errAt(nd, base+"/"+field, SeverityError, fmt.Sprintf("%q is not an IPv%s address", s, map[bool]string{false: "4", true: "6"}[v6]))
		case v6 && a.IsLinkLocalUnicast():
			if sn.CIDR6 == "" {
				n.errAt(nd, base+"/"+field, SeverityError, "gateway6 without cidr6: the subnet has no IPv6 prefix")
			}
		case !sn.Contains(a):
			p, _ := sn.Prefix(a)
			if !p.IsValid() {
				n.errAt(nd, base+"/"+field, SeverityError, fmt.Sprintf("%s without %s: the subnet has no prefix of that family", field, cidrField))
			} else {
				n.errAt(nd, base+"/"+field, SeverityError, fmt.Sprintf("gateway %s is outside the subnet's %s %s", s, cidrField, p))
			}
		}
	}
	gw("gateway", sn.Gateway, "cidr", false)
	gw("gateway6", sn.Gateway6, "cidr6", true)
	if sn.DNS != nil {
		for k, s := range sn.DNS.Servers {
			if _, err := netip.ParseAddr(s); err != nil {
				n.errAt(nd, base+"/dns/servers/"+strconv.Itoa(k), SeverityError, fmt.Sprintf("%q is not an IP address", s))
			}
		}
	}
	n.ranges(sn, base, "pools", sn.Pools)
	n.ranges(sn, base, "reserved", sn.Reserved)
	for a := range sn.Pools {
		for b := a + 1; b < len(sn.Pools); b++ {
			if rangesOverlap(sn.Pools[a], sn.Pools[b]) {
				n.errAt(nd, base+"/pools/"+strconv.Itoa(b), SeverityError, fmt.Sprintf("pool %s-%s overlaps pool %s-%s (%s)", sn.Pools[b].Start, sn.Pools[b].End, sn.Pools[a].Start, sn.Pools[a].End, n.where(nd, base+"/pools/"+strconv.Itoa(a))))
			}
		}
	}
}

// ranges checks that each range parses, is of one family, ends after it
// starts and lies inside the subnet's prefix of its family.
func (n *netChecker) ranges(sn *Subnet, base, field string, rs []AddressRange) {
	for k, r := range rs {
		ptr := base + "/" + field + "/" + strconv.Itoa(k)
		s, e, ok := r.Bounds()
		if !ok {
			n.errAt(n.nd, ptr, SeverityError, fmt.Sprintf("range %s-%s: start and end must be addresses of one family", r.Start, r.End))
			continue
		}
		if e.Less(s) {
			n.errAt(n.nd, ptr+"/end", SeverityError, fmt.Sprintf("end %s is before start %s", r.End, r.Start))
			continue
		}
		p, has := sn.Prefix(s)
		switch {
		case !has:
			n.errAt(n.nd, ptr, SeverityError, fmt.Sprintf("range %s-%s: the subnet has no IPv%s prefix", r.Start, r.End, family(s)))
		case !p.Contains(s) || !p.Contains(e):
			n.errAt(n.nd, ptr, SeverityError, fmt.Sprintf("range %s-%s is outside the subnet's prefix %s", r.Start, r.End, p))
		}
	}
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "4"
	}
	return "6"
}

func rangesOverlap(a, b AddressRange) bool {
	as, ae, ok1 := a.Bounds()
	bs, be, ok2 := b.Bounds()
	return ok1 && ok2 && as.Is4() == bs.Is4() && as.Compare(be) <= 0 && bs.Compare(ae) <= 0
}

// overlaps reports every pair of subnets whose prefixes of one family
// overlap: an address would belong to two subnets.
func (n *netChecker) overlaps() {
	type pfx struct {
		p     netip.Prefix
		i     int
		field string
	}
	var all []pfx
	for i, sn := range n.inv.Subnets {
		for _, f := range []struct{ field, s string }{{"cidr", sn.CIDR}, {"cidr6", sn.CIDR6}} {
			if p, err := netip.ParsePrefix(f.s); err == nil {
				all = append(all, pfx{p.Masked(), i, f.field})
			}
		}
	}
	for a := range all {
		for b := a + 1; b < len(all); b++ {
			x, y := all[a], all[b]
			if x.i != y.i && x.p.Overlaps(y.p) {
				n.errAt(n.nd, "/subnets/"+strconv.Itoa(y.i)+"/"+y.field, SeverityError, fmt.Sprintf("%s overlaps subnet %s's %s (%s)", y.p, n.inv.Subnets[x.i].Name, x.p, n.where(n.nd, "/subnets/"+strconv.Itoa(x.i)+"/"+x.field)))
			}
		}
	}
}

// layout checks profile p's network layout at base: names unique,
// references that resolve, subnets that exist, address modes that fit,
// one default route, VLAN IDs and MTUs that agree with their parents,
// bond parameters that fit the mode.
func (n *netChecker) layout(base string, p *Profile) {
	l, pd := p.Network, n.pd
	if p.Deploy != DeployImage {
		n.errAt(pd, base, SeverityError, fmt.Sprintf("a network layout applies to deploy: image (rendered into the NoCloud seed); the %s installer configures its own network", p.Deploy))
	}
	ifaces := l.Interfaces()
	byName := map[string]LayoutInterface{}
	ptr := func(li LayoutInterface) string { return base + "/" + li.Kind + "/" + strconv.Itoa(li.Index) }
	for _, li := range ifaces {
		if o, dup := byName[li.Name]; dup {
			n.errAt(pd, ptr(li)+"/name", SeverityError, fmt.Sprintf("interface %q is named twice in this layout (first at %s)", li.Name, n.where(pd, ptr(o)+"/name")))
			continue
		}
		byName[li.Name] = li
	}
	memberOf := map[string]string{}
	defaultRoute, defaultRouteAt := "", ""
	for _, li := range ifaces {
		at := ptr(li)
		n.attachment(at, li)
		if li.DefaultRoute {
			if defaultRoute != "" {
				n.errAt(pd, at+"/defaultRoute", SeverityError, fmt.Sprintf("interface %s holds the default route already (%s); a layout has one", defaultRoute, n.where(pd, defaultRouteAt)))
			} else {
				defaultRoute, defaultRouteAt = li.Name, at+"/defaultRoute"
			}
		}
		field := map[string]string{"bonds": "members", "vlans": "link", "bridges": "interfaces"}[li.Kind]
		for k, parent := range li.Parents {
			pptr := at + "/" + field
			if li.Kind != "vlans" {
				pptr += "/" + strconv.Itoa(k)
			}
			par, ok := byName[parent]
			switch {
			case !ok:
				n.errAt(pd, pptr, SeverityError, fmt.Sprintf("interface %q is not in this layout", parent))
				continue
			case li.Kind == "bonds" && par.Kind != "ethernets":
				n.errAt(pd, pptr, SeverityError, fmt.Sprintf("a bond's members are ethernets; %s is in %s", parent, par.Kind))
			case par.Name == li.Name:
				n.errAt(pd, pptr, SeverityError, "an interface cannot be built on itself")
				continue
			}
			if li.Kind == "vlans" {
				n.vlanMTU(at, li, par)
				continue
			}
			if other, dup := memberOf[parent]; dup {
				n.errAt(pd, pptr, SeverityError, fmt.Sprintf("%s is already a port of %s", parent, other))
			} else {
				memberOf[parent] = li.Name
			}
			if par.Subnet != "" || (par.Address != AddressNone && par.Address != "") || par.DefaultRoute {
				n.errAt(pd, ptr(par), SeverityError, fmt.Sprintf("%s is a port of %s and carries no subnet or address of its own; attach them to %s", par.Name, li.Name, li.Name))
			}
		}
	}
	n.layoutParams(base, l)
}

// layoutParams checks what each bond's mode takes and each VLAN's ID
// against its subnet's.
func (n *netChecker) layoutParams(base string, l *NetworkLayout) {
	pd := n.pd
	for k, b := range l.Bonds {
		at := base + "/bonds/" + strconv.Itoa(k)
		if len(b.Members) == 1 {
			n.errAt(pd, at+"/members", SeverityWarning, fmt.Sprintf("bond %s has one member: it gives no redundancy; add a second ethernet or use the ethernet directly", b.Name))
		}
		if b.LACPRate != "" && b.Mode != Bond8023AD {
			n.errAt(pd, at+"/lacpRate", SeverityError, fmt.Sprintf("lacpRate applies to mode 802.3ad, not %s", b.Mode))
		}
		if b.HashPolicy != "" && b.Mode == BondActiveBackup {
			n.errAt(pd, at+"/hashPolicy", SeverityError, "hashPolicy applies to modes 802.3ad and balance-xor, not active-backup")
		}
	}
	for k, v := range l.VLANs {
		at := base + "/vlans/" + strconv.Itoa(k)
		sn := n.sub(v.Subnet)
		switch {
		case v.ID == 0 && (sn == nil || sn.VLAN == 0):
			n.errAt(pd, at, SeverityError, fmt.Sprintf("vlan %s has no id, and its subnet names no vlan", v.Name))
		case v.ID != 0 && sn != nil && sn.VLAN != 0 && sn.VLAN != v.ID:
			n.errAt(pd, at+"/id", SeverityError, fmt.Sprintf("id %d differs from subnet %s's vlan %d", v.ID, sn.Name, sn.VLAN))
		}
	}
}

// attachment checks one interface's subnet, address mode, default route
// and routes.
func (n *netChecker) attachment(at string, li LayoutInterface) {
	pd := n.pd
	var sn *Subnet
	if li.Subnet != "" {
		if sn = n.sub(li.Subnet); sn == nil && n.haveSubnets {
			n.errAt(pd, at+"/subnet", SeverityError, fmt.Sprintf("subnet %q is not defined in %s", li.Subnet, NetworksFile))
		}
	}
	switch li.Address {
	case AddressFixed, AddressPool:
		if li.Subnet == "" {
			n.errAt(pd, at+"/address", SeverityError, fmt.Sprintf("address %s needs a subnet: name one in subnet", li.Address))
		} else if li.Address == AddressPool && sn != nil && len(sn.Pools) == 0 {
			n.errAt(pd, at+"/address", SeverityError, fmt.Sprintf("address pool: subnet %s has no pools in %s", sn.Name, NetworksFile))
		}
	}
	if li.DefaultRoute {
		switch {
		case sn == nil && n.haveSubnets:
			n.errAt(pd, at+"/defaultRoute", SeverityError, "defaultRoute needs a subnet with a gateway")
		case sn != nil && sn.Gateway == "" && sn.Gateway6 == "":
			n.errAt(pd, at+"/defaultRoute", SeverityError, fmt.Sprintf("subnet %s has no gateway or gateway6 to route through", sn.Name))
		case li.Address == AddressNone || li.Address == "":
			n.errAt(pd, at+"/defaultRoute", SeverityError, "an interface with address none cannot hold the default route")
		}
	}
	for k, r := range li.Routes {
		rp := at + "/routes/" + strconv.Itoa(k)
		via, err := netip.ParseAddr(r.Via)
		if err != nil {
			n.errAt(pd, rp+"/via", SeverityError, fmt.Sprintf("%q is not an IP address", r.Via))
			continue
		}
		if r.To != "default" {
			to, err := netip.ParsePrefix(r.To)
			switch {
			case err != nil:
				n.errAt(pd, rp+"/to", SeverityError, fmt.Sprintf("%q is not a prefix or default", r.To))
				continue
			case to.Masked() != to:
				n.errAt(pd, rp+"/to", SeverityError, fmt.Sprintf("%s has host bits set; the prefix is %s", r.To, to.Masked()))
			case to.Addr().Is4() != via.Is4():
				n.errAt(pd, rp+"/via", SeverityError, fmt.Sprintf("via %s is not of the family of %s", r.Via, r.To))
			}
		}
		if sn != nil && !via.IsLinkLocalUnicast() && !sn.Contains(via) {
			n.errAt(pd, rp+"/via", SeverityError, fmt.Sprintf("via %s is outside subnet %s: a next hop must be on the interface's link", r.Via, sn.Name))
		}
	}
}

// mtu is an interface's effective MTU: its own, else its subnet's, else
// the kernel's default.
func (n *netChecker) mtu(li LayoutInterface) int {
	if li.MTU > 0 {
		return li.MTU
	}
	if sn := n.sub(li.Subnet); sn != nil && sn.MTU > 0 {
		return sn.MTU
	}
	return defaultMTU
}

// vlanMTU refuses a VLAN interface whose MTU is above its parent's: the
// kernel refuses it (a VLAN's frames ride the parent's).
func (n *netChecker) vlanMTU(at string, v, parent LayoutInterface) {
	if vm, pm := n.mtu(v), n.mtu(parent); vm > pm {
		field := "/mtu"
		if v.MTU == 0 {
			field = "/subnet"
		}
		n.errAt(n.pd, at+field, SeverityError, fmt.Sprintf("vlan %s's MTU %d is above its link %s's MTU %d; raise %s's mtu (or its subnet's) to at least %d", v.Name, vm, parent.Name, pm, parent.Name, vm))
	}
}

// poolDemand warns, at each pool-mode interface, when the profiles that
// keep hosts deployed in pool mode on a subnet ask for more addresses
// than its pools hold (reserved ranges taken out).
func (n *netChecker) poolDemand() {
	type use struct{ profile, ptr string }
	demand := map[string]int{}
	uses := map[string][]use{}
	for i, p := range n.inv.Profiles {
		if p.Network == nil {
			continue
		}
		seen := map[string]bool{}
		for _, li := range p.Network.Interfaces() {
			if sn := n.sub(li.Subnet); li.Address != AddressPool || seen[li.Subnet] || sn == nil || len(sn.Pools) == 0 {
				continue
			}
			seen[li.Subnet] = true
			demand[li.Subnet] += p.Count
			uses[li.Subnet] = append(uses[li.Subnet], use{p.Name, "/profiles/" + strconv.Itoa(i) + "/network/" + li.Kind + "/" + strconv.Itoa(li.Index) + "/address"})
		}
	}
	for _, name := range sortedIntKeys(demand) {
		sn := n.sub(name)
		size := poolSize(sn)
		if big.NewInt(int64(demand[name])).Cmp(size) <= 0 {
			continue
		}
		for _, u := range uses[name] {
			p := n.inv.Profile(u.profile)
			n.errAt(n.pd, u.ptr, SeverityWarning, fmt.Sprintf("subnet %s's pools hold %s addresses (reserved ranges taken out); the profiles in pool mode on it keep %d hosts deployed (this one: count %d)", name, size, demand[name], p.Count))
		}
	}
}

func sortedIntKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// poolSize counts the addresses of sn's pools that no reserved range
// covers (pools do not overlap each other; the checks refuse that).
func poolSize(sn *Subnet) *big.Int {
	total := new(big.Int)
	for _, p := range sn.Pools {
		s, e, ok := p.Bounds()
		if !ok || e.Less(s) {
			continue
		}
		total.Add(total, rangeLen(s, e))
		for _, r := range sn.Reserved {
			rs, re, ok := r.Bounds()
			if !ok || rs.Is4() != s.Is4() {
				continue
			}
			lo, hi := maxAddr(s, rs), minAddr(e, re)
			if !hi.Less(lo) {
				total.Sub(total, rangeLen(lo, hi))
			}
		}
	}
	return total
}

func rangeLen(s, e netip.Addr) *big.Int {
	a, b := s.As16(), e.As16()
	d := new(big.Int).Sub(new(big.Int).SetBytes(b[:]), new(big.Int).SetBytes(a[:]))
	return d.Add(d, big.NewInt(1))
}

func maxAddr(a, b netip.Addr) netip.Addr {
	if a.Less(b) {
		return b
	}
	return a
}

func minAddr(a, b netip.Addr) netip.Addr {
	if a.Less(b) {
		return a
	}
	return b
}

// joinConflicts refuses a join.networks bridge that the profile's network
// layout also defines (one bridge, two owners), and warns where a
// join.networks cidr is a networks.yaml subnet: that cidr is for
// reporting only and never the host's address.
func (n *netChecker) joinConflicts(i int) {
	p := &n.inv.Profiles[i]
	base := "/profiles/" + strconv.Itoa(i)
	names := map[string]bool{}
	if p.Network != nil {
		for _, li := range p.Network.Interfaces() {
			names[li.Name] = true
		}
	}
	for k, jn := range p.Join.Networks {
		at := base + "/join/networks/" + strconv.Itoa(k)
		if names[jn.Bridge] {
			n.errAt(n.pd, at+"/bridge", SeverityError, fmt.Sprintf("bridge %s is also an interface of this profile's network layout; declare it once, in network.bridges (its subnet and address from %s), and drop this join.networks entry", jn.Bridge, NetworksFile))
		}
		if names[jn.NIC] && p.Network != nil && isPort(p.Network, jn.NIC) {
			n.errAt(n.pd, at+"/nic", SeverityError, fmt.Sprintf("%s is a bond member or bridge port in this profile's network layout; a join.networks bridge cannot also take it: declare the bridge in network.bridges", jn.NIC))
		}
		if jn.CIDR == "" {
			continue
		}
		for j, sn := range n.inv.Subnets {
			if sn.CIDR == jn.CIDR || sn.CIDR6 == jn.CIDR {
				n.errAt(n.pd, at+"/cidr", SeverityWarning, fmt.Sprintf("cidr %s is subnet %s of %s (%s); join.networks cidr is for reporting only and gives the host no address: attach the subnet in network (address: fixed, pool or dhcp)", jn.CIDR, sn.Name, NetworksFile, n.where(n.nd, "/subnets/"+strconv.Itoa(j)+"/name")))
				break
			}
		}
	}
}

// isPort reports whether name is a bond member or bridge port of l.
func isPort(l *NetworkLayout, name string) bool {
	for _, li := range l.Interfaces() {
		if li.Kind == "vlans" {
			continue
		}
		for _, p := range li.Parents {
			if p == name {
				return true
			}
		}
	}
	return false
}

// server checks servers[i]'s network part: addresses and NIC overrides
// that name interfaces of its profile's layout, fixed addresses inside
// their subnet, outside its pools, not the gateway, used once; and a
// pinned server's address for every fixed interface.
func (n *netChecker) server(i int) {
	s := &n.inv.Servers[i]
	sd, base := n.sd, "/servers/"+strconv.Itoa(i)+"/network"
	var layouts []*Profile
	if s.Profile != "" {
		if p := n.inv.Profile(s.Profile); p != nil && p.Network != nil {
			layouts = append(layouts, p)
		}
	} else if s.Network != nil && s.Want != WantRetired {
		for k := range n.inv.Profiles {
			p := &n.inv.Profiles[k]
			if p.Network != nil && (p.Zone == "" || p.Zone == s.Zone) {
				layouts = append(layouts, p)
			}
		}
	}
	if s.Profile != "" && s.Want != WantRetired && len(layouts) == 1 {
		for _, li := range layouts[0].Network.Interfaces() {
			if li.Address != AddressFixed {
				continue
			}
			if s.Network == nil || len(s.Network.Addresses[li.Name]) == 0 {
				n.errAt(sd, "/servers/"+strconv.Itoa(i)+"/profile", SeverityError, fmt.Sprintf("profile %s's interface %s is address: fixed; give this server its address in network.addresses.%s", s.Profile, li.Name, li.Name))
			}
		}
	}
	if s.Network == nil {
		return
	}
	if len(layouts) == 0 {
		// Kept for a profile with a layout, as when a server is pinned
		// to another profile for a while: ignored, not wrong.
		n.errAt(sd, base, SeverityWarning, fmt.Sprintf("network is ignored: %s", noLayoutWhy(s)))
		return
	}
	for _, name := range sortedStringKeys(s.Network.NICs) {
		if !hasEthernet(layouts, name) {
			n.errAt(sd, base+"/nics/"+escapePointer(name), SeverityError, fmt.Sprintf("%q is not an ethernet of the network layout of %s", name, layoutNames(layouts)))
		}
	}
	for _, name := range sortedStringKeys(s.Network.Addresses) {
		at := base + "/addresses/" + escapePointer(name)
		subnets := fixedSubnets(layouts, name)
		if len(subnets) == 0 {
			n.errAt(sd, at, SeverityError, fmt.Sprintf("%q is not an interface with address: fixed in the network layout of %s", name, layoutNames(layouts)))
			continue
		}
		fams := map[bool]bool{}
		for k, as := range s.Network.Addresses[name] {
			ap := at + "/" + strconv.Itoa(k)
			a, err := netip.ParseAddr(as)
			if err != nil {
				n.errAt(sd, ap, SeverityError, fmt.Sprintf("%q is not an IP address", as))
				continue
			}
			if fams[a.Is4()] {
				n.errAt(sd, ap, SeverityError, fmt.Sprintf("a second IPv%s address for %s; give one per family", family(a), name))
			}
			fams[a.Is4()] = true
			for _, sname := range subnets {
				n.fixedAddress(ap, a, sname)
			}
			if first, dup := n.fixed[a]; dup {
				where := fmt.Sprintf("servers[%d].network.addresses.%s (%s)", first.server, first.name, n.where(sd, first.pointer))
				n.errAt(sd, ap, SeverityError, fmt.Sprintf("address %s is also %s", a, where))
			} else {
				n.fixed[a] = fixedUse{server: i, name: name, pointer: ap}
			}
		}
	}
}

// fixedUse is where a fixed address is first given: the server's index,
// the interface name and the value's JSON pointer in servers.yaml, so the
// message naming it is built only for a duplicate.
type fixedUse struct {
	server  int
	name    string
	pointer string
}

// fixedAddress checks one fixed address against the subnet its
// interface is on.
func (n *netChecker) fixedAddress(ap string, a netip.Addr, sname string) {
	sn := n.sub(sname)
	if sn == nil {
		return // the layout's own check names the unknown subnet
	}
	sd := n.sd
	p, has := sn.Prefix(a)
	switch {
	case !has:
		n.errAt(sd, ap, SeverityError, fmt.Sprintf("%s is IPv%s and subnet %s has no IPv%s prefix", a, family(a), sn.Name, family(a)))
	case !p.Contains(a):
		msg := fmt.Sprintf("%s is outside subnet %s's %s", a, sn.Name, p)
		for _, o := range n.inv.Subnets {
			if o.Name != sn.Name && o.Contains(a) {
				msg += fmt.Sprintf("; it is inside subnet %s", o.Name)
				break
			}
		}
		n.errAt(sd, ap, SeverityError, msg)
	case sn.InPool(a):
		n.errAt(sd, ap, SeverityError, fmt.Sprintf("%s is inside a pool of subnet %s: IPAM could hand it to another host; take it out of the pool or put it in reserved", a, sn.Name))
	case a.String() == sn.Gateway || a.String() == sn.Gateway6:
		n.errAt(sd, ap, SeverityError, fmt.Sprintf("%s is subnet %s's gateway", a, sn.Name))
	case a.Is4() && p.Bits() < 31 && (a == p.Masked().Addr() || a == lastAddr(p)):
		n.errAt(sd, ap, SeverityError, fmt.Sprintf("%s is the network or broadcast address of %s", a, p))
	}
}

// lastAddr is the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v |= host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func hasEthernet(layouts []*Profile, name string) bool {
	for _, p := range layouts {
		for _, e := range p.Network.Ethernets {
			if e.Name == name {
				return true
			}
		}
	}
	return false
}

// fixedSubnets returns the subnets of the interfaces named name with
// address: fixed in layouts, without repeats.
func fixedSubnets(layouts []*Profile, name string) []string {
	var out []string
	for _, p := range layouts {
		for _, li := range p.Network.Interfaces() {
			if li.Name == name && li.Address == AddressFixed && !containsString(out, li.Subnet) {
				out = append(out, li.Subnet)
			}
		}
	}
	return out
}

func containsString(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// layoutNames names the profiles of layouts: "profile p" or "profile p, q".
func layoutNames(layouts []*Profile) string {
	var names []string
	for _, p := range layouts {
		names = append(names, p.Name)
	}
	return "profile " + strings.Join(names, ", ")
}

// noLayoutWhy says why a server's network part has no layout to apply
// to (layouts is empty).
func noLayoutWhy(s *Server) string {
	if s.Profile != "" {
		return "profile " + s.Profile + " has no network layout"
	}
	return "no profile this server may take (zone " + s.Zone + ") has a network layout"
}

func sortedStringKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
