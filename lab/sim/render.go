package sim

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/machina-metal/machina/inventory"
	inventoryexample "github.com/machina-metal/machina/inventory-example"
)

// exampleFS is the embedded example site.
var exampleFS = inventoryexample.FS

// q quotes a YAML scalar (JSON string syntax is valid YAML).
func q(s string) string { return fmt.Sprintf("%q", s) }

// renderServers writes servers.yaml with each BMC pointing at its
// simulated BMC: driver redfish and an http URL for a bmcsim BMC, driver
// ipmi and host:port for an ipmi_sim. The header says how many of each run
// and, for servers whose inventory entry says ipmi but run Redfish here
// (fallbacks: name → why), names them and why; so does a comment on each. bmcExtra adds lines
// to a Redfish server's bmc block (systemID, caBundle).
func renderServers(inv *inventory.Inventory, addrs map[string]string, fallbacks map[string]string, bmcExtra map[string][]string) string {
	var b strings.Builder
	b.WriteString("# yaml-language-server: $schema=https://machina-metal.github.io/schema/v1/servers.schema.json\n")
	nIPMI := 0
	for _, s := range inv.Servers {
		if !strings.HasPrefix(addrs[s.Name], "http") {
			nIPMI++
		}
	}
	fmt.Fprintf(&b, "# Simulated site, all on 127.0.0.1: %d Redfish BMCs (bmcsim emulators over real vendor trees)\n# and %d IPMI BMCs (OpenIPMI's ipmi_sim).\n", len(inv.Servers)-nIPMI, nIPMI)
	if len(fallbacks) > 0 {
		var names []string
		why := ""
		for _, s := range inv.Servers {
			if r, ok := fallbacks[s.Name]; ok {
				names = append(names, s.Name)
				why = r
			}
		}
		fmt.Fprintf(&b, "# %s: the example gives them IPMI BMCs; here they run Redfish (bmcsim): %s.\n", strings.Join(names, ", "), why)
	}
	b.WriteString("servers:\n")
	for _, s := range inv.Servers {
		fmt.Fprintf(&b, "  - name: %s\n    zone: %s\n", s.Name, s.Zone)
		if s.Site != "" {
			fmt.Fprintf(&b, "    site: %s\n", s.Site)
		}
		if s.Rack != "" {
			fmt.Fprintf(&b, "    rack: %s\n", q(s.Rack))
		}
		if len(s.Tags) > 0 {
			fmt.Fprintf(&b, "    tags: [%s]\n", strings.Join(s.Tags, ", "))
		}
		if len(s.Labels) > 0 {
			fmt.Fprintf(&b, "    labels: %s\n", flowMap(s.Labels))
		}
		fmt.Fprintf(&b, "    bootMAC: %s\n    bootMode: %s\n", q(s.BootMAC), orDefault(string(s.BootMode), "uefi"))
		if s.Arch != "" {
			fmt.Fprintf(&b, "    arch: %s\n", s.Arch)
		}
		addr := addrs[s.Name]
		if strings.HasPrefix(addr, "http") {
			if why, ok := fallbacks[s.Name]; ok {
				fmt.Fprintf(&b, "    # IPMI in the example; Redfish here: %s\n", why)
			}
			fmt.Fprintf(&b, "    bmc:\n      driver: redfish\n      address: %s\n      credentials: %s\n", addr, s.BMC.Credentials)
			for _, l := range bmcExtra[s.Name] {
				fmt.Fprintf(&b, "      %s\n", l)
			}
		} else {
			fmt.Fprintf(&b, "    bmc:\n      driver: ipmi\n      address: %s\n      credentials: %s\n", q(addr), s.BMC.Credentials)
		}
		if s.Want != "" && s.Want != inventory.WantReady {
			fmt.Fprintf(&b, "    want: %s\n", s.Want)
		}
		if s.Profile != "" {
			fmt.Fprintf(&b, "    profile: %s\n", s.Profile)
		}
		if a := s.Actions; a != (inventory.Actions{}) {
			fmt.Fprintf(&b, "    actions: {commission: %d, powerCycle: %d, powerOn: %d, powerOff: %d}\n", a.Commission, a.PowerCycle, a.PowerOn, a.PowerOff)
		}
		if f := s.Fence; f != nil {
			fmt.Fprintf(&b, "    fence: {driver: %s, address: %s, credentials: %s}\n", f.Driver, q(f.Address), f.Credentials)
		}
		if s.Network != nil {
			// JSON is YAML's flow syntax; the field names are the schema's.
			if js, err := json.Marshal(s.Network); err == nil {
				fmt.Fprintf(&b, "    network: %s\n", js)
			}
		}
	}
	return b.String()
}

// flowMap renders a label map as a YAML flow mapping, keys sorted.
func flowMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, q(k)+": "+q(m[k]))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// renderProfiles writes profiles.yaml unchanged in meaning.
func renderProfiles(inv *inventory.Inventory) string {
	var b strings.Builder
	b.WriteString("# yaml-language-server: $schema=https://machina-metal.github.io/schema/v1/profiles.schema.json\nprofiles:\n")
	for _, p := range inv.Profiles {
		// The simulated lab writes images; installers are not simulated, so
		// every profile deploys an image here.
		fmt.Fprintf(&b, "  - name: %s\n    image: %s\n    deploy: image\n", p.Name, p.Image)
		if len(p.SSHKeys) > 0 {
			b.WriteString("    sshKeys:\n")
			for _, k := range p.SSHKeys {
				fmt.Fprintf(&b, "      - %s\n", q(k))
			}
		}
		if p.Zone != "" {
			fmt.Fprintf(&b, "    zone: %s\n", p.Zone)
		}
		fmt.Fprintf(&b, "    min: {cores: %d, memoryGiB: %d, diskGiB: %d}\n    count: %d\n", max(p.Min.Cores, 1), max(p.Min.MemoryGiB, 1), max(p.Min.DiskGiB, 1), p.Count)
		if p.Fence != "" {
			fmt.Fprintf(&b, "    fence: %s\n", p.Fence)
		}
		if p.Firmware != nil {
			// JSON is YAML's flow syntax; the field names are the schema's.
			js, err := json.Marshal(p.Firmware)
			if err == nil {
				fmt.Fprintf(&b, "    firmware: %s\n", js)
			}
		}
		if p.Network != nil {
			if js, err := json.Marshal(p.Network); err == nil {
				fmt.Fprintf(&b, "    network: %s\n", js)
			}
		}
		if p.CloudInit != nil {
			if js, err := json.Marshal(p.CloudInit); err == nil {
				fmt.Fprintf(&b, "    cloudInit: %s\n", js)
			}
		}
		if sel := p.Selector; sel != nil {
			b.WriteString("    selector:\n")
			if len(sel.MatchLabels) > 0 {
				fmt.Fprintf(&b, "      matchLabels: %s\n", flowMap(sel.MatchLabels))
			}
			if len(sel.MatchExpressions) > 0 {
				b.WriteString("      matchExpressions:\n")
				for _, r := range sel.MatchExpressions {
					vals := make([]string, 0, len(r.Values))
					for _, v := range r.Values {
						vals = append(vals, q(v))
					}
					fmt.Fprintf(&b, "        - {key: %s, operator: %s, values: [%s]}\n", q(r.Key), r.Operator, strings.Join(vals, ", "))
				}
			}
		}
		if j := p.Join; j.Site != "" || len(j.Tags) > 0 || len(j.Networks) > 0 || len(j.StoragePools) > 0 {
			b.WriteString("    join:\n")
			if j.Site != "" {
				fmt.Fprintf(&b, "      site: %s\n", j.Site)
			}
			if len(j.Tags) > 0 {
				fmt.Fprintf(&b, "      tags: [%s]\n", strings.Join(j.Tags, ", "))
			}
			if len(j.Networks) > 0 {
				b.WriteString("      networks:\n")
				for _, n := range j.Networks {
					fmt.Fprintf(&b, "        - {name: %s, bridge: %s, nic: %s", n.Name, n.Bridge, n.NIC)
					if n.VLAN > 0 {
						fmt.Fprintf(&b, ", vlan: %d", n.VLAN)
					}
					if n.CIDR != "" {
						fmt.Fprintf(&b, ", cidr: %s", n.CIDR)
					}
					b.WriteString("}\n")
				}
			}
			if len(j.StoragePools) > 0 {
				b.WriteString("      storagePools:\n")
				for _, sp := range j.StoragePools {
					fmt.Fprintf(&b, "        - {name: %s, type: %s", sp.Name, sp.Type)
					if sp.Path != "" {
						fmt.Fprintf(&b, ", path: %s", sp.Path)
					}
					if len(sp.Disks) > 0 {
						fmt.Fprintf(&b, ", disks: [%s]", strings.Join(sp.Disks, ", "))
					}
					b.WriteString("}\n")
				}
			}
		}
	}
	return b.String()
}

// renderNetworks writes networks.yaml unchanged in meaning ("" for a site
// without subnets: the file is then left out).
func renderNetworks(inv *inventory.Inventory) string {
	if len(inv.Subnets) == 0 {
		return ""
	}
	js, err := json.Marshal(inv.Subnets)
	if err != nil {
		return ""
	}
	return "# yaml-language-server: $schema=https://machina-metal.github.io/schema/v1/networks.schema.json\nsubnets: " + string(js) + "\n"
}

// renderImages points every image at the lab's mirror, verified through
// its SHA256SUMS file.
func renderImages(inv *inventory.Inventory, mirror string) string {
	var b strings.Builder
	b.WriteString("# yaml-language-server: $schema=https://machina-metal.github.io/schema/v1/images.schema.json\n")
	b.WriteString("# Simulated images from the lab's local mirror, verified through its SHA256SUMS.\nimages:\n")
	for _, im := range inv.Images {
		fmt.Fprintf(&b, "  - name: %s\n    url: %s/%s.raw\n    checksumURL: %s/SHA256SUMS\n", im.Name, mirror, im.Name, mirror)
		if im.Arch != "" && im.Arch != inventory.ArchAMD64 {
			fmt.Fprintf(&b, "    arch: %s\n", im.Arch)
		}
	}
	if len(inv.FirmwareImages) > 0 {
		b.WriteString("# BMC update files from the lab's mirror; the controller serves them to the BMCs.\nfirmware:\n")
		for _, fi := range inv.FirmwareImages {
			fmt.Fprintf(&b, "  - name: %s\n    url: %s\n    checksum: %s\n    sizeBytes: %d\n", fi.Name, strings.ReplaceAll(fi.URL, "{{mirror}}", mirror), fi.Checksum, fi.SizeBytes)
		}
	}
	return b.String()
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
