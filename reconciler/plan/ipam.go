package plan

import (
	"fmt"
	"net/netip"
	"sort"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// CondAddressPoolExhausted: a server the plan would allocate gets no
// address from a subnet's pools (every address is held, reserved or
// fixed), so it is not allocated at all: no partial allocation. On
// server/NAME for a pinned server, on profile/NAME for a profile's count.
const CondAddressPoolExhausted = "AddressPoolExhausted"

// StepAddress is one pool address an ActAllocate step takes (the plan's
// simulation of the controller's IPAM): the layout interface, its subnet,
// the address, and whether it is the server's kept lease (release policy
// keep) rather than a new pick.
type StepAddress struct {
	Interface string `json:"interface"`
	Subnet    string `json:"subnet"`
	Address   string `json:"address"`
	Kept      bool   `json:"kept,omitempty"`
}

func (a StepAddress) String() string {
	s := a.Interface + "=" + a.Address + " (" + a.Subnet
	if a.Kept {
		s += ", kept"
	}
	return s + ")"
}

// AddressPools returns the pools IPAM picks from on subnet sn, one per
// family that has pools (IPv4 first): the subnet's pool ranges in file
// order minus its reserved ranges, gateways, the network address of each
// prefix and the IPv4 broadcast address, and every fixed address of
// servers.yaml inside the subnet (fixed holds the parsed fixed addresses
// of the whole inventory, FixedAddrs).
func AddressPools(sn *inventory.Subnet, fixed []netip.Addr) []state.AddressPool {
	var out []state.AddressPool
	for _, six := range []bool{false, true} {
		var ranges, ex []state.AddressRange
		for _, r := range sn.Pools {
			if s, e, ok := r.Bounds(); ok && s.Is6() == six {
				ranges = append(ranges, state.AddressRange{Start: s, End: e})
			}
		}
		if len(ranges) == 0 {
			continue
		}
		for _, r := range sn.Reserved {
			if s, e, ok := r.Bounds(); ok {
				ex = append(ex, state.AddressRange{Start: s, End: e})
			}
		}
		for _, g := range []string{sn.Gateway, sn.Gateway6} {
			if a, err := netip.ParseAddr(g); err == nil {
				ex = append(ex, state.AddressRange{Start: a, End: a})
			}
		}
		for _, c := range []string{sn.CIDR, sn.CIDR6} {
			if p, err := netip.ParsePrefix(c); err == nil {
				n := p.Masked().Addr()
				ex = append(ex, state.AddressRange{Start: n, End: n})
				if n.Is4() {
					b := lastAddr(p)
					ex = append(ex, state.AddressRange{Start: b, End: b})
				}
			}
		}
		for _, a := range fixed {
			if sn.Contains(a) {
				ex = append(ex, state.AddressRange{Start: a, End: a})
			}
		}
		out = append(out, state.NewAddressPool(sn.Name, ranges, ex))
	}
	return out
}

// lastAddr is the highest address of IPv4 prefix p (its broadcast).
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v |= (1 << (32 - p.Bits())) - 1
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// FixedAddrs returns every fixed address servers.yaml states
// (network.addresses), parsed.
func FixedAddrs(inv *inventory.Inventory) []netip.Addr {
	var out []netip.Addr
	for i := range inv.Servers {
		if n := inv.Servers[i].Network; n != nil {
			for _, as := range n.Addresses {
				for _, s := range as {
					if a, err := netip.ParseAddr(s); err == nil {
						out = append(out, a)
					}
				}
			}
		}
	}
	return out
}

// PoolInterfaces lists the pool-mode interfaces of profile prof's layout
// (nil without one).
func PoolInterfaces(prof *inventory.Profile) []inventory.LayoutInterface {
	if prof == nil || prof.Network == nil {
		return nil
	}
	var out []inventory.LayoutInterface
	for _, li := range prof.Network.Interfaces() {
		if li.Address == inventory.AddressPool && li.Subnet != "" {
			out = append(out, li)
		}
	}
	return out
}

// Claims returns what the controller's allocation of a server to prof
// asks the store for (state.Store.ApplyClaiming): one claim per pool-mode
// interface and family with pools, preferring the addresses the plan's
// step simulated (step.Addresses). Nil when prof has no pool interface.
func Claims(inv *inventory.Inventory, prof *inventory.Profile, step Step) []state.AddressClaim {
	lis := PoolInterfaces(prof)
	if len(lis) == 0 {
		return nil
	}
	fixed := FixedAddrs(inv)
	var out []state.AddressClaim
	for _, li := range lis {
		sn := inv.Subnet(li.Subnet)
		if sn == nil {
			continue
		}
		for _, pool := range AddressPools(sn, fixed) {
			c := state.AddressClaim{Interface: li.Name, Pool: pool}
			for _, sa := range step.Addresses {
				if a, err := netip.ParseAddr(sa.Address); err == nil && sa.Interface == li.Name && sa.Subnet == sn.Name && pool.Pickable(a) {
					c.Prefer = a
				}
			}
			out = append(out, c)
		}
	}
	return out
}

// KeepAddresses returns the release policy of inv's subnets as the store's
// keep function: true for a subnet whose release is keep.
func KeepAddresses(inv *inventory.Inventory) func(subnet string) bool {
	return func(subnet string) bool {
		if inv == nil {
			return false
		}
		sn := inv.Subnet(subnet)
		return sn != nil && sn.Release == inventory.KeepAddress
	}
}

// ipamSim is the plan's simulation of IPAM over one pass: a picker per
// subnet and family over the addresses the snapshot's servers hold.
type ipamSim struct {
	want    *inventory.Inventory
	fixed   []netip.Addr
	held    map[string]state.SortedAddrs // by subnet
	pickers map[string][]*simPicker      // by subnet, one per family
}

// simPicker is a Picker that can take back the picks of a server that
// could not get all its addresses (no partial allocation).
type simPicker struct {
	pk   *state.Picker
	back []netip.Addr // returned picks, ascending: handed out first
}

func (s *simPicker) next() (netip.Addr, bool) {
	if len(s.back) > 0 {
		a := s.back[0]
		s.back = s.back[1:]
		return a, true
	}
	return s.pk.Next()
}

func (s *simPicker) giveBack(a netip.Addr) {
	i := sort.Search(len(s.back), func(i int) bool { return a.Less(s.back[i]) })
	s.back = append(s.back[:i], append([]netip.Addr{a}, s.back[i:]...)...)
}

func (sim *ipamSim) pickersOf(subnet string) []*simPicker {
	if ps, ok := sim.pickers[subnet]; ok {
		return ps
	}
	var ps []*simPicker
	if sn := sim.want.Subnet(subnet); sn != nil {
		for _, pool := range AddressPools(sn, sim.fixed) {
			ps = append(ps, &simPicker{pk: state.NewPicker(pool, sim.held[subnet])})
		}
	}
	sim.pickers[subnet] = ps
	return ps
}

// ipam gives every planned allocation to a profile with pool-mode
// interfaces its addresses, as the controller's IPAM will pick them
// (lowest free in pool order, servers in name order; a server's kept
// lease for the same interface and profile first), and drops the
// allocation and deploy of a server a pool cannot serve, with a
// CondAddressPoolExhausted condition naming the subnet and pool size.
func (p *planning) ipam() {
	pooled := false
	for i := range p.want.Profiles {
		if len(PoolInterfaces(&p.want.Profiles[i])) > 0 {
			pooled = true
			break
		}
	}
	if !pooled {
		return
	}
	sim := &ipamSim{want: p.want, fixed: FixedAddrs(p.want), held: map[string]state.SortedAddrs{}, pickers: map[string][]*simPicker{}}
	for _, s := range p.have.Servers {
		for _, l := range s.Addresses {
			if a := l.Addr(); a.IsValid() {
				sim.held[l.Subnet] = append(sim.held[l.Subnet], a)
			}
		}
	}
	for k := range sim.held {
		state.SortAddrs(sim.held[k])
	}
	var idx []int
	for i, s := range p.res.Steps {
		if s.Action == ActAllocate && len(PoolInterfaces(p.want.Profile(s.Profile))) > 0 {
			idx = append(idx, i)
		}
	}
	sort.SliceStable(idx, func(a, b int) bool { return p.res.Steps[idx[a]].Server < p.res.Steps[idx[b]].Server })
	dropped := map[string]Condition{}
	short := map[string]int{}
	shortWhy := map[string]string{}
	for _, i := range idx {
		st := &p.res.Steps[i]
		prof := p.want.Profile(st.Profile)
		got, why := sim.take(prof, p.have.Servers[st.Server])
		if why == "" {
			st.Addresses = got
			continue
		}
		msg := fmt.Sprintf("profile %s: %s; not allocated", prof.Name, why)
		dropped[st.Server] = Condition{}
		if st.AllocReason == ReasonCount {
			short[prof.Name]++
			if shortWhy[prof.Name] == "" {
				shortWhy[prof.Name] = why
			}
			continue
		}
		p.cond(Condition{Subject: "server/" + st.Server, Type: CondAddressPoolExhausted, Reason: "PoolExhausted", Message: msg})
	}
	for name, n := range short {
		p.cond(Condition{Subject: "profile/" + name, Type: CondAddressPoolExhausted, Reason: "PoolExhausted",
			Message: fmt.Sprintf("%d servers of the count not allocated: %s", n, shortWhy[name])})
	}
	if len(dropped) > 0 {
		p.res.Steps = dropServerSteps(p.res.Steps, dropped, ActAllocate, ActDeploy)
		for name := range dropped {
			delete(p.allocated, name)
		}
	}
}

// take picks srv's addresses for prof's pool interfaces; why says which
// subnet ran out (and gives the picks back) when one did.
func (sim *ipamSim) take(prof *inventory.Profile, srv *state.Server) (got []StepAddress, why string) {
	if srv == nil {
		srv = &state.Server{} // no record: no lease to keep
	}
	type pick struct {
		sp *simPicker
		a  netip.Addr
	}
	var picks []pick
	used := map[int]bool{}
	for _, li := range PoolInterfaces(prof) {
		for _, sp := range sim.pickersOf(li.Subnet) {
			pool := sp.pk.Pool()
			if i, ok := keptLease(srv, prof.Name, li.Name, pool, used); ok {
				used[i] = true
				got = append(got, StepAddress{Interface: li.Name, Subnet: li.Subnet, Address: srv.Addresses[i].Address, Kept: true})
				continue
			}
			a, ok := sp.next()
			if !ok {
				for _, pk := range picks {
					pk.sp.giveBack(pk.a)
				}
				return nil, fmt.Sprintf("subnet %s has no free IPv%d pool address for interface %s (pools of %d addresses, all held)", li.Subnet, pool.Family, li.Name, pool.Size())
			}
			picks = append(picks, pick{sp, a})
			got = append(got, StepAddress{Interface: li.Name, Subnet: li.Subnet, Address: a.String()})
		}
	}
	return got, ""
}

// keptLease finds srv's lease the claim keeps (state.Store.ApplyClaiming's
// rule): same subnet, interface and profile, of the pool's family and
// still pickable.
func keptLease(srv *state.Server, profile, iface string, pool *state.AddressPool, used map[int]bool) (int, bool) {
	for i, l := range srv.Addresses {
		if !used[i] && l.Subnet == pool.Subnet && l.Interface == iface && l.Profile == profile && pool.Pickable(l.Addr()) {
			return i, true
		}
	}
	return 0, false
}

// dropServerSteps removes the steps of actions acts of the servers in
// names.
func dropServerSteps(steps []Step, names map[string]Condition, acts ...Action) []Step {
	out := steps[:0:0]
	for _, s := range steps {
		if _, bad := names[s.Server]; bad {
			drop := false
			for _, a := range acts {
				drop = drop || s.Action == a
			}
			if drop {
				continue
			}
		}
		out = append(out, s)
	}
	return out
}
