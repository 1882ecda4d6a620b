package reconciler

import (
	"context"
	"fmt"
	"testing"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// TestIPAMAllocateReleaseRetire: the allocate handler takes the profile's
// pool addresses in the move (the plan's simulated address when it is
// free, else the lowest free); release frees mgmt's (release policy
// release) and keeps tenant's (keep, the example's networks.yaml); an
// allocation to the same profile gets the kept one back; retire frees
// what is left.
func TestIPAMAllocateReleaseRetire(t *testing.T) {
	inv := exampleInventory(t)
	inv.Profile("hypervisor").Network = &inventory.NetworkLayout{
		Ethernets: []inventory.Ethernet{{Name: "eno1", Match: inventory.NICMatch{Name: "eno*"},
			Attachment: inventory.Attachment{Subnet: "mgmt", Address: inventory.AddressPool, DefaultRoute: true}}},
		VLANs: []inventory.VLANInterface{{Name: "tenant0", Link: "eno1", Attachment: inventory.Attachment{Subnet: "tenant", Address: inventory.AddressPool}}},
	}
	if inv.Subnet("tenant").Release != inventory.KeepAddress || inv.Subnet("mgmt").Release == inventory.KeepAddress {
		t.Fatal("the example's tenant subnet should keep its addresses and mgmt release them")
	}
	ws := inv.Servers[0]
	st := openEnrolStore(t)
	c, err := New(Config{Store: st, Drivers: driverFunc(nil), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	run := func(step plan.Step) state.Server {
		t.Helper()
		x := &stepCtx{step: step, desired: inv, ws: inv.Server(ws.Name), log: testLogger(t), m: &fakeMachine{}}
		x.obs, _ = st.Server(ws.Name)
		if err := handlers[step.Action](c, context.Background(), x); err != nil {
			t.Fatalf("%s: %v", step.Action, err)
		}
		s, err := st.Server(ws.Name)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	leases := func(s state.Server) string {
		var out []string
		for _, l := range s.Addresses {
			out = append(out, l.Interface+"="+l.Address)
		}
		return fmt.Sprint(out)
	}
	serverAt(t, st, ws.Name, state.LifecycleReady, nil)
	s := run(plan.Step{Server: ws.Name, Action: plan.ActAllocate, Profile: "hypervisor", AllocReason: plan.ReasonCount,
		Addresses: []plan.StepAddress{{Interface: "eno1", Subnet: "mgmt", Address: "10.20.0.150"}}})
	if s.Lifecycle != state.LifecycleAllocated || leases(s) != "[eno1=10.20.0.150 tenant0=10.120.0.10]" {
		t.Fatalf("allocated: %s %s, want eno1 the plan's 10.20.0.150 and tenant0 the lowest free", s.Lifecycle, leases(s))
	}
	for _, lc := range []state.Lifecycle{state.LifecycleDeploying, state.LifecycleDeployed} {
		if _, err := st.Transition(ws.Name, s.Lifecycle, lc, "test"); err != nil {
			t.Fatal(err)
		}
		s.Lifecycle = lc
	}
	s = run(plan.Step{Server: ws.Name, Action: plan.ActRelease, Why: "count lowered"})
	if s.Lifecycle != state.LifecycleReady || leases(s) != "[tenant0=10.120.0.10]" {
		t.Fatalf("released: %s %s, want only tenant's kept", s.Lifecycle, leases(s))
	}
	if h, _ := st.AddressHolders("mgmt"); len(h) != 0 {
		t.Fatalf("mgmt holders after release: %v, want none", h)
	}
	// Ready again after the release wipe: allocated to the same profile
	// it gets its kept tenant address, and mgmt's lowest free.
	if _, err := st.UpdateServer(ws.Name, func(s *state.Server) error { s.NeedsWipe = false; return nil }); err != nil {
		t.Fatal(err)
	}
	s = run(plan.Step{Server: ws.Name, Action: plan.ActAllocate, Profile: "hypervisor", AllocReason: plan.ReasonCount})
	if leases(s) != "[eno1=10.20.0.100 tenant0=10.120.0.10]" {
		t.Fatalf("re-allocated: %s, want the kept tenant address and mgmt's lowest free", leases(s))
	}
	if _, err := st.Transition(ws.Name, state.LifecycleAllocated, state.LifecycleReady, "test"); err != nil {
		t.Fatal(err)
	}
	s = run(plan.Step{Server: ws.Name, Action: plan.ActRetire, Why: "want: retired"})
	if s.Lifecycle != state.LifecycleRetired || len(s.Addresses) != 0 {
		t.Fatalf("retired: %s %s, want no address", s.Lifecycle, leases(s))
	}
	for _, sn := range []string{"mgmt", "tenant"} {
		if h, _ := st.AddressHolders(sn); len(h) != 0 {
			t.Errorf("%s holders after retire: %v, want none", sn, h)
		}
	}
}
