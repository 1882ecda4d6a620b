package inventory

import (
	"fmt"
	"net/netip"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/machina-metal/machina/macaddr"
)

// NetworksFile is the optional file of the site's subnets, beside
// servers.yaml (schema/networks.schema.json).
const NetworksFile = "networks.yaml"

// ReleasePolicy says what IPAM does with a pool address when its server is
// released.
type ReleasePolicy string

// Release policies. The zero value in a file means ReleaseAddress.
const (
	// ReleaseAddress returns the address to the pool on release.
	ReleaseAddress ReleasePolicy = "release"
	// KeepAddress keeps the address with the server for its next deploy.
	KeepAddress ReleasePolicy = "keep"
)

// Subnet is one entry of networks.yaml: an L3 network with an IPv4 prefix
// (CIDR, Gateway), an IPv6 prefix (CIDR6, Gateway6) or both, normalised:
// prefixes and addresses in their canonical text form (netip), Release
// defaulted. A subnet's prefixes are never an interface's address: an
// interface gets one only through its address mode (see [AddressMode]).
type Subnet struct {
	Name     string `json:"name"`
	CIDR     string `json:"cidr,omitempty"`
	Gateway  string `json:"gateway,omitempty"`
	CIDR6    string `json:"cidr6,omitempty"`
	Gateway6 string `json:"gateway6,omitempty"`
	DNS      *DNS   `json:"dns,omitempty"`
	// MTU in bytes; 0 leaves the kernel's default (1500 on Ethernet).
	MTU int `json:"mtu,omitempty"`
	// VLAN is the 802.1Q VLAN ID the subnet is carried on; 0: untagged.
	VLAN int `json:"vlan,omitempty"`
	// Pools are the ranges IPAM hands out; Reserved the ranges it never
	// hands out (they may overlap Pools and win).
	Pools    []AddressRange `json:"pools,omitempty"`
	Reserved []AddressRange `json:"reserved,omitempty"`
	Release  ReleasePolicy  `json:"release,omitempty"`
}

// DNS is a subnet's resolvers and search domains (netplan nameservers).
type DNS struct {
	Servers []string `json:"servers,omitempty"`
	Search  []string `json:"search,omitempty"`
}

// AddressRange is an inclusive range of addresses of one family.
type AddressRange struct {
	Start   string `json:"start"`
	End     string `json:"end"`
	Comment string `json:"comment,omitempty"`
}

// Bounds returns the range's first and last address; ok is false when
// either does not parse or the two differ in family.
func (r AddressRange) Bounds() (start, end netip.Addr, ok bool) {
	s, err1 := netip.ParseAddr(r.Start)
	e, err2 := netip.ParseAddr(r.End)
	if err1 != nil || err2 != nil || s.Is4() != e.Is4() {
		return netip.Addr{}, netip.Addr{}, false
	}
	return s, e, true
}

// Contains reports whether a is inside the range.
func (r AddressRange) Contains(a netip.Addr) bool {
	s, e, ok := r.Bounds()
	return ok && s.Is4() == a.Is4() && s.Compare(a) <= 0 && a.Compare(e) <= 0
}

// Prefix returns the subnet's prefix of a's family, and whether it has
// one.
func (s *Subnet) Prefix(a netip.Addr) (netip.Prefix, bool) {
	c := s.CIDR
	if a.Is6() {
		c = s.CIDR6
	}
	p, err := netip.ParsePrefix(c)
	return p, err == nil
}

// Contains reports whether a is inside one of the subnet's prefixes.
func (s *Subnet) Contains(a netip.Addr) bool {
	p, ok := s.Prefix(a)
	return ok && p.Contains(a)
}

// InPool reports whether a is inside one of the subnet's pools.
func (s *Subnet) InPool(a netip.Addr) bool {
	for _, r := range s.Pools {
		if r.Contains(a) {
			return true
		}
	}
	return false
}

// Subnet returns the subnet named name, or nil.
func (inv *Inventory) Subnet(name string) *Subnet {
	for i := range inv.Subnets {
		if inv.Subnets[i].Name == name {
			return &inv.Subnets[i]
		}
	}
	return nil
}

// AddressMode is how an interface of a layout gets its address.
type AddressMode string

// Address modes. The zero value in a file means AddressNone.
const (
	// AddressNone: no address (a bond member, a bridge port, a
	// storage-only link).
	AddressNone AddressMode = "none"
	// AddressDHCP: DHCPv4 (and IPv6 router advertisements / DHCPv6 where
	// the subnet has an IPv6 prefix) from the site's own servers.
	AddressDHCP AddressMode = "dhcp"
	// AddressFixed: the address servers.yaml gives this server for this
	// interface (network.addresses), with the subnet's prefix length.
	AddressFixed AddressMode = "fixed"
	// AddressPool: an address IPAM assigns from the subnet's pools. A
	// deploy without an assigned address is refused, never turned into
	// DHCP.
	AddressPool AddressMode = "pool"
)

// Attachment is what every interface of a layout may carry: the subnet
// it is on, how it gets its address, whether it holds the default route,
// its MTU and static routes.
type Attachment struct {
	Subnet  string      `json:"subnet,omitempty"`
	Address AddressMode `json:"address,omitempty"`
	// DefaultRoute routes 0.0.0.0/0 via the subnet's Gateway (and ::/0
	// via Gateway6) on this interface; at most one per layout.
	DefaultRoute bool `json:"defaultRoute,omitempty"`
	// MTU in bytes; 0 means the subnet's, else the kernel's default.
	MTU    int     `json:"mtu,omitempty"`
	Routes []Route `json:"routes,omitempty"`
}

// Route is a static route: To is a prefix or "default", Via the next hop.
type Route struct {
	To     string `json:"to"`
	Via    string `json:"via"`
	Metric *int64 `json:"metric,omitempty"`
}

// NICMatch picks a physical NIC from the commissioning report. Every
// field set must hold: MAC (normalised lower-case colon form), Name and
// Driver (shell globs, path.Match), SpeedMbps (the measured link speed:
// only NICs with link at commissioning report one). Without Index the
// first matching NIC, in PCI address order then name, that no earlier
// ethernet of the layout took; with Index the Index-th (0-based) of all
// matching NICs in that order.
type NICMatch struct {
	MAC       string `json:"mac,omitempty"`
	Name      string `json:"name,omitempty"`
	Driver    string `json:"driver,omitempty"`
	SpeedMbps int    `json:"speedMbps,omitempty"`
	Index     *int   `json:"index,omitempty"`
}

// String renders m as the layout states it, e.g. "speedMbps=25000 index=1".
func (m NICMatch) String() string {
	var p []string
	if m.MAC != "" {
		p = append(p, "mac="+m.MAC)
	}
	if m.Name != "" {
		p = append(p, "name="+m.Name)
	}
	if m.Driver != "" {
		p = append(p, "driver="+m.Driver)
	}
	if m.SpeedMbps != 0 {
		p = append(p, "speedMbps="+strconv.Itoa(m.SpeedMbps))
	}
	if m.Index != nil {
		p = append(p, "index="+strconv.Itoa(*m.Index))
	}
	return strings.Join(p, " ")
}

// Ethernet is a physical NIC of a layout.
type Ethernet struct {
	Name  string   `json:"name"`
	Match NICMatch `json:"match"`
	Attachment
}

// Bond modes (Linux bonding driver mode names; netplan bonds parameters
// mode).
const (
	Bond8023AD       = "802.3ad"
	BondActiveBackup = "active-backup"
	BondBalanceXOR   = "balance-xor"
)

// Bond is a Linux bond over ethernets of the layout. MIIMon is the MII
// link monitoring interval in milliseconds (nil: 100); LACPRate "slow" or
// "fast" (802.3ad only); HashPolicy the xmit_hash_policy (802.3ad and
// balance-xor).
type Bond struct {
	Name       string   `json:"name"`
	Members    []string `json:"members"`
	Mode       string   `json:"mode"`
	MIIMon     *int     `json:"miimon,omitempty"`
	LACPRate   string   `json:"lacpRate,omitempty"`
	HashPolicy string   `json:"hashPolicy,omitempty"`
	Attachment
}

// VLANInterface is an 802.1Q VLAN interface on Link; ID 0 takes the
// subnet's VLAN.
type VLANInterface struct {
	Name string `json:"name"`
	Link string `json:"link"`
	ID   int    `json:"id,omitempty"`
	Attachment
}

// Bridge is a Linux bridge over Interfaces of the layout.
type Bridge struct {
	Name       string   `json:"name"`
	Interfaces []string `json:"interfaces"`
	STP        *bool    `json:"stp,omitempty"`
	Attachment
}

// NetworkLayout is a profile's interface layout (profiles.yaml network):
// what a deployed host's NICs, bonds, VLANs and bridges are and which
// subnets they are on. Interface names are unique across the four lists.
type NetworkLayout struct {
	Ethernets []Ethernet      `json:"ethernets,omitempty"`
	Bonds     []Bond          `json:"bonds,omitempty"`
	VLANs     []VLANInterface `json:"vlans,omitempty"`
	Bridges   []Bridge        `json:"bridges,omitempty"`
}

// LayoutInterface is one interface of a layout, whatever its kind, as
// [NetworkLayout.Interfaces] lists them.
type LayoutInterface struct {
	// Kind is "ethernets", "bonds", "vlans" or "bridges" (the list it
	// is in); Index its index there.
	Kind  string
	Index int
	Name  string
	*Attachment
	// Parents are the interfaces it is built on: a bond's members, a
	// VLAN's link, a bridge's ports.
	Parents []string
}

// Interfaces lists every interface of l: ethernets, bonds, VLANs, then
// bridges, each in file order. The attachments point into l.
func (l *NetworkLayout) Interfaces() []LayoutInterface {
	var out []LayoutInterface
	for i := range l.Ethernets {
		e := &l.Ethernets[i]
		out = append(out, LayoutInterface{Kind: "ethernets", Index: i, Name: e.Name, Attachment: &e.Attachment})
	}
	for i := range l.Bonds {
		b := &l.Bonds[i]
		out = append(out, LayoutInterface{Kind: "bonds", Index: i, Name: b.Name, Attachment: &b.Attachment, Parents: b.Members})
	}
	for i := range l.VLANs {
		v := &l.VLANs[i]
		out = append(out, LayoutInterface{Kind: "vlans", Index: i, Name: v.Name, Attachment: &v.Attachment, Parents: []string{v.Link}})
	}
	for i := range l.Bridges {
		b := &l.Bridges[i]
		out = append(out, LayoutInterface{Kind: "bridges", Index: i, Name: b.Name, Attachment: &b.Attachment, Parents: b.Interfaces})
	}
	return out
}

// ServerNetwork is one server's part of its profile's layout
// (servers.yaml network).
type ServerNetwork struct {
	// Addresses are the fixed addresses by interface name (address:
	// fixed), at most one per family, canonical text form.
	Addresses map[string][]string `json:"addresses,omitempty"`
	// NICs replace the profile's match of the named ethernets on this
	// server (an odd machine whose NICs differ).
	NICs map[string]NICMatch `json:"nics,omitempty"`
}

// CloudInit is a profile's own first-boot configuration: cloud-config
// mappings merged into the NoCloud seed's user-data (UserData) and
// written as its vendor-data (VendorData). Machina's own keys (the
// machina user, its SSH keys, the join command) cannot be dropped or
// overridden by either.
type CloudInit struct {
	UserData   map[string]any `json:"userData,omitempty"`
	VendorData map[string]any `json:"vendorData,omitempty"`
}

// NIC is one network interface as commissioning reported it: the input
// of [MatchNICs]. PCIAddress is the PCI function ("0000:3b:00.0"), ""
// when unknown (virtual NICs, reports that predate it); SpeedMbps 0 when
// the link was down.
type NIC struct {
	Name       string
	MAC        string
	Driver     string
	PCIAddress string
	SpeedMbps  int
}

// matches reports whether nic meets every field of m but Index.
func (m NICMatch) matches(nic NIC) bool {
	if m.MAC != "" && !strings.EqualFold(m.MAC, nic.MAC) {
		return false
	}
	if m.Name != "" {
		if ok, _ := path.Match(m.Name, nic.Name); !ok {
			return false
		}
	}
	if m.Driver != "" {
		if ok, _ := path.Match(m.Driver, nic.Driver); !ok {
			return false
		}
	}
	return m.SpeedMbps == 0 || m.SpeedMbps == nic.SpeedMbps
}

// MissingNICsError is a layout a server's NICs cannot carry: one line
// per ethernet that found no NIC, naming what it asked for and what
// commissioning found.
type MissingNICsError struct {
	Missing []string
}

func (e *MissingNICsError) Error() string {
	return "the network layout needs NICs the commissioning report does not have: " + strings.Join(e.Missing, "; ")
}

// MatchNICs assigns a NIC of nics to every ethernet of l (sn's NICs
// override the profile's match by ethernet name; sn may be nil). NICs are
// ordered by PCI address (those without one last), then name. It returns
// ethernet name → NIC, or a *MissingNICsError naming every ethernet left
// without one: a layout is carried whole or not at all.
func MatchNICs(l *NetworkLayout, sn *ServerNetwork, nics []NIC) (map[string]NIC, error) {
	sorted := append([]NIC(nil), nics...)
	sort.SliceStable(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if (a.PCIAddress == "") != (b.PCIAddress == "") {
			return a.PCIAddress != ""
		}
		if a.PCIAddress != b.PCIAddress {
			return a.PCIAddress < b.PCIAddress
		}
		return a.Name < b.Name
	})
	out := map[string]NIC{}
	takenBy := map[string]string{} // MAC → ethernet
	var missing []string
	for _, e := range l.Ethernets {
		m := e.Match
		if sn != nil {
			if o, ok := sn.NICs[e.Name]; ok {
				m = o
			}
		}
		var cand []NIC
		for _, n := range sorted {
			if m.matches(n) {
				cand = append(cand, n)
			}
		}
		found := false
		if m.Index != nil {
			if *m.Index < len(cand) {
				n := cand[*m.Index]
				if other, taken := takenBy[n.MAC]; taken {
					missing = append(missing, fmt.Sprintf("ethernet %s (%s): NIC %s is already ethernet %s", e.Name, m, n.Name, other))
					continue
				}
				out[e.Name], takenBy[n.MAC], found = n, e.Name, true
			}
		} else {
			for _, n := range cand {
				if _, taken := takenBy[n.MAC]; !taken {
					out[e.Name], takenBy[n.MAC], found = n, e.Name, true
					break
				}
			}
		}
		if !found {
			missing = append(missing, fmt.Sprintf("ethernet %s (%s): %s", e.Name, m, foundNICs(cand, takenBy)))
		}
	}
	if len(missing) > 0 {
		return nil, &MissingNICsError{Missing: missing}
	}
	return out, nil
}

// foundNICs says which NICs matched and which ethernets took them.
func foundNICs(cand []NIC, takenBy map[string]string) string {
	if len(cand) == 0 {
		return "no NIC of the commissioning report matches"
	}
	var p []string
	for _, n := range cand {
		s := n.Name
		if e, ok := takenBy[n.MAC]; ok {
			s += " (taken by " + e + ")"
		}
		p = append(p, s)
	}
	return fmt.Sprintf("commissioning found %d matching (%s)", len(cand), strings.Join(p, ", "))
}

// normaliseNetworks puts MACs and addresses in canonical form and fills
// the defaults of the network parts of inv. It runs only on schema-valid
// input; a value that does not parse is left for the checks to report.
func normaliseNetworks(inv *Inventory) {
	canon := func(s *string) {
		if a, err := netip.ParseAddr(*s); err == nil {
			*s = a.String()
		}
	}
	canonPrefix := func(s *string) {
		if p, err := netip.ParsePrefix(*s); err == nil {
			*s = p.String()
		}
	}
	for i := range inv.Subnets {
		sn := &inv.Subnets[i]
		if sn.Release == "" {
			sn.Release = ReleaseAddress
		}
		canonPrefix(&sn.CIDR)
		canonPrefix(&sn.CIDR6)
		canon(&sn.Gateway)
		canon(&sn.Gateway6)
		for _, rs := range [][]AddressRange{sn.Pools, sn.Reserved} {
			for k := range rs {
				canon(&rs[k].Start)
				canon(&rs[k].End)
			}
		}
		if sn.DNS != nil {
			for k := range sn.DNS.Servers {
				canon(&sn.DNS.Servers[k])
			}
		}
	}
	for i := range inv.Profiles {
		l := inv.Profiles[i].Network
		if l == nil {
			continue
		}
		for _, li := range l.Interfaces() {
			if li.Address == "" {
				li.Address = AddressNone
			}
		}
		for k := range l.Ethernets {
			normMAC(&l.Ethernets[k].Match.MAC)
		}
	}
	for i := range inv.Servers {
		n := inv.Servers[i].Network
		if n == nil {
			continue
		}
		for _, as := range n.Addresses {
			for k := range as {
				canon(&as[k])
			}
		}
		for name, m := range n.NICs {
			normMAC(&m.MAC)
			n.NICs[name] = m
		}
	}
}

// normMAC rewrites *s in lower-case colon form when it parses.
func normMAC(s *string) {
	if *s == "" {
		return
	}
	if m, err := macaddr.Normalize(strings.TrimSpace(*s)); err == nil {
		*s = m
	}
}

// Files lists every file [Load] reads at the repository root, in its
// order: the list the Git source, the enrolment proposer and machinactl
// plan read from a commit, so an inventory file is never left behind.
var Files = []string{ServersFile, ProfilesFile, ImagesFile, NetworksFile}
