package plan

import (
	"strings"
	"testing"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// TestPlanArchGuard: count allocation takes only servers of the image's
// architecture (reported, else stated); a pinned deploy of another
// architecture's image is refused with ArchMismatch/ImageArchitecture and
// no allocate or deploy step; a server whose stated and reported
// architectures differ gets ArchMismatch/StatedArchDiffers and is neither
// allocated nor deployed; capacity for an arm64 image says arch arm64.
func TestPlanArchGuard(t *testing.T) {
	base := exampleInventory(t)
	zoneA := []string{}
	for _, s := range base.Servers {
		if s.Zone == "zone-a" && s.Want != inventory.WantRetired {
			zoneA = append(zoneA, s.Name)
		}
	}
	if len(zoneA) < 3 {
		t.Fatalf("example zone-a has %v, want 3 or more servers", zoneA)
	}
	withHW := func(arch map[string]string) func(string) *state.Hardware {
		return func(name string) *state.Hardware {
			h := bigHW(name)
			h.Arch = arch[name]
			return h
		}
	}
	setProfileImage := func(inv *inventory.Inventory, image string) {
		for i := range inv.Profiles {
			if inv.Profiles[i].Name == "hypervisor" {
				inv.Profiles[i].Image = image
			}
		}
	}
	steps := func(r Result, server string) []string {
		var out []string
		for _, s := range r.Steps {
			if s.Server == server {
				out = append(out, string(s.Action))
			}
		}
		return out
	}
	cond := func(r Result, subject, typ string) (Condition, bool) {
		for _, c := range r.Conditions {
			if c.Subject == subject && c.Type == typ {
				return c, true
			}
		}
		return Condition{}, false
	}

	t.Run("count allocation by arch", func(t *testing.T) {
		inv := cloneInv(base)
		setProfileImage(inv, "ubuntu-24.04-arm64")
		arches := map[string]string{}
		for _, n := range zoneA {
			arches[n] = "amd64"
		}
		arm := zoneA[len(zoneA)-1] // the largest by name: smallest-first would never pick it
		arches[arm] = "arm64"
		r := Compute(inv, observe(inv, state.LifecycleReady, withHW(arches)), Options{Now: planT0})
		var allocated []string
		for _, s := range r.Steps {
			if s.Action == ActAllocate && s.Profile == "hypervisor" {
				allocated = append(allocated, s.Server)
			}
		}
		if len(allocated) != 1 || allocated[0] != arm {
			t.Fatalf("allocated %v, want only the arm64 server %s", allocated, arm)
		}
		c, ok := cond(r, "profile/hypervisor", "InsufficientCapacity")
		if !ok || !strings.Contains(c.Message, "zone zone-a, arch arm64,") {
			t.Fatalf("capacity condition = %+v, want it to name arch arm64", c)
		}
	})

	t.Run("pinned deploy of another arch refused", func(t *testing.T) {
		inv := cloneInv(base)
		setProfileImage(inv, "ubuntu-24.04-arm64")
		name := zoneA[0]
		for i := range inv.Servers {
			if inv.Servers[i].Name == name {
				inv.Servers[i].Want, inv.Servers[i].Profile = inventory.WantDeployed, "hypervisor"
			}
		}
		arches := map[string]string{}
		for _, n := range zoneA {
			arches[n] = "amd64"
		}
		r := Compute(inv, observe(inv, state.LifecycleReady, withHW(arches)), Options{Now: planT0})
		if got := steps(r, name); len(got) != 0 {
			t.Fatalf("steps for %s = %v, want none", name, got)
		}
		c, ok := cond(r, "server/"+name, "ArchMismatch")
		if !ok || c.Reason != "ImageArchitecture" || !strings.Contains(c.Message, "image ubuntu-24.04-arm64 is arm64; this server is amd64 (reported by commissioning)") {
			t.Fatalf("condition = %+v (found %v)", c, ok)
		}
	})

	t.Run("allocated server whose image changed arch", func(t *testing.T) {
		inv := cloneInv(base)
		name := zoneA[0]
		snap := observe(inv, state.LifecycleReady, withHW(map[string]string{name: "amd64"}))
		setLC(snap, name, state.LifecycleAllocated, &state.Allocation{Profile: "hypervisor", Image: "ubuntu-24.04", Reason: ReasonCount, At: planT0})
		setProfileImage(inv, "ubuntu-24.04-arm64")
		r := Compute(inv, snap, Options{Now: planT0})
		for _, a := range steps(r, name) {
			if a == string(ActDeploy) {
				t.Fatalf("deploy planned for %s although the profile's image is now arm64", name)
			}
		}
		if _, ok := cond(r, "server/"+name, "ArchMismatch"); !ok {
			t.Fatalf("no ArchMismatch for %s: %+v", name, r.Conditions)
		}
	})

	t.Run("stated and reported differ", func(t *testing.T) {
		inv := cloneInv(base)
		name := zoneA[0]
		for i := range inv.Servers {
			if inv.Servers[i].Name == name {
				inv.Servers[i].Arch = "arm64"
			}
		}
		r := Compute(inv, observe(inv, state.LifecycleReady, withHW(map[string]string{name: "amd64"})), Options{Now: planT0})
		c, ok := cond(r, "server/"+name, "ArchMismatch")
		if !ok || c.Reason != "StatedArchDiffers" || !strings.Contains(c.Message, "states arch arm64, commissioning reported amd64") {
			t.Fatalf("condition = %+v (found %v)", c, ok)
		}
		for _, s := range r.Steps {
			if s.Server == name && (s.Action == ActAllocate || s.Action == ActDeploy) {
				t.Fatalf("%s planned for %s despite the mismatch", s.Action, name)
			}
		}
	})

	t.Run("old reports without arch count as amd64", func(t *testing.T) {
		inv := cloneInv(base)
		r := Compute(inv, observe(inv, state.LifecycleReady, bigHW), Options{Now: planT0})
		if n := allocatedTo(r, "hypervisor"); n != 2 {
			t.Fatalf("%d hypervisor allocations on amd64 images with arch-less reports, want 2", n)
		}
	})
}
