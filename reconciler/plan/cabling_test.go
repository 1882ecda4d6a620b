package plan

import (
	"strings"
	"testing"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// TestPlanCablingGuard: a server whose servers.yaml nics expect switch
// ports is allocated when commissioning's LLDP saw exactly those ports
// (case aside, the port by ID or description); with two cables swapped
// (each NIC heard the other's port) or no LLDP frame seen it gets one
// CablingMismatch naming each NIC, expected and seen, and is neither
// count-allocated nor allocated by a pin; once servers.yaml expects what
// was seen, it is allocated again.
func TestPlanCablingGuard(t *testing.T) {
	base := exampleInventory(t)
	// The server count allocation picks first when nothing holds it.
	first := ""
	for n := range allocations(Compute(base, observe(base, state.LifecycleReady, bigHW), Options{Now: planT0})) {
		if first == "" || n < first {
			first = n
		}
	}
	if first == "" {
		t.Fatal("the example fleet allocates nothing")
	}
	a := &state.LLDP{ChassisID: "0c:29:ef:00:00:0a", SystemName: "leaf-r1-a", PortID: "Ethernet1/7", PortIDSubtype: "ifname"}
	b := &state.LLDP{ChassisID: "0c:29:ef:00:00:0b", PortID: "0c:29:ef:00:00:17", PortIDSubtype: "mac", PortDescription: "Ethernet1/7"}
	expect := []inventory.ServerNIC{
		{MAC: "52:54:00:ee:00:01", Expect: inventory.CablingExpect{Switch: "LEAF-R1-A", Port: "ethernet1/7"}},
		{Name: "eno2", Expect: inventory.CablingExpect{Switch: "0c:29:ef:00:00:0b", Port: "Ethernet1/7"}},
	}
	run := func(nics []inventory.ServerNIC, heard0, heard1 *state.LLDP, pin bool) (Result, []Condition) {
		inv := cloneInv(base)
		for i := range inv.Servers {
			if inv.Servers[i].Name == first {
				inv.Servers[i].NICs = nics
				if pin {
					inv.Servers[i].Want, inv.Servers[i].Profile = inventory.WantDeployed, "hypervisor"
				}
			}
		}
		hw := func(name string) *state.Hardware {
			h := bigHW(name)
			if name == first {
				h.NICs = []state.NIC{{Name: "eno1", MAC: "52:54:00:ee:00:01", LLDP: heard0}, {Name: "eno2", MAC: "52:54:00:ee:00:02", LLDP: heard1}}
			}
			return h
		}
		r := Compute(inv, observe(inv, state.LifecycleReady, hw), Options{Now: planT0})
		var conds []Condition
		for _, c := range r.Conditions {
			if c.Type == CondCablingMismatch {
				conds = append(conds, c)
			}
		}
		return r, conds
	}

	if r, conds := run(expect, a, b, false); len(conds) != 0 || allocations(r)[first] != "hypervisor" {
		t.Errorf("match: conditions %+v, allocations %v; want %s allocated and no CablingMismatch", conds, allocations(r), first)
	}

	r, conds := run(expect, b, a, false) // the two cables swapped
	if len(conds) != 1 || conds[0].Subject != "server/"+first || conds[0].Reason != ReasonCablingDiffers {
		t.Fatalf("swapped: conditions %+v, want one CablingMismatch/%s on %s", conds, ReasonCablingDiffers, first)
	}
	for _, want := range []string{
		"NIC 52:54:00:ee:00:01 (eno1): expected switch LEAF-R1-A port ethernet1/7, saw switch 0c:29:ef:00:00:0b port Ethernet1/7",
		"NIC eno2: expected switch 0c:29:ef:00:00:0b port Ethernet1/7, saw switch leaf-r1-a port Ethernet1/7",
		"not allocated or deployed until",
	} {
		if !strings.Contains(conds[0].Message, want) {
			t.Errorf("swapped: message %q lacks %q", conds[0].Message, want)
		}
	}
	if _, ok := allocations(r)[first]; ok || allocatedTo(r, "hypervisor") != 2 {
		t.Errorf("swapped: allocations %v; want 2 hypervisors, not %s", allocations(r), first)
	}

	r, conds = run(expect, nil, nil, false)
	if len(conds) != 1 || conds[0].Reason != ReasonCablingNotSeen || !strings.Contains(conds[0].Message, "(eno1): expected switch LEAF-R1-A port ethernet1/7, saw no LLDP frame") {
		t.Fatalf("no frames: conditions %+v", conds)
	}
	if _, ok := allocations(r)[first]; ok {
		t.Errorf("no frames: %s allocated", first)
	}

	r, conds = run([]inventory.ServerNIC{{MAC: "52:54:00:ee:00:09", Expect: expect[0].Expect}}, a, b, false)
	if len(conds) != 1 || !strings.Contains(conds[0].Message, "NIC 52:54:00:ee:00:09: expected switch LEAF-R1-A port ethernet1/7, but the commissioning report has no such NIC") {
		t.Fatalf("unknown NIC: conditions %+v", conds)
	}
	if _, ok := allocations(r)[first]; ok {
		t.Errorf("unknown NIC: %s allocated", first)
	}

	r, conds = run(expect, b, a, true) // pinned: want deployed
	if len(conds) != 1 {
		t.Fatalf("pinned swapped: conditions %+v", conds)
	}
	for _, s := range r.Steps {
		if s.Server == first && (s.Action == ActAllocate || s.Action == ActDeploy) {
			t.Errorf("pinned swapped: %s planned for %s", s.Action, first)
		}
	}

	swapped := []inventory.ServerNIC{{MAC: expect[0].MAC, Expect: expect[1].Expect}, {Name: "eno2", Expect: expect[0].Expect}}
	if r, conds := run(swapped, b, a, false); len(conds) != 0 || allocations(r)[first] != "hypervisor" {
		t.Errorf("expectation changed to what was seen: conditions %+v, allocations %v", conds, allocations(r))
	}
}
