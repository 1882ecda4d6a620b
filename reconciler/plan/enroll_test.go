package plan

import (
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

func stepsOf(res Result, server string) []string {
	var out []string
	for _, s := range res.Steps {
		if s.Server == server {
			out = append(out, string(s.Action)+":"+s.From)
		}
	}
	return out
}

func condOf(res Result, server, typ string) *Condition {
	for i, c := range res.Conditions {
		if c.Subject == "server/"+server && c.Type == typ {
			return &res.Conditions[i]
		}
	}
	return nil
}

// TestPlanAutoEnrolled: an auto-enrolled server not in servers.yaml is not
// an orphan but waits for review (with its proposal branch), and only its
// commissioning deadline is planned. Merged under its generated name it is
// an inventory server without a BMC: no BMC step is planned, a NoBMC
// condition says how to attach one, and profiles do not allocate it.
// Merged under another name (renamed in review), its record is adopted by
// boot MAC once its ramdisk has reported, instead of a second registration.
func TestPlanAutoEnrolled(t *testing.T) {
	inv := exampleInventory(t)
	snap := observe(inv, state.LifecycleReady, bigHW)
	auto := state.Server{Name: "auto-525400aa0001", Zone: "discovered", BootMAC: "52:54:00:aa:00:01", BootMode: "uefi",
		Lifecycle: state.LifecycleCommissioning, LifecycleAt: planT0, Hardware: bigHW("x9"),
		Enrolled: &state.Enrolment{At: planT0, Source: "ipxe"}}
	snap.Servers[auto.Name] = &auto
	opts := Options{Now: planT0.Add(time.Minute)}

	res := Compute(inv, snap, opts)
	if got := stepsOf(res, auto.Name); got != nil {
		t.Errorf("pending steps = %v, want none", got)
	}
	if c := condOf(res, auto.Name, "Orphaned"); c != nil {
		t.Errorf("auto-enrolled server flagged orphaned: %+v", c)
	}
	if c := condOf(res, auto.Name, "Waiting"); c == nil || c.Reason != "AwaitingReview" || !strings.Contains(c.Message, "once commissioning ends") {
		t.Errorf("waiting condition = %+v", c)
	}
	// Past the commissioning deadline: a timeout (it powers nothing off).
	res = Compute(inv, snap, Options{Now: planT0.Add(time.Hour)})
	if got := stepsOf(res, auto.Name); len(got) != 1 || got[0] != "timeout:" {
		t.Errorf("pending steps past the deadline = %v, want timeout", got)
	}
	auto.Lifecycle = state.LifecycleReady
	auto.Enrolled.Branch, auto.Enrolled.Commit = "discovered/2026-11-01", "0123456789abcdef"
	snap.Servers[auto.Name] = &auto
	res = Compute(inv, snap, opts)
	if c := condOf(res, auto.Name, "Waiting"); c == nil || !strings.Contains(c.Message, "discovered/2026-11-01") {
		t.Errorf("waiting condition after proposal = %+v", c)
	}

	// Merged as proposed: a desired server without a BMC.
	merged := cloneInv(inv)
	merged.Servers = append(merged.Servers, inventory.Server{Name: auto.Name, Zone: "zone-a", BootMAC: auto.BootMAC, BootMode: inventory.BootUEFI,
		Want: inventory.WantDeployed, Profile: "hypervisor", Actions: inventory.Actions{PowerCycle: 1}})
	res = Compute(merged, snap, opts)
	for _, s := range res.Steps {
		if s.Server == auto.Name && s.Action.NeedsBMC() {
			t.Errorf("BMC step planned on a server without a BMC: %v", s)
		}
	}
	if got := stepsOf(res, auto.Name); len(got) != 1 || got[0] != "update-identity:" {
		t.Errorf("merged steps = %v, want update-identity (zone changed in review)", got)
	}
	if c := condOf(res, auto.Name, "NoBMC"); c == nil || !strings.Contains(c.Message, "machinactl server bmc-set "+auto.Name) {
		t.Errorf("NoBMC condition = %+v", c)
	}
	if c := condOf(res, auto.Name, "Waiting"); c != nil {
		t.Errorf("merged server still awaiting review: %+v", c)
	}
	p := *merged.Profile("hypervisor")
	for _, c := range Candidates(p, merged, snap, map[string]string{}) {
		if c.Name == auto.Name {
			t.Error("a server without a BMC is an allocation candidate")
		}
	}

	// Renamed in review: adopted by boot MAC, not registered twice.
	renamed := cloneInv(inv)
	renamed.Servers = append(renamed.Servers, inventory.Server{Name: "r9-n01", Zone: "zone-a", BootMAC: auto.BootMAC, BootMode: inventory.BootUEFI, Want: inventory.WantReady})
	res = Compute(renamed, snap, opts)
	if got := stepsOf(res, "r9-n01"); len(got) != 1 || got[0] != "adopt:"+auto.Name {
		t.Errorf("renamed steps = %v, want adopt from %s", got, auto.Name)
	}
	if c := condOf(res, auto.Name, "Waiting"); c != nil {
		t.Errorf("renamed server still awaiting review: %+v", c)
	}
	auto.Lifecycle = state.LifecycleCommissioning
	snap.Servers[auto.Name] = &auto
	res = Compute(renamed, snap, opts)
	if got := stepsOf(res, "r9-n01"); got != nil {
		t.Errorf("adoption while commissioning: %v", got)
	}
	if c := condOf(res, "r9-n01", "Waiting"); c == nil || c.Reason != "AdoptionWaits" {
		t.Errorf("adoption wait condition = %+v", c)
	}
}
