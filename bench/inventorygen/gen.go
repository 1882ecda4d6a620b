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
	}
	if err := os.WriteFile(filepath.Join(dir, "profiles.yaml"), []byte(b.String()), 0o644); err != nil {
		return err
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
