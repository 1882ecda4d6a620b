// Package netplan renders one server's network layout (a profile's
// inventory.NetworkLayout, its NICs as commissioning matched them, its
// addresses) as a cloud-init network-config version 2 document, the
// netplan format (cloud-init docs "Networking config Version 2";
// netplan.io reference), for the NoCloud seed's network-config file.
//
// The renderer does not choose addresses: it takes them as input
// ([Host.Addresses]), fixed ones from servers.yaml and pool ones from the
// controller's IPAM, so an interface in pool mode without an assigned
// address is an error ([ErrNoAddress]), never a silent DHCP. It imports
// only package inventory.
package netplan

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"github.com/machina-metal/machina/inventory"
)

// Errors of Render and ForServer, wrapped with the interface they concern.
var (
	// ErrNoAddress: an interface in fixed or pool mode has no address of
	// a family its subnet has (servers.yaml network.addresses for fixed,
	// IPAM for pool).
	ErrNoAddress = errors.New("no address assigned")
	// ErrNoNIC: an ethernet of the layout has no matched NIC.
	ErrNoNIC = errors.New("no NIC matched")
	// ErrUnknownSubnet: an interface names a subnet the inventory lacks.
	ErrUnknownSubnet = errors.New("unknown subnet")
)

// Host is what Render needs of one server.
type Host struct {
	Layout *inventory.NetworkLayout
	// Subnets resolves a subnet name (inventory.Inventory.Subnet).
	Subnets func(name string) *inventory.Subnet
	// NICs are the matched NICs by ethernet name (inventory.MatchNICs).
	NICs map[string]inventory.NIC
	// Addresses are the assigned addresses by interface name, at most one
	// per family: the fixed ones (FixedAddresses) and IPAM's for pool
	// interfaces. The prefix length is the subnet's.
	Addresses map[string][]netip.Addr
}

// Render returns h as a network-config version 2 document. Ethernets match
// their NIC by MAC address (kernel names may differ between the ramdisk
// and the installed OS) and take the layout's name with set-name. Output
// is deterministic: interfaces in layout order, every string quoted as a
// JSON string (valid YAML 1.1 and 1.2, so an all-digit MAC is never read
// as a base-60 number).
func Render(h Host) ([]byte, error) {
	l := h.Layout
	if l == nil {
		return nil, errors.New("netplan: render: no layout")
	}
	doc := obj{{"version", 2}}
	var eths, bonds, vlans, bridges obj
	for _, li := range l.Interfaces() {
		body, err := h.common(li)
		if err != nil {
			return nil, fmt.Errorf("netplan: render %s: %w", li.Name, err)
		}
		switch li.Kind {
		case "ethernets":
			nic, ok := h.NICs[li.Name]
			if !ok || nic.MAC == "" {
				return nil, fmt.Errorf("netplan: render %s: %w", li.Name, ErrNoNIC)
			}
			head := obj{{"match", obj{{"macaddress", nic.MAC}}}, {"set-name", li.Name}}
			eths = append(eths, kv{li.Name, append(head, body...)})
		case "bonds":
			b := l.Bonds[li.Index]
			params := obj{{"mode", b.Mode}}
			mii := 100
			if b.MIIMon != nil {
				mii = *b.MIIMon
			}
			params = append(params, kv{"mii-monitor-interval", mii})
			if b.LACPRate != "" {
				params = append(params, kv{"lacp-rate", b.LACPRate})
			}
			if b.HashPolicy != "" {
				params = append(params, kv{"transmit-hash-policy", b.HashPolicy})
			}
			head := obj{{"interfaces", strs(b.Members)}, {"parameters", params}}
			bonds = append(bonds, kv{li.Name, append(head, body...)})
		case "vlans":
			v := l.VLANs[li.Index]
			id := v.ID
			if id == 0 {
				if sn := h.Subnets(v.Subnet); sn != nil {
					id = sn.VLAN
				}
			}
			if id == 0 {
				return nil, fmt.Errorf("netplan: render %s: vlan has no id", li.Name)
			}
			head := obj{{"id", id}, {"link", v.Link}}
			vlans = append(vlans, kv{li.Name, append(head, body...)})
		case "bridges":
			br := l.Bridges[li.Index]
			stp := false
			if br.STP != nil {
				stp = *br.STP
			}
			head := obj{{"interfaces", strs(br.Interfaces)}, {"parameters", obj{{"stp", stp}}}}
			bridges = append(bridges, kv{li.Name, append(head, body...)})
		}
	}
	for _, sec := range []kv{{"ethernets", eths}, {"bonds", bonds}, {"vlans", vlans}, {"bridges", bridges}} {
		if len(sec.v.(obj)) > 0 {
			doc = append(doc, sec)
		}
	}
	var b strings.Builder
	b.WriteString("# Written by Machina from the inventory's network layout (cloud-init network-config v2).\n")
	emit(&b, doc, 0)
	return []byte(b.String()), nil
}

// common renders what every interface kind carries: MTU, addresses or
// DHCP, routes and resolvers.
func (h Host) common(li inventory.LayoutInterface) (obj, error) {
	var sn *inventory.Subnet
	if li.Subnet != "" {
		if sn = h.Subnets(li.Subnet); sn == nil {
			return nil, fmt.Errorf("%w %q", ErrUnknownSubnet, li.Subnet)
		}
	}
	var out obj
	mtu := li.MTU
	if mtu == 0 && sn != nil {
		mtu = sn.MTU
	}
	if mtu > 0 {
		out = append(out, kv{"mtu", mtu})
	}
	var routes []any
	switch li.Address {
	case inventory.AddressDHCP:
		out = append(out, kv{"dhcp4", sn == nil || sn.CIDR != ""}, kv{"dhcp6", sn != nil && sn.CIDR6 != ""})
	case inventory.AddressFixed, inventory.AddressPool:
		addrs, err := prefixed(sn, h.Addresses[li.Name])
		if err != nil {
			return nil, fmt.Errorf("address %s on subnet %s: %w", li.Address, sn.Name, err)
		}
		out = append(out, kv{"dhcp4", false}, kv{"dhcp6", false}, kv{"addresses", addrs})
		if li.DefaultRoute {
			if sn.Gateway != "" {
				routes = append(routes, obj{{"to", "0.0.0.0/0"}, {"via", sn.Gateway}})
			}
			if sn.Gateway6 != "" {
				routes = append(routes, obj{{"to", "::/0"}, {"via", sn.Gateway6}})
			}
		}
	default:
		out = append(out, kv{"dhcp4", false}, kv{"dhcp6", false})
	}
	for _, r := range li.Routes {
		to := r.To
		if to == "default" {
			to = "0.0.0.0/0"
			if a, err := netip.ParseAddr(r.Via); err == nil && a.Is6() {
				to = "::/0"
			}
		}
		ro := obj{{"to", to}, {"via", r.Via}}
		if r.Metric != nil {
			ro = append(ro, kv{"metric", *r.Metric})
		}
		routes = append(routes, ro)
	}
	if len(routes) > 0 {
		out = append(out, kv{"routes", routes})
	}
	if sn != nil && sn.DNS != nil && li.Address != inventory.AddressNone && (len(sn.DNS.Servers) > 0 || len(sn.DNS.Search) > 0) {
		ns := obj{}
		if len(sn.DNS.Servers) > 0 {
			ns = append(ns, kv{"addresses", strs(sn.DNS.Servers)})
		}
		if len(sn.DNS.Search) > 0 {
			ns = append(ns, kv{"search", strs(sn.DNS.Search)})
		}
		out = append(out, kv{"nameservers", ns})
	}
	return out, nil
}

// prefixed gives each address of as its subnet's prefix length, and
// wants one address for each family the subnet has.
func prefixed(sn *inventory.Subnet, as []netip.Addr) ([]any, error) {
	var out []any
	have := map[bool]bool{}
	for _, a := range as {
		p, ok := sn.Prefix(a)
		if !ok || !p.Contains(a) {
			return nil, fmt.Errorf("%s is outside the subnet's prefixes", a)
		}
		have[a.Is4()] = true
		out = append(out, netip.PrefixFrom(a, p.Bits()).String())
	}
	var missing []string
	if sn.CIDR != "" && !have[true] {
		missing = append(missing, "IPv4 ("+sn.CIDR+")")
	}
	if sn.CIDR6 != "" && !have[false] {
		missing = append(missing, "IPv6 ("+sn.CIDR6+")")
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrNoAddress, strings.Join(missing, " and "))
	}
	return out, nil
}

// FixedAddresses returns ws's servers.yaml addresses (network.addresses)
// of the interfaces of l in fixed mode, parsed. Addresses of interfaces in
// other modes are left out.
func FixedAddresses(l *inventory.NetworkLayout, ws *inventory.Server) map[string][]netip.Addr {
	out := map[string][]netip.Addr{}
	if ws == nil || ws.Network == nil {
		return out
	}
	for _, li := range l.Interfaces() {
		if li.Address != inventory.AddressFixed {
			continue
		}
		for _, s := range ws.Network.Addresses[li.Name] {
			if a, err := netip.ParseAddr(s); err == nil {
				out[li.Name] = append(out[li.Name], a)
			}
		}
	}
	return out
}

// ForServer renders the network-config of server ws deployed with profile
// p: its NICs matched (ws's network.nics override the profile's match;
// a *inventory.MissingNICsError when the layout cannot be carried), its
// fixed addresses from servers.yaml and pool addresses from assigned (by
// interface name; nil before IPAM). A profile without a layout returns
// nil and no error: the caller keeps its default.
func ForServer(inv *inventory.Inventory, p *inventory.Profile, ws *inventory.Server, nics []inventory.NIC, assigned map[string][]netip.Addr) ([]byte, error) {
	if p == nil || p.Network == nil {
		return nil, nil
	}
	var sn *inventory.ServerNetwork
	if ws != nil {
		sn = ws.Network
	}
	matched, err := inventory.MatchNICs(p.Network, sn, nics)
	if err != nil {
		return nil, fmt.Errorf("netplan: %w", err)
	}
	addrs := FixedAddresses(p.Network, ws)
	for _, li := range p.Network.Interfaces() {
		if li.Address == inventory.AddressPool {
			addrs[li.Name] = assigned[li.Name]
		}
	}
	return Render(Host{Layout: p.Network, Subnets: inv.Subnet, NICs: matched, Addresses: addrs})
}

// kv is one mapping entry; obj a mapping in order.
type kv struct {
	k string
	v any
}

type obj []kv

func strs(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// emit writes v as block YAML at indent: mappings and sequences in block
// style, strings as JSON strings, numbers and booleans plain.
func emit(b *strings.Builder, v obj, indent int) {
	pad := strings.Repeat(" ", indent)
	for _, e := range v {
		b.WriteString(pad + key(e.k) + ":")
		emitValue(b, e.v, indent)
	}
}

func emitValue(b *strings.Builder, v any, indent int) {
	switch t := v.(type) {
	case obj:
		b.WriteString("\n")
		emit(b, t, indent+2)
	case []any:
		b.WriteString("\n")
		pad := strings.Repeat(" ", indent+2)
		for _, it := range t {
			if o, ok := it.(obj); ok {
				// "- k: v" with the rest of the mapping aligned under k.
				b.WriteString(pad + "- " + key(o[0].k) + ":")
				emitValue(b, o[0].v, indent+4)
				emit(b, o[1:], indent+4)
				continue
			}
			b.WriteString(pad + "-")
			emitValue(b, it, indent+2)
		}
	default:
		b.WriteString(" " + scalar(t) + "\n")
	}
}

// plainKey is a key YAML 1.1 and 1.2 both read as that string unquoted.
var plainKey = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)

// key renders a mapping key: plain when both YAML versions read it as a
// string, else as a JSON string (an interface named "123", "on" or
// "bond0.120").
func key(k string) string {
	switch k {
	case "y", "n", "yes", "no", "on", "off", "true", "false", "null":
	default:
		if plainKey.MatchString(k) {
			return k
		}
	}
	return scalar(k)
}

func scalar(v any) string {
	switch t := v.(type) {
	case string:
		q, _ := json.Marshal(t) // a string always encodes
		return string(q)
	case bool:
		return strconv.FormatBool(t)
	case int:
		return strconv.Itoa(t)
	case int64:
		return strconv.FormatInt(t, 10)
	}
	panic(fmt.Sprintf("netplan: emit %T", v)) // programmer bug: only the types above are built
}
