package netplan

import (
	"errors"
	"flag"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/inventory"
)

var update = flag.Bool("update", false, "rewrite golden files")

// subnets is the networks.yaml of the golden cases.
var subnets = []inventory.Subnet{
	{Name: "mgmt", CIDR: "10.20.0.0/24", Gateway: "10.20.0.1", DNS: &inventory.DNS{Servers: []string{"10.20.0.2", "10.20.0.3"}, Search: []string{"lab1.example.net"}}},
	{Name: "tenant", CIDR: "10.120.0.0/22", VLAN: 120, MTU: 9000, Pools: []inventory.AddressRange{{Start: "10.120.0.10", End: "10.120.3.250"}}},
	{Name: "storage", CIDR: "10.30.0.0/24", CIDR6: "fd00:30::/64", Gateway6: "fd00:30::1", VLAN: 130, MTU: 9000},
	{Name: "pxe", CIDR: "10.10.0.0/24"},
}

func lookup(name string) *inventory.Subnet {
	for i := range subnets {
		if subnets[i].Name == name {
			return &subnets[i]
		}
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

// nics is a commissioning report of a server with two onboard 1G ports
// and a dual-port 25G card (ice), out of name order on the PCI bus.
var nics = []inventory.NIC{
	{Name: "eno1", MAC: "3c:ec:ef:00:00:01", Driver: "igb", PCIAddress: "0000:02:00.0", SpeedMbps: 1000},
	{Name: "eno2", MAC: "3c:ec:ef:00:00:02", Driver: "igb", PCIAddress: "0000:02:00.1"},
	{Name: "ens1f1", MAC: "b4:96:91:00:00:11", Driver: "ice", PCIAddress: "0000:3b:00.1", SpeedMbps: 25000},
	{Name: "ens1f0", MAC: "b4:96:91:00:00:10", Driver: "ice", PCIAddress: "0000:3b:00.0", SpeedMbps: 25000},
}

// goldenCases are the layouts of the golden files.
var goldenCases = []struct {
	name   string
	layout inventory.NetworkLayout
	addrs  map[string][]netip.Addr
}{
	{name: "dhcp-single", layout: inventory.NetworkLayout{
		Ethernets: []inventory.Ethernet{{Name: "uplink0", Match: inventory.NICMatch{Name: "e*", Index: ptr(0)}, Attachment: inventory.Attachment{Subnet: "pxe", Address: inventory.AddressDHCP}}},
	}},
	{name: "fixed-bridge", layout: inventory.NetworkLayout{
		Ethernets: []inventory.Ethernet{{Name: "eno1", Match: inventory.NICMatch{Name: "eno1"}}},
		Bridges: []inventory.Bridge{{Name: "br-mgmt", Interfaces: []string{"eno1"}, Attachment: inventory.Attachment{Subnet: "mgmt", Address: inventory.AddressFixed, DefaultRoute: true,
			Routes: []inventory.Route{{To: "10.0.0.0/8", Via: "10.20.0.254", Metric: ptr(int64(100))}}}}},
	}, addrs: map[string][]netip.Addr{"br-mgmt": {netip.MustParseAddr("10.20.0.21")}}},
	{name: "lacp-bond-vlans", layout: inventory.NetworkLayout{
		Ethernets: []inventory.Ethernet{
			{Name: "mgmt0", Match: inventory.NICMatch{Driver: "igb", Index: ptr(0)}, Attachment: inventory.Attachment{Subnet: "mgmt", Address: inventory.AddressFixed, DefaultRoute: true}},
			{Name: "fast0", Match: inventory.NICMatch{SpeedMbps: 25000}},
			{Name: "fast1", Match: inventory.NICMatch{SpeedMbps: 25000}},
		},
		Bonds: []inventory.Bond{{Name: "bond0", Members: []string{"fast0", "fast1"}, Mode: inventory.Bond8023AD, LACPRate: "fast", HashPolicy: "layer3+4", Attachment: inventory.Attachment{MTU: 9000}}},
		VLANs: []inventory.VLANInterface{
			{Name: "bond0.120", Link: "bond0", Attachment: inventory.Attachment{Subnet: "tenant", Address: inventory.AddressPool}},
			{Name: "storage0", Link: "bond0", ID: 130, Attachment: inventory.Attachment{Subnet: "storage", Address: inventory.AddressFixed}},
		},
	}, addrs: map[string][]netip.Addr{"mgmt0": {netip.MustParseAddr("10.20.0.22")}, "bond0.120": {netip.MustParseAddr("10.120.1.7")},
		"storage0": {netip.MustParseAddr("10.30.0.22"), netip.MustParseAddr("fd00:30::22")}}},
	{name: "active-backup-bridge-vlan", layout: inventory.NetworkLayout{
		Ethernets: []inventory.Ethernet{
			{Name: "nic0", Match: inventory.NICMatch{Driver: "ice", Index: ptr(0)}},
			{Name: "nic1", Match: inventory.NICMatch{Driver: "ice", Index: ptr(1)}},
		},
		Bonds:   []inventory.Bond{{Name: "bond0", Members: []string{"nic0", "nic1"}, Mode: inventory.BondActiveBackup, MIIMon: ptr(250), Attachment: inventory.Attachment{MTU: 9000}}},
		VLANs:   []inventory.VLANInterface{{Name: "vlan120", Link: "bond0", ID: 120}},
		Bridges: []inventory.Bridge{{Name: "br-tenant", Interfaces: []string{"vlan120"}, STP: ptr(true), Attachment: inventory.Attachment{Subnet: "tenant", Address: inventory.AddressDHCP}}},
	}},
}

// TestRenderGolden renders each layout for the server of nics and compares
// it with testdata/NAME.golden (refresh with -update), then checks the
// document parses as YAML into the v2 shape: NICs matched by MAC in PCI
// order, pool and fixed addresses with the subnet's prefix length.
func TestRenderGolden(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			matched, err := inventory.MatchNICs(&tc.layout, nil, nics)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Render(Host{Layout: &tc.layout, Subnets: lookup, NICs: matched, Addresses: tc.addrs})
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", tc.name+".golden")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("read golden (run with -update): %v", err)
			}
			if d := cmp.Diff(string(want), string(got)); d != "" {
				t.Errorf("Render(%s) differs from %s (-want +got):\n%s", tc.name, golden, d)
			}
			var doc map[string]any
			if err := yaml.Unmarshal(got, &doc); err != nil {
				t.Fatalf("rendered document is not YAML: %v\n%s", err, got)
			}
			if doc["version"] != float64(2) {
				t.Errorf("version = %v, want 2", doc["version"])
			}
		})
	}
}

// TestRenderCloudInitReads is the second opinion: Debian 12's cloud-init
// (22.4) ships no network-config v2 JSON schema (only
// schema-cloud-config-v1.json), so each golden document is fed to
// cloud-init's own v2 parser (`cloud-init devel net-convert`, rendered to
// ifupdown) and the result must carry what the layout says: every NIC
// renamed by its MAC, bond mode and members, VLAN IDs and links, the
// addresses with their prefix lengths and the default route.
func TestRenderCloudInitReads(t *testing.T) {
	ci := peertest.Command(t, "cloud-init")
	want := map[string][]string{
		"dhcp-single":               {`ATTR{address}=="3c:ec:ef:00:00:01", NAME="uplink0"`, "iface uplink0 inet dhcp"},
		"fixed-bridge":              {"iface br-mgmt inet static", "address 10.20.0.21/24", "bridge_ports eno1", "route add default gw 10.20.0.1", "route add -net 10.0.0.0/8 gw 10.20.0.254"},
		"lacp-bond-vlans":           {`ATTR{address}=="b4:96:91:00:00:10", NAME="fast0"`, `ATTR{address}=="b4:96:91:00:00:11", NAME="fast1"`, "bond-master bond0", "bond-mode 802.3ad", "bond-lacp-rate fast", "bond-xmit-hash-policy layer3+4", "vlan-raw-device bond0", "vlan_id 120", "address 10.120.1.7/22", "address fd00:30::22/64", "mtu 9000", "route add default gw 10.20.0.1"},
		"active-backup-bridge-vlan": {`ATTR{address}=="b4:96:91:00:00:10", NAME="nic0"`, "bond-mode active-backup", "bond-miimon 250", "vlan_id 120", "bridge_ports vlan120", "bridge_stp on", "iface br-tenant inet dhcp"},
	}
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			cmd := exec.Command(ci, "devel", "net-convert", "-p", filepath.Join("testdata", tc.name+".golden"), "-k", "yaml", "-D", "debian", "-O", "eni", "-d", out)
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("cloud-init net-convert: %v\n%s", err, b)
			}
			var all []byte
			for _, f := range []string{"etc/network/interfaces.d/50-cloud-init", "etc/udev/rules.d/70-persistent-net.rules"} {
				b, err := os.ReadFile(filepath.Join(out, f))
				if err != nil {
					t.Fatal(err)
				}
				all = append(all, b...)
			}
			for _, w := range want[tc.name] {
				if !strings.Contains(string(all), w) {
					t.Errorf("cloud-init's reading of %s lacks %q:\n%s", tc.name, w, all)
				}
			}
			if len(want[tc.name]) == 0 {
				t.Fatalf("no expectations for %s", tc.name)
			}
		})
	}
}

// TestRenderPoolWithoutAddress: an interface in pool mode that IPAM gave
// no address is an error naming the interface and the missing family,
// never a silent DHCP; the same for a fixed interface without its
// servers.yaml address, and a dual-stack subnet missing one family.
func TestRenderPoolWithoutAddress(t *testing.T) {
	tests := []struct {
		name, iface, subnet string
		mode                inventory.AddressMode
		addrs               []netip.Addr
		want                string
	}{
		{"pool", "uplink0", "tenant", inventory.AddressPool, nil, "render uplink0: address pool on subnet tenant: no address assigned: IPv4 (10.120.0.0/22)"},
		{"fixed", "uplink0", "mgmt", inventory.AddressFixed, nil, "render uplink0: address fixed on subnet mgmt: no address assigned: IPv4 (10.20.0.0/24)"},
		{"dual-stack", "uplink0", "storage", inventory.AddressFixed, []netip.Addr{netip.MustParseAddr("10.30.0.9")}, "no address assigned: IPv6 (fd00:30::/64)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := inventory.NetworkLayout{Ethernets: []inventory.Ethernet{{Name: tt.iface, Match: inventory.NICMatch{Name: "eno1"}, Attachment: inventory.Attachment{Subnet: tt.subnet, Address: tt.mode}}}}
			matched, err := inventory.MatchNICs(&l, nil, nics)
			if err != nil {
				t.Fatal(err)
			}
			out, err := Render(Host{Layout: &l, Subnets: lookup, NICs: matched, Addresses: map[string][]netip.Addr{tt.iface: tt.addrs}})
			if !errors.Is(err, ErrNoAddress) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Render = %q, %v; want ErrNoAddress containing %q", out, err, tt.want)
			}
		})
	}
}

// TestForServer: the profile's layout for one server of the inventory,
// its fixed address from servers.yaml and a NIC override by MAC; a server
// whose report lacks the NICs gets a *inventory.MissingNICsError naming
// them; a profile without a layout renders nothing.
func TestForServer(t *testing.T) {
	inv := &inventory.Inventory{Subnets: subnets}
	p := &inventory.Profile{Name: "hv", Network: &inventory.NetworkLayout{
		Ethernets: []inventory.Ethernet{{Name: "fast0", Match: inventory.NICMatch{SpeedMbps: 25000}}, {Name: "fast1", Match: inventory.NICMatch{SpeedMbps: 25000}}},
		Bonds:     []inventory.Bond{{Name: "bond0", Members: []string{"fast0", "fast1"}, Mode: inventory.Bond8023AD, Attachment: inventory.Attachment{Subnet: "mgmt", Address: inventory.AddressFixed}}},
	}}
	ws := &inventory.Server{Name: "r1-n01", Network: &inventory.ServerNetwork{Addresses: map[string][]string{"bond0": {"10.20.0.31"}},
		NICs: map[string]inventory.NICMatch{"fast1": {MAC: "3c:ec:ef:00:00:02"}}}}
	out, err := ForServer(inv, p, ws, nics, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{`macaddress: "b4:96:91:00:00:10"`, `macaddress: "3c:ec:ef:00:00:02"`, `- "10.20.0.31/24"`} {
		if !strings.Contains(string(out), w) {
			t.Errorf("ForServer output lacks %q:\n%s", w, out)
		}
	}
	one25G := []inventory.NIC{nics[0], nics[1], nics[3]}
	_, err = ForServer(inv, p, &inventory.Server{Name: "r1-n02", Network: ws.Network}, one25G, nil)
	if err != nil {
		t.Fatalf("want no error with the override, got %v", err)
	}
	_, err = ForServer(inv, p, &inventory.Server{Name: "r1-n03"}, one25G, nil)
	var miss *inventory.MissingNICsError
	if !errors.As(err, &miss) || len(miss.Missing) != 1 || !strings.Contains(miss.Missing[0], "ethernet fast1 (speedMbps=25000): commissioning found 1 matching (ens1f0 (taken by fast0))") {
		t.Fatalf("ForServer with one 25G NIC = %v; want a MissingNICsError naming fast1", err)
	}
	if out, err := ForServer(inv, &inventory.Profile{Name: "plain"}, ws, nics, nil); out != nil || err != nil {
		t.Fatalf("ForServer without a layout = %q, %v; want nil, nil", out, err)
	}
}
