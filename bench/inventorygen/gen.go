// Package inventorygen writes large synthetic inventories for benchmarks:
// servers spread over zones and racks with unique MACs and BMC addresses,
// profiles over those zones, and a mix of catalog and URL images.
package inventorygen

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Size says how much to generate.
type Size struct {
	Servers, Profiles, Images int
	// Networks adds networks.yaml (one mgmt subnet per zone, a shared
	// tenant subnet with a pool), a network layout on every profile (two
	// 25G ports bonded, a pool VLAN, a bridge with a fixed address) and
	// each server's fixed address.
	Networks bool
}

// zoneAddr is the k-th fixed address of zone z's data subnet
// (172.16.0.0/12, one /24 per zone, hosts from .10 up to the pool at .200).
func zoneAddr(z, k int) string {
	return fmt.Sprintf("172.%d.%d.%d", 16+z/256, z%256, 10+k)
}

const key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO4VqFGm2ahY3KSc9k9lrQMD0j2/tR46oEgCPUxiE9s7 ops@lab1"

// Write generates servers.yaml, profiles.yaml and images.yaml in dir. The
// result is a valid inventory.
func Write(dir string, sz Size) error {
	zones := max(sz.Profiles, 1)
	var b strings.Builder
	b.WriteString("servers:\n")
	for i := 0; i < sz.Servers; i++ {
		zone := i % zones
		fmt.Fprintf(&b, "  - name: s%05d\n    zone: zone-%d\n    site: site1\n    rack: r%d\n    tags: [kvm, gen]\n", i, zone, i/40)
		fmt.Fprintf(&b, "    bootMAC: \"52:54:%02x:%02x:%02x:%02x\"\n", (i>>24)&0xff, (i>>16)&0xff, (i>>8)&0xff, i&0xff)
		if sz.Networks {
			fmt.Fprintf(&b, "    network:\n      addresses: {br-data: [%s]}\n", zoneAddr(zone, i/zones))
		}
		if i%3 == 0 {
			fmt.Fprintf(&b, "    bootMode: bios\n    bmc: {driver: ipmi, address: \"10.%d.%d.%d:623\", credentials: bmc-ipmi}\n", 100+(i>>16)&0xff, (i>>8)&0xff, i&0xff)
		} else {
			fmt.Fprintf(&b, "    bootMode: uefi\n    bmc: {driver: redfish, address: \"https://10.%d.%d.%d\", credentials: bmc-redfish}\n", (i>>16)&0xff, (i>>8)&0xff, i&0xff)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "servers.yaml"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	b.Reset()
	b.WriteString("profiles:\n")
	for i := 0; i < sz.Profiles; i++ {
		fmt.Fprintf(&b, "  - name: p%03d\n    image: img-%02d\n    sshKeys: [%q]\n    zone: zone-%d\n    min: {cores: 8, memoryGiB: 32, diskGiB: 100}\n    count: 1\n", i, i%max(sz.Images, 1), key, i%zones)
		fmt.Fprintf(&b, "    join:\n      site: site1\n      tags: [kvm]\n      networks:\n        - {name: mgmt, bridge: br-mgmt, nic: eno1, vlan: 10, cidr: 10.20.0.0/24}\n")
		if sz.Networks {
			fmt.Fprintf(&b, "    network:\n      ethernets:\n        - {name: fast0, match: {speedMbps: 25000}}\n        - {name: fast1, match: {speedMbps: 25000}}\n")
			fmt.Fprintf(&b, "      bonds:\n        - {name: bond0, members: [fast0, fast1], mode: 802.3ad, lacpRate: fast, hashPolicy: layer3+4, mtu: 9000}\n")
			fmt.Fprintf(&b, "      vlans:\n        - {name: vlan120, link: bond0, subnet: tenant, address: pool}\n")
			fmt.Fprintf(&b, "      bridges:\n        - {name: br-data, interfaces: [bond0], subnet: data-%d, address: fixed, defaultRoute: true}\n", i%zones)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "profiles.yaml"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	if sz.Networks {
		b.Reset()
		b.WriteString("subnets:\n  - {name: tenant, cidr: 10.128.0.0/16, vlan: 120, mtu: 9000, pools: [{start: 10.128.0.10, end: 10.128.255.250}]}\n")
		for z := 0; z < zones; z++ {
			fmt.Fprintf(&b, "  - name: data-%d\n    cidr: 172.%d.%d.0/24\n    gateway: 172.%d.%d.1\n    dns: {servers: [172.16.0.2], search: [site1.example.net]}\n    pools: [{start: 172.%d.%d.200, end: 172.%d.%d.250}]\n",
				z, 16+z/256, z%256, 16+z/256, z%256, 16+z/256, z%256, 16+z/256, z%256)
		}
		if err := os.WriteFile(filepath.Join(dir, "networks.yaml"), []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	b.Reset()
	b.WriteString("images:\n")
	for i := 0; i < sz.Images; i++ {
		if i%2 == 0 {
			fmt.Fprintf(&b, "  - {name: img-%02d, catalog: debian-12}\n", i)
		} else {
			fmt.Fprintf(&b, "  - {name: img-%02d, url: \"http://mirror.lan/img-%02d.raw\", checksum: \"sha256:%064x\"}\n", i, i, i)
		}
	}
	return os.WriteFile(filepath.Join(dir, "images.yaml"), []byte(b.String()), 0o644)
}
