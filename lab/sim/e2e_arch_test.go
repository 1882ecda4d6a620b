package sim_test

import (
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/state"
)

// TestArchGuardInTheLab: two zone-a machines are arm64
// hardware that servers.yaml does not call arm64. Commissioning (the real
// agent through /boot/grub, as the arm64 GRUB image fetches it) reports
// arch arm64 for them and amd64 for the others; the amd64 hypervisor
// profile deploys only amd64 servers; an arm64 profile added by commit
// deploys one of the arm64 machines; a pin of the amd64 profile onto the
// other arm64 machine is refused with ArchMismatch and never deployed;
// stating amd64 for it then shows StatedArchDiffers.
func TestArchGuardInTheLab(t *testing.T) {
	arm := map[string]string{"r1-n02": "arm64", "r1-n03": "arm64"}
	r := startRig(t, rigOptions{lab: sim.Config{MachineArch: arm}})
	snap := r.waitFor("zone-a commissioned and 2 hypervisors deployed", 2*time.Minute, func(s state.Snapshot) bool {
		for name := range arm {
			if srv := record(s, name); srv.Hardware == nil || srv.Lifecycle != state.LifecycleReady {
				return false
			}
		}
		return deployedBy(s, "hypervisor") == 2
	})
	for name, srv := range snap.Servers {
		if srv.Zone != "zone-a" || srv.Hardware == nil {
			continue
		}
		want := "amd64"
		if arm[name] != "" {
			want = "arm64"
		}
		if srv.Hardware.Arch != want {
			t.Errorf("%s reported arch %q, want %q", name, srv.Hardware.Arch, want)
		}
		if srv.Allocation != nil && srv.Allocation.Profile == "hypervisor" && arm[name] != "" {
			t.Errorf("amd64 profile hypervisor allocated arm64 machine %s", name)
		}
	}

	r.commit("an arm64 profile; pin hypervisor onto r1-n03", func(dir string) {
		r.editBlock(dir, inventory.ProfilesFile, "storage", func(b string) string {
			return "  - name: arm-hv\n    image: ubuntu-24.04-arm64\n    deploy: image\n    sshKeys: [\"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO4VqFGm2ahY3KSc9k9lrQMD0j2/tR46oEgCPUxiE9s7 ops@lab1\"]\n    zone: zone-a\n    min: {cores: 4, memoryGiB: 8, diskGiB: 20}\n    count: 1\n" + b
		})
		r.setServer(dir, "r1-n03", "want", "deployed")
		r.setServer(dir, "r1-n03", "profile", "hypervisor")
	})
	snap = r.waitFor("one arm64 machine deployed by arm-hv", 2*time.Minute, func(s state.Snapshot) bool { return deployedBy(s, "arm-hv") == 1 })
	for name, srv := range snap.Servers {
		if srv.Allocation != nil && srv.Allocation.Profile == "arm-hv" && name != "r1-n02" {
			t.Errorf("arm-hv allocated %s, want the free arm64 machine r1-n02", name)
		}
	}
	cond := func(server, reason string) string {
		for i := 0; i < 100; i++ {
			for _, c := range r.run.Reconciler.LastPlan().Conditions {
				if c.Subject == "server/"+server && c.Type == "ArchMismatch" && c.Reason == reason {
					return c.Message
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("no ArchMismatch/%s condition for %s in %+v", reason, server, r.run.Reconciler.LastPlan().Conditions)
		return ""
	}
	if msg := cond("r1-n03", "ImageArchitecture"); !strings.Contains(msg, "image ubuntu-24.04 is amd64; this server is arm64 (reported by commissioning)") {
		t.Errorf("condition message = %q", msg)
	}
	if srv := r.waitServer("r1-n03", "ready", time.Second, func(s state.Server) bool { return true }); srv.Lifecycle != state.LifecycleReady || srv.Allocation != nil {
		t.Errorf("r1-n03 is %s with allocation %+v, want ready and unallocated", srv.Lifecycle, srv.Allocation)
	}

	r.commit("state r1-n03 as amd64 (wrongly)", func(dir string) { r.setServer(dir, "r1-n03", "arch", "amd64") })
	if msg := cond("r1-n03", "StatedArchDiffers"); !strings.Contains(msg, "servers.yaml states arch amd64, commissioning reported arm64") {
		t.Errorf("condition message = %q", msg)
	}
	if srv := r.waitServer("r1-n03", "still ready", time.Second, func(s state.Server) bool { return true }); srv.Lifecycle != state.LifecycleReady {
		t.Errorf("r1-n03 is %s, want ready (not deployed while stated and reported arch differ)", srv.Lifecycle)
	}
}
