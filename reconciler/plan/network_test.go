package plan

import (
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// twoPorts25G is the example storage profile's layout asking for "the two
// 25G ports" bonded with LACP, on mgmt with a fixed address.
func twoPorts25G() *inventory.NetworkLayout {
	return &inventory.NetworkLayout{
		Ethernets: []inventory.Ethernet{{Name: "fast0", Match: inventory.NICMatch{SpeedMbps: 25000}}, {Name: "fast1", Match: inventory.NICMatch{SpeedMbps: 25000}}},
		Bonds: []inventory.Bond{{Name: "bond0", Members: []string{"fast0", "fast1"}, Mode: inventory.Bond8023AD,
			Attachment: inventory.Attachment{Subnet: "mgmt", Address: inventory.AddressFixed, DefaultRoute: true}}},
	}
}

// nics25G is a report with an onboard 1G port and n 25G ports.
func nics25G(n int) []state.NIC {
	out := []state.NIC{{Name: "eno1", MAC: "3c:ec:ef:00:00:01", Driver: "igb", PCIAddress: "0000:02:00.0", SpeedMbps: 1000, Link: true}}
	for i := 0; i < n; i++ {
		out = append(out, state.NIC{Name: "ens1f" + string(rune('0'+i)), MAC: "b4:96:91:00:00:1" + string(rune('0'+i)), Driver: "ice",
			PCIAddress: "0000:3b:00." + string(rune('0'+i)), SpeedMbps: 25000, Link: true})
	}
	return out
}

// TestPlanNetworkLayoutRefusals: a server that cannot carry its profile's
// network layout is never deployed with it. r2-n02 (pinned, allocated)
// found one 25G port where the layout wants two: NetworkLayoutUnsupported
// / NICsMissing naming fast1 and what matched, and no deploy step; r2-n04
// (pinned, allocated, two 25G ports) has no fixed address for bond0:
// AddressMissing; r2-n03 has both and is deployed. With the count raised,
// no ready server with one 25G port is allocated, and the profile's
// shortfall says why.
func TestPlanNetworkLayoutRefusals(t *testing.T) {
	inv := cloneInv(exampleInventory(t))
	st := inv.Profile("storage")
	st.Network = twoPorts25G()
	for _, n := range []string{"r2-n02", "r2-n03", "r2-n04"} {
		s := inv.Server(n)
		s.Want, s.Profile = inventory.WantDeployed, "storage"
		s.Network = &inventory.ServerNetwork{Addresses: map[string][]string{"bond0": {"10.20.0.3" + n[len(n)-1:]}}}
	}
	inv.Server("r2-n04").Network = nil
	snap := steadyFleet(inv)
	for n, ports := range map[string]int{"r2-n02": 1, "r2-n03": 2, "r2-n04": 2} {
		s := snap.Servers[n]
		s.Hardware.NICs = nics25G(ports)
		snap.Servers[n] = s
		setLC(snap, n, state.LifecycleAllocated, &state.Allocation{Profile: "storage", Reason: ReasonPinned, At: planT0})
	}
	res := Compute(inv, snap, Options{Now: planT0.Add(time.Minute)})
	deploys := map[string]bool{}
	for _, s := range res.Steps {
		if s.Action == ActDeploy {
			deploys[s.Server] = true
		}
	}
	if deploys["r2-n02"] || deploys["r2-n04"] || !deploys["r2-n03"] {
		t.Errorf("deploy steps %v; want r2-n03 only of r2-n02..04", deploys)
	}
	want := map[string]string{
		"r2-n02": "NICsMissing: profile storage: the network layout needs NICs commissioning did not find: ethernet fast1 (speedMbps=25000): commissioning found 1 matching (ens1f0 (taken by fast0)); not deployed with this profile",
		"r2-n04": "AddressMissing: profile storage: interface bond0 is address: fixed and servers.yaml gives this server no address for it (network.addresses); not deployed with this profile",
	}
	got := map[string]string{}
	for _, c := range res.Conditions {
		if c.Type == CondNetworkLayoutUnsupported {
			got[strings.TrimPrefix(c.Subject, "server/")] = c.Reason + ": " + c.Message
		}
	}
	for n, w := range want {
		if got[n] != w {
			t.Errorf("condition on %s = %q, want %q", n, got[n], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("NetworkLayoutUnsupported on %v, want only %v", got, want)
	}

	// Count-based: r2-n02 unpinned and ready with one 25G port is not a
	// candidate; the shortfall names it.
	inv2 := cloneInv(inv)
	inv2.Profile("storage").Count = 2
	s := inv2.Server("r2-n02")
	s.Want, s.Profile = inventory.WantReady, ""
	for _, n := range []string{"r2-n03", "r2-n04"} {
		inv2.Server(n).Want = inventory.WantRetired
	}
	snap2 := steadyFleet(inv2)
	h := snap2.Servers["r2-n02"]
	h.Hardware.NICs = nics25G(1)
	snap2.Servers["r2-n02"] = h
	res = Compute(inv2, snap2, Options{Now: planT0.Add(time.Minute)})
	for _, st := range res.Steps {
		if st.Server == "r2-n02" && st.Action == ActAllocate {
			t.Errorf("r2-n02, one 25G port, allocated to storage: %+v", st)
		}
	}
	found := false
	for _, c := range res.Conditions {
		if c.Subject == "profile/storage" && c.Type == "InsufficientCapacity" {
			found = strings.Contains(c.Message, "1 ready servers cannot carry the network layout (first, r2-n02: the network layout needs NICs commissioning did not find: ethernet fast1")
			if !found {
				t.Errorf("shortfall message %q does not name the network layout", c.Message)
			}
		}
	}
	if !found {
		t.Errorf("no InsufficientCapacity on profile/storage: %+v", res.Conditions)
	}
}
