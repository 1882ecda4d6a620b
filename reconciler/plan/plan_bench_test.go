package plan

import (
	"fmt"
	"testing"
	"time"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// BenchmarkPlan10k: diff and plan 10,000 servers in 3 zones with 3 profiles
// whose counts need top-ups (target: under 100 ms).
func BenchmarkPlan10k(b *testing.B) {
	inv := &inventory.Inventory{Digest: "sha256:0123456789abcdef"}
	snap := state.Snapshot{Servers: map[string]*state.Server{}}
	zones := []string{"zone-a", "zone-b", "zone-c"}
	for i := 0; i < 10000; i++ {
		name := fmt.Sprintf("s%05d", i)
		ws := inventory.Server{Name: name, Zone: zones[i%3], Rack: fmt.Sprintf("r%d", i/40), BootMAC: fmt.Sprintf("52:54:00:%02x:%02x:%02x", i>>16&0xff, i>>8&0xff, i&0xff),
			BootMode: inventory.BootUEFI, Want: inventory.WantReady, BMC: inventory.BMC{Driver: inventory.DriverRedfish, Address: fmt.Sprintf("https://10.1.%d.%d", i>>8&0xff, i&0xff), Credentials: "c"}}
		inv.Servers = append(inv.Servers, ws)
		o := Record(&ws)
		o.Lifecycle, o.LifecycleAt = state.LifecycleReady, time.Now()
		o.Hardware = hwOf(16+i%8, 128, 500)
		if i%10 == 0 {
			o.Lifecycle = state.LifecycleDeployed
			o.Allocation = &state.Allocation{Profile: "p-" + zones[i%3], Reason: ReasonCount, At: time.Now()}
		}
		snap.Servers[name] = &o
	}
	for _, z := range zones {
		inv.Profiles = append(inv.Profiles, inventory.Profile{Name: "p-" + z, Zone: z, Image: "img", Count: 400, Min: inventory.Min{Cores: 8, MemoryGiB: 32, DiskGiB: 100}})
	}
	b.ReportAllocs()
	for b.Loop() {
		res := Compute(inv, snap, Options{Now: time.Now()})
		if len(res.Steps) == 0 {
			b.Fatal("no steps")
		}
	}
}

// benchLayoutFleet is BenchmarkPlan10k's fleet with a network layout on
// every profile: one uplink on its zone's /18 subnet (pool 8,000
// addresses, gateway and a reserved range) in address mode mode, every
// server with one NIC. With AddressPool the 1,000 deployed servers hold
// a pool address each and the 1,200 top-up allocations are simulated.
func benchLayoutFleet(mode inventory.AddressMode) (*inventory.Inventory, state.Snapshot) {
	inv := &inventory.Inventory{Digest: "sha256:0123456789abcdef"}
	snap := state.Snapshot{Servers: map[string]*state.Server{}}
	zones := []string{"zone-a", "zone-b", "zone-c"}
	for zi, z := range zones {
		inv.Subnets = append(inv.Subnets, inventory.Subnet{Name: "net-" + z, CIDR: fmt.Sprintf("10.%d.0.0/18", 64+zi), Gateway: fmt.Sprintf("10.%d.0.1", 64+zi),
			Reserved: []inventory.AddressRange{{Start: fmt.Sprintf("10.%d.0.1", 64+zi), End: fmt.Sprintf("10.%d.0.19", 64+zi)}},
			Pools:    []inventory.AddressRange{{Start: fmt.Sprintf("10.%d.0.20", 64+zi), End: fmt.Sprintf("10.%d.31.255", 64+zi)}}})
	}
	held := map[string]int{}
	for i := 0; i < 10000; i++ {
		name := fmt.Sprintf("s%05d", i)
		mac := fmt.Sprintf("52:54:00:%02x:%02x:%02x", i>>16&0xff, i>>8&0xff, i&0xff)
		ws := inventory.Server{Name: name, Zone: zones[i%3], Rack: fmt.Sprintf("r%d", i/40), BootMAC: mac,
			BootMode: inventory.BootUEFI, Want: inventory.WantReady, BMC: inventory.BMC{Driver: inventory.DriverRedfish, Address: fmt.Sprintf("https://10.1.%d.%d", i>>8&0xff, i&0xff), Credentials: "c"}}
		inv.Servers = append(inv.Servers, ws)
		o := Record(&ws)
		o.Lifecycle, o.LifecycleAt = state.LifecycleReady, time.Now()
		o.Hardware = hwOf(16+i%8, 128, 500)
		o.Hardware.NICs = []state.NIC{{Name: "eno1", MAC: mac, Driver: "igb", PCIAddress: "0000:02:00.0", SpeedMbps: 25000, Link: true}}
		if i%10 == 0 {
			p := "p-" + zones[i%3]
			o.Lifecycle = state.LifecycleDeployed
			o.Allocation = &state.Allocation{Profile: p, Reason: ReasonCount, At: time.Now()}
			if mode == inventory.AddressPool {
				sn := "net-" + zones[i%3]
				n := held[sn]
				held[sn]++
				o.Addresses = []state.AddressLease{{Subnet: sn, Interface: "uplink0", Profile: p,
					Address: fmt.Sprintf("10.%d.%d.%d", 64+i%3, (20+n)/256, (20+n)%256)}}
			}
		}
		snap.Servers[name] = &o
	}
	for _, z := range zones {
		inv.Profiles = append(inv.Profiles, inventory.Profile{Name: "p-" + z, Zone: z, Image: "img", Count: 400, Min: inventory.Min{Cores: 8, MemoryGiB: 32, DiskGiB: 100},
			Network: &inventory.NetworkLayout{Ethernets: []inventory.Ethernet{{Name: "uplink0", Match: inventory.NICMatch{Name: "e*"},
				Attachment: inventory.Attachment{Subnet: "net-" + z, Address: mode, DefaultRoute: mode == inventory.AddressPool}}}}})
	}
	return inv, snap
}

func benchLayout(b *testing.B, mode inventory.AddressMode) {
	inv, snap := benchLayoutFleet(mode)
	b.ReportAllocs()
	for b.Loop() {
		res := Compute(inv, snap, Options{Now: time.Now()})
		if len(res.Steps) == 0 {
			b.Fatal("no steps")
		}
		if mode == inventory.AddressPool && len(res.Steps[0].Addresses)+len(res.Steps[1].Addresses) == 0 {
			b.Fatal("no addresses simulated")
		}
	}
}

// BenchmarkPlan10kLayoutDHCP: BenchmarkPlan10k's fleet with a one-NIC
// layout in dhcp mode on every profile (the layout check, no IPAM).
func BenchmarkPlan10kLayoutDHCP(b *testing.B) { benchLayout(b, inventory.AddressDHCP) }

// BenchmarkPlan10kIPAM: the same layout in pool mode: 1,000 held
// addresses, 1,200 allocations whose addresses the plan simulates. Its
// difference to BenchmarkPlan10kLayoutDHCP is the IPAM simulation.
func BenchmarkPlan10kIPAM(b *testing.B) { benchLayout(b, inventory.AddressPool) }
