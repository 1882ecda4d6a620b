package plan

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// TestAddressPoolsExclude: a pool covering a whole /29 hands out only
// what is left after the network and broadcast addresses, the gateway, a
// reserved range and a servers.yaml fixed address; fixed addresses
// outside the subnet do not count.
func TestAddressPoolsExclude(t *testing.T) {
	sn := &inventory.Subnet{Name: "s", CIDR: "10.5.0.0/29", Gateway: "10.5.0.1",
		Pools:    []inventory.AddressRange{{Start: "10.5.0.0", End: "10.5.0.7"}},
		Reserved: []inventory.AddressRange{{Start: "10.5.0.2", End: "10.5.0.2"}}}
	fixed := []netip.Addr{netip.MustParseAddr("10.5.0.3"), netip.MustParseAddr("10.6.0.4")}
	pools := AddressPools(sn, fixed)
	if len(pools) != 1 {
		t.Fatalf("AddressPools = %d pools, want 1 (IPv4 only)", len(pools))
	}
	pk := state.NewPicker(pools[0], state.SortedAddrs{})
	var got []string
	for {
		a, ok := pk.Next()
		if !ok {
			break
		}
		got = append(got, a.String())
	}
	if fmt.Sprint(got) != "[10.5.0.4 10.5.0.5 10.5.0.6]" || pools[0].Size() != 3 {
		t.Fatalf("picks = %v (size %d), want [10.5.0.4 10.5.0.5 10.5.0.6] (size 3)", got, pools[0].Size())
	}
}

// TestClaimsPreferPlanned: the controller's claims for a profile with a
// dual-stack pool interface are one per family, each preferring the
// address the plan's step simulated.
func TestClaimsPreferPlanned(t *testing.T) {
	inv := &inventory.Inventory{
		Subnets: []inventory.Subnet{{Name: "d", CIDR: "10.7.0.0/24", CIDR6: "fd07::/64",
			Pools: []inventory.AddressRange{{Start: "10.7.0.10", End: "10.7.0.20"}, {Start: "fd07::10", End: "fd07::20"}}}},
		Profiles: []inventory.Profile{{Name: "p", Network: &inventory.NetworkLayout{Ethernets: []inventory.Ethernet{
			{Name: "e0", Attachment: inventory.Attachment{Subnet: "d", Address: inventory.AddressPool}}}}}},
	}
	step := Step{Action: ActAllocate, Profile: "p", Addresses: []StepAddress{{Interface: "e0", Subnet: "d", Address: "10.7.0.12"}, {Interface: "e0", Subnet: "d", Address: "fd07::11"}}}
	cs := Claims(inv, inv.Profile("p"), step)
	if len(cs) != 2 || cs[0].Prefer.String() != "10.7.0.12" || cs[1].Prefer.String() != "fd07::11" || cs[1].Pool.Family != 6 {
		t.Fatalf("Claims = %+v, want v4 preferring 10.7.0.12 and v6 preferring fd07::11", cs)
	}
}
