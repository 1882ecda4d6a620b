package sim_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// poolUplink is a network layout with the boot NIC in pool mode on the
// example's mgmt subnet (pools 10.20.0.100-199, release policy free).
const poolUplink = `    network:
      ethernets:
        - name: uplink0
          match: {name: "e*", index: 0}
          subnet: mgmt
          address: pool
          defaultRoute: true
`

// TestIPAMPoolAddressesInTheLab: a commit gives the hypervisor profile a
// pool-mode uplink on mgmt and raises its count from 2 to 4. The two new
// servers are allocated with one mgmt pool address each, distinct, taken
// in the allocation's transaction (the store's ipam records agree), their
// NoCloud seeds' network-config carries that address with mgmt's prefix
// length, gateway and resolvers, and their status files list it. Lowering
// the count back releases them and the addresses go back to the pool
// (mgmt's release policy is the default, free).
func TestIPAMPoolAddressesInTheLab(t *testing.T) {
	r := startRig(t, rigOptions{})
	first := r.steady()
	orig := holding(first, "hypervisor", plan.ReasonCount)
	r.commit("hypervisor: pool-mode uplink on mgmt, count 4", func(dir string) {
		r.editBlock(dir, inventory.ProfilesFile, "hypervisor", func(b string) string { return strings.TrimRight(b, "\n") + "\n" + poolUplink })
		r.setCount(dir, "hypervisor", 4)
	})
	snap := r.waitFor("4 hypervisors deployed", 2*time.Minute, func(s state.Snapshot) bool { return deployedBy(s, "hypervisor") == 4 })
	var added []string
	seen := map[string]string{}
	pool := [2]netip.Addr{netip.MustParseAddr("10.20.0.100"), netip.MustParseAddr("10.20.0.199")}
	for _, name := range holding(snap, "hypervisor", plan.ReasonCount) {
		if slices.Contains(orig, name) {
			continue
		}
		added = append(added, name)
		srv := record(snap, name)
		if len(srv.Addresses) != 1 || srv.Addresses[0].Subnet != "mgmt" || srv.Addresses[0].Interface != "uplink0" {
			t.Fatalf("%s: addresses %+v, want one on mgmt for uplink0", name, srv.Addresses)
		}
		a := srv.Addresses[0].Addr()
		if a.Less(pool[0]) || pool[1].Less(a) {
			t.Errorf("%s: %s is outside mgmt's pool", name, a)
		}
		if other, dup := seen[a.String()]; dup {
			t.Fatalf("%s and %s both hold %s", other, name, a)
		}
		seen[a.String()] = name
		r.waitMachine(r.lab.Machine(name), sim.PhaseOS)
		seed := r.lab.Machine(name).Seed()
		if seed == nil {
			t.Fatalf("%s: no seed recorded", name)
		}
		for _, w := range []string{`set-name: "uplink0"`, `macaddress: "` + srv.BootMAC + `"`, `- "` + a.String() + `/24"`, `via: "10.20.0.1"`, `- "10.20.0.2"`, "dhcp4: false"} {
			if !strings.Contains(seed.NetworkConfig, w) {
				t.Errorf("%s: network-config lacks %s:\n%s", name, w, seed.NetworkConfig)
			}
		}
		r.waitStatus(gitops.ServerStatusPath(name), `address: "`+a.String()+`"`, "interface: uplink0", "subnet: mgmt")
	}
	if len(added) != 2 {
		t.Fatalf("added %v, want 2 servers", added)
	}
	holders, err := r.run.Store.AddressHolders("mgmt")
	if err != nil {
		t.Fatal(err)
	}
	if len(holders) != 2 {
		t.Errorf("mgmt ipam records %v, want the two new servers'", holders)
	}
	for a, name := range holders {
		if seen[a] != name {
			t.Errorf("ipam record %s → %s, server records say %q", a, name, seen[a])
		}
	}

	r.commit("hypervisor count 2", func(dir string) { r.setCount(dir, "hypervisor", 2) })
	r.waitFor("the two released", 2*time.Minute, func(s state.Snapshot) bool {
		for _, name := range added {
			if srv := record(s, name); srv.Lifecycle != state.LifecycleReady || len(srv.Addresses) != 0 {
				return false
			}
		}
		return true
	})
	if holders, err = r.run.Store.AddressHolders("mgmt"); err != nil || len(holders) != 0 {
		t.Errorf("mgmt ipam records after release: %v %v, want none (release policy free)", holders, err)
	}
}
