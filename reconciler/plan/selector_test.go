package plan

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// TestDerivedLabelKeysAgree: state computes the derived labels whose keys
// inventory reserves; the two lists are the same.
func TestDerivedLabelKeysAgree(t *testing.T) {
	hw := &state.Hardware{CPUVendor: "GenuineIntel", Arch: "amd64", MemoryBytes: 63<<30 + 700<<20, GPUs: []state.GPU{{Vendor: "nvidia"}},
		Disks: []state.Disk{{Name: "nvme0n1", Transport: "nvme"}, {Name: "sda", Transport: "sata"}, {Name: "nvme1n1"}},
		NICs:  []state.NIC{{SpeedMbps: 10000}, {SpeedMbps: 25000}}}
	got := hw.Labels()
	want := map[string]string{"cpu.vendor": "intel", "cpu.arch": "amd64", "memory.gib": "64", "disk.nvme.count": "2", "nic.speed.max": "25000", "gpu.vendor": "nvidia"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Labels (-want +got):\n%s", diff)
	}
	var keys []string
	for k := range got {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if !slices.Equal(keys, inventory.DerivedLabelKeys) {
		t.Errorf("state derives %v, inventory reserves %v", keys, inventory.DerivedLabelKeys)
	}
	hw.InstalledMemoryBytes = 128 << 30
	if got := hw.Labels()["memory.gib"]; got != "128" {
		t.Errorf("memory.gib with DIMMs = %s, want 128 (the DIMM total)", got)
	}
}

// TestPlanSelectsByDerivedLabel: a profile selecting gpu.vendor=nvidia
// allocates only the GPU servers, still the smallest fit first, and the
// plan says why every other server is not selected.
func TestPlanSelectsByDerivedLabel(t *testing.T) {
	inv := &inventory.Inventory{Digest: "sha256:abc"}
	for _, n := range []string{"cpu-1", "gpu-big", "gpu-small", "new-1", "other-zone"} {
		z := "z1"
		if n == "other-zone" {
			z = "z2"
		}
		inv.Servers = append(inv.Servers, inventory.Server{Name: n, Zone: z, Want: inventory.WantReady,
			BMC: inventory.BMC{Driver: inventory.DriverIPMI, Address: "bmc-" + n, Credentials: "c"}})
	}
	inv.Profiles = []inventory.Profile{{Name: "ml", Image: "img", Zone: "z1", Count: 1,
		Selector: &inventory.Selector{MatchLabels: map[string]string{"gpu.vendor": "nvidia"}}}}
	gpu := func(h *state.Hardware) *state.Hardware { h.GPUs = []state.GPU{{Vendor: "nvidia"}}; return h }
	snap := state.Snapshot{Servers: map[string]*state.Server{
		"cpu-1":      {Name: "cpu-1", Lifecycle: state.LifecycleReady, Hardware: hwOf(8, 32, 100)},
		"gpu-big":    {Name: "gpu-big", Lifecycle: state.LifecycleReady, Hardware: gpu(hwOf(32, 512, 1000))},
		"gpu-small":  {Name: "gpu-small", Lifecycle: state.LifecycleReady, Hardware: gpu(hwOf(16, 256, 500))},
		"new-1":      {Name: "new-1", Lifecycle: state.LifecycleNew},
		"other-zone": {Name: "other-zone", Lifecycle: state.LifecycleReady, Hardware: gpu(hwOf(8, 32, 100))},
	}}
	res := Compute(inv, snap, Options{})
	var alloc []string
	for _, s := range res.Steps {
		if s.Action == ActAllocate {
			alloc = append(alloc, s.Server)
		}
	}
	if !slices.Equal(alloc, []string{"gpu-small"}) {
		t.Fatalf("allocated %v, want [gpu-small] (the smallest nvidia server)\n%s", alloc, res.Text())
	}
	want := []Selection{{Profile: "ml", Selector: "gpu.vendor=nvidia", Matches: []string{"gpu-big", "gpu-small"}, Rejected: []Rejection{
		{Server: "cpu-1", Why: "gpu.vendor In (nvidia): has none"},
		{Server: "new-1", Why: "not commissioned yet: its derived labels are unknown"},
		{Server: "other-zone", Why: "zone z2, profile wants z1"},
	}}}
	if diff := cmp.Diff(want, res.Selections); diff != "" {
		t.Errorf("Selections (-want +got):\n%s", diff)
	}
	if txt := res.Text(); !strings.Contains(txt, "profile ml selector gpu.vendor=nvidia matches 2: gpu-big, gpu-small") ||
		!strings.Contains(txt, "not cpu-1") {
		t.Errorf("Text() does not explain the selection:\n%s", txt)
	}
	// None matching today: a warning condition, no allocation.
	inv.Profiles[0].Selector = &inventory.Selector{MatchLabels: map[string]string{"gpu.vendor": "amd"}}
	res = Compute(inv, snap, Options{})
	found := false
	for _, c := range res.Conditions {
		found = found || (c.Subject == "profile/ml" && c.Type == "SelectorMatchesNone")
	}
	if !found || hasAction(res.Steps, ActAllocate) {
		t.Errorf("selector matching none: conditions %+v, steps %v; want SelectorMatchesNone and no allocation", res.Conditions, res.Steps)
	}
}

// TestPlanNeverPowersOnAFencedServer: a fenced server gets no step that
// powers it on (commission counter, power-on counter, allocation) and a
// Fenced condition; unfenced, the same inputs plan those steps.
func TestPlanNeverPowersOnAFencedServer(t *testing.T) {
	inv := &inventory.Inventory{Digest: "sha256:abc", Servers: []inventory.Server{{Name: "n1", Zone: "z", Want: inventory.WantReady,
		BMC: inventory.BMC{Driver: inventory.DriverIPMI, Address: "bmc-n1", Credentials: "c"}, Actions: inventory.Actions{PowerOn: 1, Commission: 1}}},
		Profiles: []inventory.Profile{{Name: "p", Image: "img", Count: 1}}}
	obs := state.Server{Name: "n1", Zone: "z", BootMode: "uefi", Lifecycle: state.LifecycleReady, Hardware: hwOf(8, 32, 100),
		BMC: state.BMCFacts{Driver: "ipmi", Address: "bmc-n1", Credentials: "c"}}
	snap := state.Snapshot{Servers: map[string]*state.Server{"n1": &obs}}
	res := Compute(inv, snap, Options{})
	if !hasAction(res.Steps, ActPowerOn) || !hasAction(res.Steps, ActCommission) {
		t.Fatalf("unfenced plan %v: want power-on and commission (the test's premise)", res.Steps)
	}
	obs.Fenced = &state.Fencing{Actor: "ops", Reason: "lost", Device: "bmc", Host: "n1"}
	snap.Servers["n1"] = &obs
	res = Compute(inv, snap, Options{})
	for _, s := range res.Steps {
		if s.Action.PowersOn() {
			t.Errorf("fenced server planned %s", s)
		}
	}
	found := false
	for _, c := range res.Conditions {
		found = found || (c.Subject == "server/n1" && c.Type == "Fenced" && strings.Contains(c.Message, "machinactl host unfence n1"))
	}
	if !found {
		t.Errorf("conditions %+v: want Fenced on server/n1", res.Conditions)
	}
}
