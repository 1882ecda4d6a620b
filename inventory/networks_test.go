package inventory

import (
	"errors"
	"strings"
	"testing"
	"testing/fstest"
)

// netBase is a small valid inventory with networks: two servers pinned
// to a profile whose layout bonds two 25G ports under a bridge on subnet
// mgmt (fixed addresses) with a VLAN on subnet jumbo.
var netBase = map[string]string{
	ServersFile: `servers:
  - name: s1
    zone: z
    bootMAC: "52:54:00:00:00:01"
    bmc: {driver: redfish, address: "https://10.9.0.1", credentials: c}
    profile: p
    network:
      addresses: {br0: [10.0.0.11]}
  - name: s2
    zone: z
    bootMAC: "52:54:00:00:00:02"
    bmc: {driver: redfish, address: "https://10.9.0.2", credentials: c}
    profile: p
    network:
      addresses: {br0: [10.0.0.12]}
      nics: {fast1: {mac: "b4:96:91:00:00:aa"}}
`,
	ProfilesFile: `profiles:
  - name: p
    image: img
    sshKeys: ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO4VqFGm2ahY3KSc9k9lrQMD0j2/tR46oEgCPUxiE9s7 ops@lab1"]
    zone: z
    count: 2
    network:
      ethernets:
        - {name: fast0, match: {speedMbps: 25000}}
        - {name: fast1, match: {speedMbps: 25000}}
      bonds:
        - {name: bond0, members: [fast0, fast1], mode: 802.3ad, lacpRate: fast, hashPolicy: layer3+4, mtu: 9000}
      vlans:
        - {name: bond0.10, link: bond0, subnet: jumbo, address: pool}
      bridges:
        - {name: br0, interfaces: [bond0], subnet: mgmt, address: fixed, defaultRoute: true}
`,
	ImagesFile: `images:
  - {name: img, catalog: debian-12}
`,
	NetworksFile: `subnets:
  - name: mgmt
    cidr: 10.0.0.0/24
    gateway: 10.0.0.1
    pools: [{start: 10.0.0.100, end: 10.0.0.150}]
  - name: jumbo
    cidr: 10.1.0.0/24
    cidr6: fd00:1::/64
    vlan: 10
    mtu: 9000
    pools: [{start: 10.1.0.10, end: 10.1.0.250}]
`,
}

func loadNet(t *testing.T, files map[string]string) (*Result, error) {
	t.Helper()
	fsys := fstest.MapFS{}
	for k, v := range files {
		fsys[k] = &fstest.MapFile{Data: []byte(v)}
	}
	return Load(fsys, Limits{})
}

// TestNetworksValid: the base loads without a warning, normalised:
// release policy defaulted, MACs and addresses canonical, address modes
// filled.
func TestNetworksValid(t *testing.T) {
	res, err := loadNet(t, netBase)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Warnings) > 0 {
		t.Fatalf("warnings: %v", res.Warnings)
	}
	inv := res.Inventory
	if sn := inv.Subnet("jumbo"); sn == nil || sn.Release != ReleaseAddress || sn.CIDR6 != "fd00:1::/64" {
		t.Errorf("subnet jumbo = %+v", sn)
	}
	l := inv.Profile("p").Network
	if l.Ethernets[0].Address != AddressNone || l.Bridges[0].Address != AddressFixed {
		t.Errorf("address modes %q %q", l.Ethernets[0].Address, l.Bridges[0].Address)
	}
}

// TestNetworkRules: every network rule, each from one failing input (a
// change to the valid base), with the file:line:column and field path it
// is reported at. Warnings are checked as warnings.
func TestNetworkRules(t *testing.T) {
	tests := []struct {
		name      string
		file, old string
		new       string
		want      string // the problem's Error() text
		warning   bool
	}{
		{"unknown subnet", ProfilesFile, "subnet: mgmt", "subnet: nope",
			`profiles.yaml:16:52: profiles[0].network.bridges[0].subnet: subnet "nope" is not defined in networks.yaml`, false},
		{"address outside its CIDR", ServersFile, "br0: [10.0.0.11]", "br0: [10.9.9.9]",
			"servers.yaml:8:25: servers[0].network.addresses.br0[0]: 10.9.9.9 is outside subnet mgmt's 10.0.0.0/24", false},
		{"address inside another subnet", ServersFile, "br0: [10.0.0.11]", "br0: [10.1.0.5]",
			"servers.yaml:8:25: servers[0].network.addresses.br0[0]: 10.1.0.5 is outside subnet mgmt's 10.0.0.0/24; it is inside subnet jumbo", false},
		{"fixed address inside a pool", ServersFile, "br0: [10.0.0.11]", "br0: [10.0.0.120]",
			"servers.yaml:8:25: servers[0].network.addresses.br0[0]: 10.0.0.120 is inside a pool of subnet mgmt: IPAM could hand it to another host; take it out of the pool or put it in reserved", false},
		{"duplicate fixed addresses", ServersFile, "br0: [10.0.0.12]", "br0: [10.0.0.11]",
			"servers.yaml:15:25: servers[1].network.addresses.br0[0]: address 10.0.0.11 is also servers[0].network.addresses.br0 (servers.yaml:8:25)", false},
		{"overlapping CIDRs", NetworksFile, "cidr: 10.1.0.0/24", "cidr: 10.0.0.128/25",
			"networks.yaml:7:11: subnets[1].cidr: 10.0.0.128/25 overlaps subnet mgmt's 10.0.0.0/24 (networks.yaml:3:11)", false},
		{"gateway outside its CIDR", NetworksFile, "gateway: 10.0.0.1", "gateway: 10.5.0.1",
			"networks.yaml:4:14: subnets[0].gateway: gateway 10.5.0.1 is outside the subnet's cidr 10.0.0.0/24", false},
		{"VLAN MTU above its parent's", ProfilesFile, "hashPolicy: layer3+4, mtu: 9000}", "hashPolicy: layer3+4}",
			"profiles.yaml:14:49: profiles[0].network.vlans[0].subnet: vlan bond0.10's MTU 9000 is above its link bond0's MTU 1500; raise bond0's mtu (or its subnet's) to at least 9000", false},
		{"bond with one member", ProfilesFile, "members: [fast0, fast1]", "members: [fast0]",
			"profiles.yaml:12:34: warning: profiles[0].network.bonds[0].members: bond bond0 has one member: it gives no redundancy; add a second ethernet or use the ethernet directly", true},
		{"pool smaller than the count", NetworksFile, "end: 10.1.0.250}", "end: 10.1.0.10}",
			"profiles.yaml:14:65: warning: profiles[0].network.vlans[0].address: subnet jumbo's pools hold 1 addresses (reserved ranges taken out); the profiles in pool mode on it keep 2 hosts deployed (this one: count 2)", true},
		{"reserved ranges shrink a pool", NetworksFile, "pools: [{start: 10.1.0.10, end: 10.1.0.250}]", "pools: [{start: 10.1.0.10, end: 10.1.0.11}]\n    reserved: [{start: 10.1.0.11, end: 10.1.0.20}]",
			"profiles.yaml:14:65: warning: profiles[0].network.vlans[0].address: subnet jumbo's pools hold 1 addresses (reserved ranges taken out); the profiles in pool mode on it keep 2 hosts deployed (this one: count 2)", true},
		{"prefix with host bits", NetworksFile, "cidr: 10.0.0.0/24", "cidr: 10.0.0.5/24",
			"networks.yaml:3:11: subnets[0].cidr: 10.0.0.5/24 has host bits set; the prefix is 10.0.0.0/24", false},
		{"pool outside the prefix", NetworksFile, "end: 10.0.0.150}", "end: 10.0.1.150}",
			"networks.yaml:5:13: subnets[0].pools[0]: range 10.0.0.100-10.0.1.150 is outside the subnet's prefix 10.0.0.0/24", false},
		{"pools overlap", NetworksFile, "pools: [{start: 10.0.0.100, end: 10.0.0.150}]", "pools: [{start: 10.0.0.100, end: 10.0.0.150}, {start: 10.0.0.150, end: 10.0.0.160}]",
			"networks.yaml:5:51: subnets[0].pools[1]: pool 10.0.0.150-10.0.0.160 overlaps pool 10.0.0.100-10.0.0.150 (networks.yaml:5:13)", false},
		{"range end before start", NetworksFile, "end: 10.0.0.150}", "end: 10.0.0.50}",
			"networks.yaml:5:38: subnets[0].pools[0].end: end 10.0.0.50 is before start 10.0.0.100", false},
		{"duplicate subnet", NetworksFile, "name: jumbo", "name: mgmt",
			`networks.yaml:6:11: subnets[1].name: duplicate subnet name "mgmt" (first at networks.yaml:2:11)`, false},
		{"interface named twice", ProfilesFile, "{name: br0,", "{name: bond0,",
			`profiles.yaml:16:18: profiles[0].network.bridges[0].name: interface "bond0" is named twice in this layout (first at profiles.yaml:12:18)`, false},
		{"unknown bond member", ProfilesFile, "members: [fast0, fast1]", "members: [fast0, fast2]",
			`profiles.yaml:12:42: profiles[0].network.bonds[0].members[1]: interface "fast2" is not in this layout`, false},
		{"port carrying an address", ProfilesFile, "{name: fast0, match: {speedMbps: 25000}}", "{name: fast0, match: {speedMbps: 25000}, subnet: mgmt, address: dhcp}",
			"profiles.yaml:9:11: profiles[0].network.ethernets[0]: fast0 is a port of bond0 and carries no subnet or address of its own; attach them to bond0", false},
		{"port of two parents", ProfilesFile, "interfaces: [bond0]", "interfaces: [bond0, fast1]",
			"profiles.yaml:16:43: profiles[0].network.bridges[0].interfaces[1]: fast1 is already a port of bond0", false},
		{"lacpRate without 802.3ad", ProfilesFile, "mode: 802.3ad, lacpRate: fast, hashPolicy: layer3+4", "mode: active-backup, lacpRate: fast",
			"profiles.yaml:12:81: profiles[0].network.bonds[0].lacpRate: lacpRate applies to mode 802.3ad, not active-backup", false},
		{"hashPolicy on active-backup", ProfilesFile, "mode: 802.3ad, lacpRate: fast, hashPolicy: layer3+4", "mode: active-backup, hashPolicy: layer3+4",
			"profiles.yaml:12:83: profiles[0].network.bonds[0].hashPolicy: hashPolicy applies to modes 802.3ad and balance-xor, not active-backup", false},
		{"VLAN id differs from the subnet's", ProfilesFile, "link: bond0, subnet: jumbo", "link: bond0, id: 11, subnet: jumbo",
			"profiles.yaml:14:45: profiles[0].network.vlans[0].id: id 11 differs from subnet jumbo's vlan 10", false},
		{"VLAN without id", NetworksFile, "    vlan: 10\n", "",
			"profiles.yaml:14:11: profiles[0].network.vlans[0]: vlan bond0.10 has no id, and its subnet names no vlan", false},
		{"two default routes", ProfilesFile, "subnet: jumbo, address: pool}", "subnet: mgmt, address: dhcp, defaultRoute: true, mtu: 9000}",
			"profiles.yaml:16:88: profiles[0].network.bridges[0].defaultRoute: interface bond0.10 holds the default route already (profiles.yaml:14:84); a layout has one", false},
		{"default route without a gateway", NetworksFile, "    gateway: 10.0.0.1\n", "",
			"profiles.yaml:16:88: profiles[0].network.bridges[0].defaultRoute: subnet mgmt has no gateway or gateway6 to route through", false},
		{"fixed without a subnet", ProfilesFile, "subnet: mgmt, address: fixed", "address: fixed",
			"profiles.yaml:16:53: profiles[0].network.bridges[0].address: address fixed needs a subnet: name one in subnet", false},
		{"pool on a subnet without pools", NetworksFile, "    pools: [{start: 10.1.0.10, end: 10.1.0.250}]\n", "",
			"profiles.yaml:14:65: profiles[0].network.vlans[0].address: address pool: subnet jumbo has no pools in networks.yaml", false},
		{"route via off the link", ProfilesFile, "defaultRoute: true}", "defaultRoute: true, routes: [{to: 10.50.0.0/16, via: 10.7.0.1}]}",
			"profiles.yaml:16:127: profiles[0].network.bridges[0].routes[0].via: via 10.7.0.1 is outside subnet mgmt: a next hop must be on the interface's link", false},
		{"pinned server without its fixed address", ServersFile, "    network:\n      addresses: {br0: [10.0.0.11]}\n", "",
			"servers.yaml:6:14: servers[0].profile: profile p's interface br0 is address: fixed; give this server its address in network.addresses.br0", false},
		{"address for an interface not in fixed mode", ServersFile, "{br0: [10.0.0.11]}", "{br0: [10.0.0.11], bond0: [10.0.0.13]}",
			`servers.yaml:8:44: servers[0].network.addresses.bond0: "bond0" is not an interface with address: fixed in the network layout of profile p`, false},
		{"NIC override of an unknown ethernet", ServersFile, "nics: {fast1:", "nics: {fast9:",
			`servers.yaml:16:21: servers[1].network.nics.fast9: "fast9" is not an ethernet of the network layout of profile p`, false},
		{"two addresses of one family", ServersFile, "br0: [10.0.0.11]", "br0: [10.0.0.11, 10.0.0.13]",
			"servers.yaml:8:36: servers[0].network.addresses.br0[1]: a second IPv4 address for br0; give one per family", false},
		{"address is the gateway", ServersFile, "br0: [10.0.0.11]", "br0: [10.0.0.1]",
			"servers.yaml:8:25: servers[0].network.addresses.br0[0]: 10.0.0.1 is subnet mgmt's gateway", false},
		{"address is the broadcast", ServersFile, "br0: [10.0.0.11]", "br0: [10.0.0.255]",
			"servers.yaml:8:25: servers[0].network.addresses.br0[0]: 10.0.0.255 is the network or broadcast address of 10.0.0.0/24", false},
		{"join.networks bridge also in the layout", ProfilesFile, "    network:\n", "    join:\n      networks: [{name: mgmt, bridge: br0, nic: eno1}]\n    network:\n",
			"profiles.yaml:8:39: profiles[0].join.networks[0].bridge: bridge br0 is also an interface of this profile's network layout; declare it once, in network.bridges (its subnet and address from networks.yaml), and drop this join.networks entry", false},
		{"join.networks bridge over a bond member", ProfilesFile, "    network:\n", "    join:\n      networks: [{name: mgmt, bridge: br-x, nic: fast0}]\n    network:\n",
			"profiles.yaml:8:50: profiles[0].join.networks[0].nic: fast0 is a bond member or bridge port in this profile's network layout; a join.networks bridge cannot also take it: declare the bridge in network.bridges", false},
		{"layout on an installer profile", ProfilesFile, "    count: 2\n", "    count: 2\n    deploy: autoinstall\n",
			"profiles.yaml:9:7: profiles[0].network: a network layout applies to deploy: image (rendered into the NoCloud seed); the autoinstall installer configures its own network", false},
		{"join.networks cidr that is a subnet", ProfilesFile, "    network:\n", "    join:\n      networks: [{name: mgmt, bridge: br-x, nic: eno1, cidr: 10.0.0.0/24}]\n    network:\n",
			"profiles.yaml:8:62: warning: profiles[0].join.networks[0].cidr: cidr 10.0.0.0/24 is subnet mgmt of networks.yaml (networks.yaml:2:11); join.networks cidr is for reporting only and gives the host no address: attach the subnet in network (address: fixed, pool or dhcp)", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := map[string]string{}
			for k, v := range netBase {
				files[k] = v
			}
			if !strings.Contains(files[tt.file], tt.old) {
				t.Fatalf("%s has no %q", tt.file, tt.old)
			}
			files[tt.file] = strings.Replace(files[tt.file], tt.old, tt.new, 1)
			res, err := loadNet(t, files)
			var got []FieldError
			var verr *ValidationError
			switch {
			case errors.As(err, &verr):
				got = append(verr.Errors, verr.Warnings...)
			case err != nil:
				t.Fatal(err)
			default:
				got = res.Warnings
			}
			var all []string
			for _, fe := range got {
				all = append(all, fe.Error())
				if fe.Error() == tt.want {
					if (fe.Severity == SeverityWarning) != tt.warning {
						t.Errorf("severity %s, want warning=%v", fe.Severity, tt.warning)
					}
					return
				}
			}
			t.Errorf("no problem\n  %s\namong\n  %s", tt.want, strings.Join(all, "\n  "))
		})
	}
}

// TestNetworkIgnoredWithoutLayout: a server's network part while it is
// pinned to a profile without a layout (kept for its next profile) is a
// warning that it is ignored, not an error.
func TestNetworkIgnoredWithoutLayout(t *testing.T) {
	files := map[string]string{}
	for k, v := range netBase {
		files[k] = v
	}
	files[ProfilesFile] += `  - name: q
    image: img
    sshKeys: ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO4VqFGm2ahY3KSc9k9lrQMD0j2/tR46oEgCPUxiE9s7 ops@lab1"]
`
	files[ServersFile] = strings.Replace(files[ServersFile], "    profile: p\n    network:\n      addresses: {br0: [10.0.0.11]}", "    profile: q\n    network:\n      addresses: {br0: [10.0.0.11]}", 1)
	res, err := loadNet(t, files)
	if err != nil {
		t.Fatal(err)
	}
	want := "servers.yaml:8:7: warning: servers[0].network: network is ignored: profile q has no network layout"
	for _, w := range res.Warnings {
		if w.Error() == want {
			return
		}
	}
	t.Errorf("warnings %v, want %s", res.Warnings, want)
}
