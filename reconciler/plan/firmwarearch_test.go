package plan

import (
	"strings"
	"testing"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// TestPlanFirmwareArch: the SMBIOS arch of the commissioning report
// (state.Hardware.SMBIOSArch) against the kernel's (Arch):
//   - a true conflict (amd64 kernel, arm64 firmware) gets
//     ArchMismatch/FirmwareArchDiffers naming both values and is neither
//     allocated by count nor deployed when pinned;
//   - a 32-bit kernel on its 64-bit family (386 on amd64, arm on arm64) is
//     no conflict, and the SMBIOS value is the server's arch for image fit
//     (an amd64 image is allocated to a 386-kernel server only when its
//     firmware says amd64) and against servers.yaml;
//   - with both a conflict and a stated arch, one ArchMismatch: the
//     firmware one.
func TestPlanFirmwareArch(t *testing.T) {
	base := exampleInventory(t)
	var zoneA []string
	for _, s := range base.Servers {
		if s.Zone == "zone-a" && s.Want != inventory.WantRetired {
			zoneA = append(zoneA, s.Name)
		}
	}
	if len(zoneA) < 3 {
		t.Fatalf("example zone-a has %v, want 3 or more servers", zoneA)
	}
	type arch struct{ kernel, smbios string }
	withHW := func(arches map[string]arch) func(string) *state.Hardware {
		return func(name string) *state.Hardware {
			h := bigHW(name)
			h.Arch, h.SMBIOSArch = arches[name].kernel, arches[name].smbios
			return h
		}
	}
	all := func(a arch) map[string]arch {
		m := map[string]arch{}
		for _, n := range zoneA {
			m[n] = a
		}
		return m
	}
	hypervisorAllocs := func(r Result) []string {
		var out []string
		for _, s := range r.Steps {
			if s.Action == ActAllocate && s.Profile == "hypervisor" {
				out = append(out, s.Server)
			}
		}
		return out
	}
	archConds := func(r Result, name string) []Condition {
		var out []Condition
		for _, c := range r.Conditions {
			if c.Subject == "server/"+name && c.Type == "ArchMismatch" {
				out = append(out, c)
			}
		}
		return out
	}
	noAllocOrDeploy := func(t *testing.T, r Result, name string) {
		t.Helper()
		for _, s := range r.Steps {
			if s.Server == name && (s.Action == ActAllocate || s.Action == ActDeploy) {
				t.Errorf("%s planned for %s despite the firmware conflict", s.Action, name)
			}
		}
	}
	pin := func(inv *inventory.Inventory, name, arch string) {
		for i := range inv.Servers {
			if inv.Servers[i].Name == name {
				inv.Servers[i].Want, inv.Servers[i].Profile = inventory.WantDeployed, "hypervisor"
				inv.Servers[i].Arch = arch
			}
		}
	}

	t.Run("conflict blocks count allocation", func(t *testing.T) {
		inv := cloneInv(base)
		arches := all(arch{"amd64", "amd64"})
		bad := zoneA[0] // the first by name: smallest-first would pick it
		arches[bad] = arch{"amd64", "arm64"}
		r := Compute(inv, observe(inv, state.LifecycleReady, withHW(arches)), Options{Now: planT0})
		got := hypervisorAllocs(r)
		for _, n := range got {
			if n == bad {
				t.Fatalf("allocated %v, which includes %s (kernel amd64, SMBIOS arm64)", got, bad)
			}
		}
		if len(got) != 2 {
			t.Errorf("allocated %v, want 2 other zone-a servers", got)
		}
		cs := archConds(r, bad)
		want := "commissioning kernel reported arch amd64, SMBIOS firmware states arm64: not allocated or deployed"
		if len(cs) != 1 || cs[0].Reason != "FirmwareArchDiffers" || !strings.Contains(cs[0].Message, want) {
			t.Fatalf("conditions for %s = %+v, want one ArchMismatch/FirmwareArchDiffers saying %q", bad, cs, want)
		}
		noAllocOrDeploy(t, r, bad)
	})

	t.Run("conflict blocks a pinned deploy", func(t *testing.T) {
		inv := cloneInv(base)
		name := zoneA[1]
		pin(inv, name, "")
		arches := all(arch{"amd64", "amd64"})
		arches[name] = arch{"arm64", "amd64"}
		r := Compute(inv, observe(inv, state.LifecycleReady, withHW(arches)), Options{Now: planT0})
		noAllocOrDeploy(t, r, name)
		if cs := archConds(r, name); len(cs) != 1 || cs[0].Reason != "FirmwareArchDiffers" || !strings.Contains(cs[0].Message, "kernel reported arch arm64, SMBIOS firmware states amd64") {
			t.Fatalf("conditions for %s = %+v", name, cs)
		}
	})

	t.Run("conflict and stated arch: one condition", func(t *testing.T) {
		inv := cloneInv(base)
		name := zoneA[1]
		pin(inv, name, "arm64")
		arches := all(arch{"amd64", "amd64"})
		arches[name] = arch{"amd64", "arm64"}
		r := Compute(inv, observe(inv, state.LifecycleReady, withHW(arches)), Options{Now: planT0})
		noAllocOrDeploy(t, r, name)
		if cs := archConds(r, name); len(cs) != 1 || cs[0].Reason != "FirmwareArchDiffers" {
			t.Fatalf("conditions for %s = %+v, want only FirmwareArchDiffers", name, cs)
		}
	})

	t.Run("32-bit kernel on 64-bit firmware fits by SMBIOS", func(t *testing.T) {
		inv := cloneInv(base) // hypervisor's image is amd64
		arches := all(arch{"386", ""})
		fits := zoneA[len(zoneA)-1] // the last by name: smallest-first would never pick it
		arches[fits] = arch{"386", "amd64"}
		r := Compute(inv, observe(inv, state.LifecycleReady, withHW(arches)), Options{Now: planT0})
		if got := hypervisorAllocs(r); len(got) != 1 || got[0] != fits {
			t.Fatalf("allocated %v, want only %s (386 kernel, SMBIOS amd64)", got, fits)
		}
		if cs := archConds(r, fits); len(cs) != 0 {
			t.Errorf("conditions for %s = %+v, want none: 386 on amd64 is no mismatch", fits, cs)
		}
		snap := observe(inv, state.LifecycleReady, withHW(arches))
		o := snap.Servers[fits]
		if a, src := ServerArch(inv.Server(fits), o); a != "amd64" || src != "stated by SMBIOS, under a 32-bit commissioning kernel" {
			t.Errorf("ServerArch(%s) = %q, %q; want amd64 stated by SMBIOS", fits, a, src)
		}
	})

	t.Run("arm kernel on arm64 firmware takes a pinned arm64 image", func(t *testing.T) {
		inv := cloneInv(base)
		for i := range inv.Profiles {
			if inv.Profiles[i].Name == "hypervisor" {
				inv.Profiles[i].Image = "ubuntu-24.04-arm64"
			}
		}
		name := zoneA[0]
		pin(inv, name, "arm64") // servers.yaml agrees with the firmware, not the kernel
		arches := all(arch{"amd64", "amd64"})
		arches[name] = arch{"arm", "arm64"}
		r := Compute(inv, observe(inv, state.LifecycleReady, withHW(arches)), Options{Now: planT0})
		if cs := archConds(r, name); len(cs) != 0 {
			t.Fatalf("conditions for %s = %+v, want none", name, cs)
		}
		allocated := false
		for _, s := range r.Steps {
			allocated = allocated || s.Server == name && s.Action == ActAllocate
		}
		if !allocated {
			t.Errorf("no allocate step for pinned %s (arm kernel, SMBIOS arm64, image arm64): %+v", name, r.Steps)
		}
	})
}

// TestArchConditionsAllocationFree: for servers it has nothing to say
// about (no arch, agreeing arches, a 32-bit kernel on its 64-bit family)
// archConditions allocates nothing, as BenchmarkPlan10k needs.
func TestArchConditionsAllocationFree(t *testing.T) {
	inv := exampleInventory(t)
	ws := inv.Servers[0]
	for _, hw := range []*state.Hardware{nil, {}, {Arch: "amd64"}, {Arch: "amd64", SMBIOSArch: "amd64"}, {Arch: "386", SMBIOSArch: "amd64"}, {Arch: "arm", SMBIOSArch: "arm64"}} {
		obs := &state.Server{Name: ws.Name, Hardware: hw}
		n := testing.AllocsPerRun(100, func() {
			conds, kept := archConditions(inv, &ws, obs, nil)
			if len(conds) != 0 || len(kept) != 0 {
				t.Fatalf("archConditions(%+v) = %+v, %+v; want nothing", hw, conds, kept)
			}
		})
		if n != 0 {
			t.Errorf("archConditions for hardware %+v: %.0f allocations, want 0", hw, n)
		}
	}
}
