package plan

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan/plantest"
	"github.com/machina-metal/machina/state"
)

var updatePlans = flag.Bool("update-plans", false, "rewrite testdata/*.golden")

// The plan fixtures, shared with the executor's and gitops's status tests
// (plantest).
var (
	planT0           = plantest.T0
	exampleInventory = plantest.Example
	observe          = plantest.Observe
	hwOf             = plantest.HW
	bigHW            = plantest.BigHW
	cloneInv         = plantest.CloneInv
)

func setLC(snap state.Snapshot, name string, lc state.Lifecycle, alloc *state.Allocation) {
	s := snap.Servers[name]
	s.Lifecycle, s.Allocation = lc, alloc
	snap.Servers[name] = s
}

// steadyFleet is the ready example fleet with its profiles' counts
// deployed: r1-n01 and r1-n02 hypervisor, r2-n01 storage.
func steadyFleet(inv *inventory.Inventory) state.Snapshot {
	snap := observe(inv, state.LifecycleReady, bigHW)
	setLC(snap, "r1-n01", state.LifecycleDeployed, &state.Allocation{Profile: "hypervisor", Reason: ReasonCount, At: planT0})
	setLC(snap, "r1-n02", state.LifecycleDeployed, &state.Allocation{Profile: "hypervisor", Reason: ReasonCount, At: planT0})
	setLC(snap, "r2-n01", state.LifecycleDeployed, &state.Allocation{Profile: "storage", Reason: ReasonCount, At: planT0})
	return snap
}

func TestPlanGolden(t *testing.T) {
	inv := exampleInventory(t)
	// retireHalf wants the first six servers retired; readyExample
	// observes the unchanged example fleet, all ready.
	retireHalf := func() *inventory.Inventory {
		c := cloneInv(inv)
		for i := range c.Servers[:6] {
			c.Servers[i].Want = inventory.WantRetired
		}
		return c
	}
	readyExample := func(*inventory.Inventory) state.Snapshot {
		return observe(exampleInventory(t), state.LifecycleReady, bigHW)
	}
	tests := []struct {
		name string
		want func() *inventory.Inventory
		have func(*inventory.Inventory) state.Snapshot
		opts Options
	}{
		{name: "empty-state-registers-all", have: func(*inventory.Inventory) state.Snapshot { return state.Snapshot{} }},
		{name: "new-servers-commission", have: func(inv *inventory.Inventory) state.Snapshot { return observe(inv, state.LifecycleNew, nil) }},
		{name: "ready-fleet-fills-profile-counts", have: func(inv *inventory.Inventory) state.Snapshot {
			return observe(inv, state.LifecycleReady, bigHW)
		}},
		{name: "steady-fleet-no-changes", have: func(inv *inventory.Inventory) state.Snapshot {
			return steadyFleet(inv)
		}},
		{name: "count-lowered-releases-newest", want: func() *inventory.Inventory {
			c := cloneInv(inv)
			c.Profile("hypervisor").Count = 1
			return c
		}, have: func(inv *inventory.Inventory) state.Snapshot {
			snap := observe(inv, state.LifecycleReady, bigHW)
			setLC(snap, "r1-n01", state.LifecycleDeployed, &state.Allocation{Profile: "hypervisor", Reason: ReasonCount, At: planT0})
			setLC(snap, "r1-n02", state.LifecycleDeployed, &state.Allocation{Profile: "hypervisor", Reason: ReasonCount, At: planT0.Add(time.Minute)})
			setLC(snap, "r1-n03", state.LifecycleDeployed, &state.Allocation{Profile: "hypervisor", Reason: ReasonCount, At: planT0.Add(time.Minute)})
			setLC(snap, "r1-n04", state.LifecycleDeployed, &state.Allocation{Profile: "hypervisor", Reason: ReasonCount, At: planT0.Add(-time.Minute)})
			setLC(snap, "r2-n01", state.LifecycleDeployed, &state.Allocation{Profile: "storage", Reason: ReasonCount, At: planT0})
			return snap
		}},
		{name: "too-few-servers", want: func() *inventory.Inventory {
			c := cloneInv(inv)
			c.Profile("hypervisor").Count = 9
			return c
		}, have: func(inv *inventory.Inventory) state.Snapshot { return observe(inv, state.LifecycleReady, bigHW) }},
		{name: "failed-mid-deploy-replaced", have: func(inv *inventory.Inventory) state.Snapshot {
			snap := observe(inv, state.LifecycleReady, bigHW)
			setLC(snap, "r1-n01", state.LifecycleFailed, nil)
			setLC(snap, "r1-n02", state.LifecycleDeploying, &state.Allocation{Profile: "hypervisor", Reason: ReasonCount, At: planT0})
			setLC(snap, "r2-n01", state.LifecycleDeployed, &state.Allocation{Profile: "storage", Reason: ReasonCount, At: planT0})
			return snap
		}},
		{name: "retire-half-held", want: retireHalf, have: readyExample},
		{name: "retire-half-approved", opts: Options{Approved: true}, want: retireHalf, have: readyExample},
		{name: "profile-to-zero-held", want: func() *inventory.Inventory {
			c := cloneInv(inv)
			c.Profile("storage").Count = 0
			return c
		}, have: func(inv *inventory.Inventory) state.Snapshot {
			return steadyFleet(inv)
		}},
		{name: "orphan-and-counters-and-timeout", want: func() *inventory.Inventory {
			c := cloneInv(inv)
			c.Servers[0].Actions.PowerCycle = 2
			c.Servers[1].Actions.Commission = 1
			return c
		}, have: func(inv *inventory.Inventory) state.Snapshot {
			snap := observe(inv, state.LifecycleReady, bigHW)
			snap.Servers["old-n09"] = &state.Server{Name: "old-n09", Lifecycle: state.LifecycleDeployed, LifecycleAt: planT0}
			s := snap.Servers["r1-n01"]
			s.Actions = map[string]int64{"powerCycle": 1}
			snap.Servers["r1-n01"] = s
			setLC(snap, "r2-n02", state.LifecycleCommissioning, nil)
			return snap
		}, opts: Options{Now: planT0.Add(31 * time.Minute)}},
		{name: "ipam-pool-addresses", want: func() *inventory.Inventory { return poolLayout(inv, "") },
			have: func(inv *inventory.Inventory) state.Snapshot {
				snap := observe(inv, state.LifecycleReady, bigHW)
				// r1-n02 kept its tenant address through a release (tenant's
				// release policy is keep); r3-n01 holds the first mgmt one.
				s := snap.Servers["r1-n02"]
				s.Addresses = []state.AddressLease{{Subnet: "tenant", Interface: "tenant0", Address: "10.120.0.10", Profile: "hypervisor", At: planT0}}
				snap.Servers["r1-n02"] = s
				s = snap.Servers["r3-n01"]
				s.Addresses = []state.AddressLease{{Subnet: "mgmt", Interface: "eno1", Address: "10.20.0.100", Profile: "gpu", At: planT0}}
				snap.Servers["r3-n01"] = s
				return snap
			}},
		{name: "ipam-pool-exhausted", want: func() *inventory.Inventory { return poolLayout(inv, "10.20.0.101") },
			have: func(inv *inventory.Inventory) state.Snapshot {
				snap := observe(inv, state.LifecycleReady, bigHW)
				s := snap.Servers["r3-n01"]
				s.Addresses = []state.AddressLease{{Subnet: "mgmt", Interface: "eno1", Address: "10.20.0.100", Profile: "gpu", At: planT0}}
				snap.Servers["r3-n01"] = s
				return snap
			}},
		{name: "pinned-deploy-and-release", want: func() *inventory.Inventory {
			c := cloneInv(inv)
			c.Server("r3-n01").Want, c.Server("r3-n01").Profile = inventory.WantDeployed, "gpu"
			c.Server("r3-n02").Profile = "gpu"
			return c
		}, have: func(inv *inventory.Inventory) state.Snapshot {
			snap := steadyFleet(inv)
			setLC(snap, "r3-n02", state.LifecycleDeployed, &state.Allocation{Profile: "gpu", Reason: ReasonPinned, At: planT0})
			return snap
		}},
		// Two released servers wait for their release wipe: r3-n01 from
		// a profile with erase zero and an NVMe override (secure), its
		// methods chosen per disk at allocation; r3-n02 from one with
		// erase zero only; r2-n03 (metadata) after a failed try.
		{name: "release-wipe-erase-per-disk", have: func(inv *inventory.Inventory) state.Snapshot {
			snap := steadyFleet(inv)
			released := func(name, erase string, disks []state.EraseDisk, failures int) {
				s := snap.Servers[name]
				s.NeedsWipe, s.WipeErase, s.WipeEraseDisks, s.WipeFailures = true, erase, disks, failures
				if failures > 0 {
					s.WipeFailedAt = planT0.Add(-time.Hour)
				}
				snap.Servers[name] = s
			}
			released("r3-n01", "zero", []state.EraseDisk{
				{Name: "nvme0n1", ByPath: "pci-0000:41:00.0-nvme-1", SizeBytes: 960 << 30, Method: "secure"},
				{Name: "sda", ByPath: "pci-0000:00:17.0-ata-1", SizeBytes: 480 << 30, Method: "zero"},
			}, 0)
			released("r3-n02", "zero", nil, 0)
			released("r2-n03", "", nil, 1)
			return snap
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := inv
			if tt.want != nil {
				want = tt.want()
			}
			if tt.opts.Now.IsZero() {
				tt.opts.Now = planT0.Add(time.Minute)
			}
			got := Compute(want, tt.have(want), tt.opts).Text()
			golden := filepath.Join("testdata", tt.name+".golden")
			if *updatePlans {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			b, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update-plans)", err)
			}
			if got != string(b) {
				t.Errorf("Compute(%s) =\n%s\nwant\n%s", tt.name, got, b)
			}
		})
	}
}

// TestCandidatesOrder: fewest cores, then least memory, then smallest
// fitting disk, then name; servers below the minimum or in other zones or
// pinned elsewhere are never candidates.
func TestCandidatesOrder(t *testing.T) {
	inv := &inventory.Inventory{}
	add := func(name, zone, pin string) {
		inv.Servers = append(inv.Servers, inventory.Server{Name: name, Zone: zone, Profile: pin, Want: inventory.WantReady,
			BMC: inventory.BMC{Driver: inventory.DriverIPMI, Address: "bmc-" + name, Credentials: "c"}})
	}
	for _, n := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		add(n, "z1", "")
	}
	add("other-zone", "z2", "")
	add("pinned-elsewhere", "z1", "q")
	p := inventory.Profile{Name: "p", Zone: "z1", Min: inventory.Min{Cores: 8, MemoryGiB: 32, DiskGiB: 100}}
	hw := map[string]*state.Hardware{
		"a":                hwOf(16, 64, 200),
		"b":                hwOf(8, 64, 200),
		"c":                hwOf(8, 32, 1000, 120), // smallest fitting disk 120
		"d":                hwOf(8, 32, 150),
		"e":                hwOf(8, 32, 150),  // ties d: name decides
		"f":                hwOf(4, 256, 500), // too few cores
		"g":                hwOf(8, 32, 50),   // no disk fits
		"h":                nil,               // never commissioned
		"other-zone":       hwOf(8, 32, 100),
		"pinned-elsewhere": hwOf(8, 32, 100),
	}
	snap := state.Snapshot{Servers: map[string]*state.Server{}}
	for name, h := range hw {
		snap.Servers[name] = &state.Server{Name: name, Lifecycle: state.LifecycleReady, Hardware: h}
	}
	var got []string
	for _, s := range Candidates(p, inv, snap, map[string]string{}) {
		got = append(got, s.Name)
	}
	want := []string{"c", "d", "e", "b", "a"}
	if len(got) != len(want) {
		t.Fatalf("Candidates = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("Candidates = %v, want %v", got, want)
		}
	}
}

func TestPlanNilInventoryDoesNothing(t *testing.T) {
	snap := observe(exampleInventory(t), state.LifecycleReady, bigHW)
	if r := Compute(nil, snap, Options{}); len(r.Steps)+len(r.Held) != 0 {
		t.Errorf("Compute(nil) = %+v, want nothing", r)
	}
}

func TestMarkdownSplits(t *testing.T) {
	var r Result
	for i := 0; i < 500; i++ {
		r.Steps = append(r.Steps, Step{Server: "s" + string(rune('a'+i%26)), Action: ActRegister, Why: "new in servers.yaml"})
	}
	parts := r.Markdown(4000)
	if len(parts) < 2 {
		t.Fatalf("got %d parts, want a split", len(parts))
	}
	for i, p := range parts {
		if len(p) > 4000 {
			t.Errorf("part %d is %d bytes, over 4000", i, len(p))
		}
	}
}

// poolLayout gives the example's hypervisor profile a layout with two
// pool-mode interfaces: eno1 on mgmt, a tagged VLAN on tenant. poolEnd,
// when set, shrinks mgmt's pool to 10.20.0.100-poolEnd.
func poolLayout(inv *inventory.Inventory, poolEnd string) *inventory.Inventory {
	c := cloneInv(inv)
	c.Profile("hypervisor").Network = &inventory.NetworkLayout{
		Ethernets: []inventory.Ethernet{{Name: "eno1", Match: inventory.NICMatch{Name: "eno*"},
			Attachment: inventory.Attachment{Subnet: "mgmt", Address: inventory.AddressPool, DefaultRoute: true}}},
		VLANs: []inventory.VLANInterface{{Name: "tenant0", Link: "eno1", Attachment: inventory.Attachment{Subnet: "tenant", Address: inventory.AddressPool}}},
	}
	c.Subnets = append([]inventory.Subnet(nil), inv.Subnets...)
	if poolEnd != "" {
		sn := c.Subnet("mgmt")
		sn.Pools = []inventory.AddressRange{{Start: "10.20.0.100", End: poolEnd}}
	}
	return c
}
