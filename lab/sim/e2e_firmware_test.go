package sim_test

import (
	"net/http"
	"os"
	"path"
	"strings"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/controller"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// TestFirmwareBeforeDeploy: the firmware-site inventory pins one zone-a
// server per vendor tree (Dell iDRAC 9, HPE iLO 5, Lenovo XCC, Supermicro
// X13, each served by bmcsim with its own BIOS attribute names) to a
// profile whose firmware block sets a BIOS attribute, Secure Boot, a
// firmware version and (on XCC, the one tree whose controller takes a
// volume on free drives) a RAID1 volume. Each goes ready → allocated →
// firmware step (settings through the vendor's flow: a Dell configuration
// job, iLO/XCC/Supermicro settings objects applied at reset; SimpleUpdate
// followed to the end of its task and the BMC's restart) → deployed, and
// its stored read-back matches every value of its profile: the plan has
// no firmware change left for it. Then a setting the Dell registry
// refuses is committed onto a fresh pinned server (r2-n02): FirmwareSettingInvalid
// names the allowed values and the server is never deployed nor sent a
// BIOS write (its BIOS reads back unchanged, nothing pending). Released,
// the Lenovo server loses the volume Machina created.
func TestFirmwareBeforeDeploy(t *testing.T) {
	site := os.DirFS("testdata/firmware-site")
	r := startRig(t, rigOptions{lab: sim.Config{Inventory: site}, config: func(c *controller.Config) {
		c.Reconciler.FirmwareTaskPoll = 20 * time.Millisecond
	}})
	pins := map[string]string{"r1-n01": "fw-dell", "r1-n02": "fw-hpe", "r1-n03": "fw-lenovo", "r1-n04": "fw-smc"}
	snap := r.waitFor("the four pinned servers deployed", 4*time.Minute, func(s state.Snapshot) bool {
		for name, p := range pins {
			srv := record(s, name)
			if srv.Lifecycle != state.LifecycleDeployed || srv.FinishDeploy || srv.Allocation == nil || srv.Allocation.Profile != p {
				return false
			}
		}
		return true
	})
	inv, err := inventory.Load(site, inventory.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range pins {
		srv := record(snap, name)
		fw := srv.Firmware
		if fw == nil || fw.BIOS == nil {
			t.Errorf("%s: no firmware read stored", name)
			continue
		}
		want := inv.Inventory.Profile(p).Firmware
		for attr, v := range want.Settings {
			if got := fw.BIOS.Attributes.Value(attr); got != v {
				t.Errorf("%s: BIOS %s read back %v, want %v", name, attr, got, v)
			}
		}
		if want.SecureBoot != nil && (fw.SecureBoot == nil || fw.SecureBoot.Enable != *want.SecureBoot) {
			t.Errorf("%s: Secure Boot read back %+v, want %v", name, fw.SecureBoot, *want.SecureBoot)
		}
		ws := inv.Inventory.Server(name)
		if chk := plan.CheckFirmware(inv.Inventory, want, ws, srv); len(chk.Changes) != 0 || len(chk.Refusals) != 0 || chk.NotRead {
			t.Errorf("%s: after deploy the read-back still differs: %+v", name, chk)
		}
		for _, v := range want.Versions {
			found := false
			for _, c := range fw.Components {
				found = found || (c.ID == v.Component || strings.EqualFold(c.Name, v.Component)) && c.Version == v.Version
			}
			if !found {
				t.Errorf("%s: component %s not at %s after the update: %+v", name, v.Component, v.Version, fw.Components)
			}
		}
	}
	// Each update's file came from the controller's /firmware/ handler
	// (an offer's unguessable path), with the catalog's bytes: the BMC
	// fetched it itself (bmcsim FetchImages), once per update. The offer
	// is gone once the step is: the same URL now answers 404.
	for name, p := range pins {
		want := inv.Inventory.Profile(p).Firmware.Versions
		fetches := r.lab.BMC(name).ImageFetches()
		if len(fetches) != len(want) {
			t.Errorf("%s: the BMC fetched %d update images (%+v), want %d", name, len(fetches), fetches, len(want))
			continue
		}
		for i, v := range want {
			fi, f := inv.Inventory.FirmwareImage(v.Image), fetches[i]
			sum := "sha256:" + f.SHA256
			if f.Err != "" || f.Status != http.StatusOK || !strings.HasPrefix(f.URI, r.run.URL+"/firmware/") || !strings.HasSuffix(f.URI, "/"+path.Base(fi.URL)) {
				t.Errorf("%s: fetch %+v; want 200 from %s/firmware/<token>/%s", name, f, r.run.URL, path.Base(fi.URL))
			}
			if rec, err := r.run.Images.Lookup(v.Image); err != nil || rec.Raw.String() != sum || rec.SizeBytes != f.Bytes {
				t.Errorf("%s: the BMC got %d bytes %s; the store holds %+v (%v)", name, f.Bytes, sum, rec, err)
			}
			if resp, err := http.Get(f.URI); err != nil || resp.StatusCode != http.StatusNotFound {
				t.Errorf("%s: GET %s after the step: %v %v, want 404 (offer released)", name, f.URI, resp, err)
			} else {
				resp.Body.Close()
			}
		}
	}
	lenovo := record(snap, "r1-n03").Firmware
	if len(lenovo.CreatedVolumes) != 1 || lenovo.CreatedVolumes[0] != "M.2/os" {
		t.Errorf("r1-n03 created volumes %v, want M.2/os", lenovo.CreatedVolumes)
	}
	vol := false
	for _, c := range lenovo.Storage {
		for _, v := range c.Volumes {
			vol = vol || c.ID == "M.2" && v.Name == "os" && v.RAIDType == "RAID1" && len(v.Drives) == 2
		}
	}
	if !vol {
		t.Errorf("r1-n03: no RAID1 volume os on M.2 read back: %+v", lenovo.Storage)
	}

	// Release r1-n03: the volume Machina created is deleted (XCC deletes
	// at once), the others' are never touched.
	r.commit("r1-n03 no longer deployed", func(dir string) { r.setServer(dir, "r1-n03", "want", "ready") })
	// It is fw-lenovo's last deployed server: the safety brake holds the
	// release until it is approved.
	var rev string
	r.waitFor("the release held by the brake", time.Minute, func(state.Snapshot) bool {
		_, after, ok := strings.Cut(r.run.Reconciler.LastPlan().Brake, "machinactl approve ")
		rev, _, _ = strings.Cut(after, ")")
		return ok && rev != ""
	})
	if code, body := r.admin(http.MethodPost, "/api/v1/approve", v1.ApproveRequest{Revision: rev}); code != http.StatusOK {
		t.Fatalf("approve %s: %d %s", rev, code, body)
	}
	rel := r.waitServer("r1-n03", "released with its volume deleted", 2*time.Minute, func(s state.Server) bool {
		return s.Lifecycle == state.LifecycleReady && s.Firmware != nil && len(s.Firmware.CreatedVolumes) == 0
	})
	for _, c := range rel.Firmware.Storage {
		for _, v := range c.Volumes {
			if v.Name == "os" {
				t.Errorf("r1-n03 after release still has volume os on %s", c.ID)
			}
		}
	}

	// A refused setting: r2-n02 (the Dell tree again) pinned to a
	// profile whose attribute value is not in its registry's list.
	r.commit("pin r2-n02 to a profile with a refused BIOS value", func(dir string) {
		r.editBlock(dir, inventory.ProfilesFile, "storage", func(b string) string {
			return "  - name: fw-refused\n    image: ubuntu-24.04\n    sshKeys: [\"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO4VqFGm2ahY3KSc9k9lrQMD0j2/tR46oEgCPUxiE9s7 ops@lab1\"]\n    min: {cores: 1, memoryGiB: 1, diskGiB: 1}\n    firmware:\n      settings: {AesNi: Sometimes}\n" + b
		})
		r.setServer(dir, "r2-n02", "want", "deployed")
		r.setServer(dir, "r2-n02", "profile", "fw-refused")
	})
	var cond plan.Condition
	r.waitFor("r2-n02 refused with FirmwareSettingInvalid", 2*time.Minute, func(state.Snapshot) bool {
		for _, c := range r.run.Reconciler.LastPlan().Conditions {
			if c.Subject == "server/r2-n02" && strings.HasPrefix(c.Type, "Firmware") && c.Type != plan.CondFirmwareNotRead {
				cond = c
				return true
			}
		}
		return false
	})
	if cond.Type != plan.CondFirmwareSettingInvalid || !strings.Contains(cond.Message, `AesNi: value "Sometimes" not allowed (allowed: Enabled, Disabled)`) {
		t.Errorf("condition %+v; want FirmwareSettingInvalid naming AesNi and the allowed values", cond)
	}
	srv := r.waitServer("r2-n02", "not deployed", time.Second, func(state.Server) bool { return true })
	if srv.Lifecycle == state.LifecycleDeploying || srv.Lifecycle == state.LifecycleDeployed {
		t.Errorf("r2-n02 is %s with a refused firmware block", srv.Lifecycle)
	}
	// Nothing was written: the step refused from its own read, so the
	// BIOS still has the tree's value and nothing is pending.
	if b := srv.Firmware.BIOS; b == nil || b.Attributes.Value("AesNi") != "Enabled" || len(b.Pending) != 0 {
		t.Errorf("r2-n02 BIOS after the refusal: %+v; want AesNi Enabled and nothing pending", b)
	}
}
