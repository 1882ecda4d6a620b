package main

import (
	"io/fs"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/controller"
	"github.com/machina-metal/machina/inventory"
	inventoryexample "github.com/machina-metal/machina/inventory-example"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// TestPlanFirmwareFromAPI: an operator adds a firmware block to the
// hypervisor profile in their clone and runs `machinactl plan --observed
// API`. The plan reads each affected server's last firmware read from
// the controller (GET /api/v1/servers/{name}/firmware) and lists, per
// server, what the block would change: the deployed r1-n01 gets a
// bios-set and a secureboot-set line marked held, and its firmware step
// is held behind `machinactl approve` (applying resets the running
// host); r1-n02, deployed but never read, gets FirmwareNotRead. Once the
// revision is approved, the same plan runs the step and nothing is held.
func TestPlanFirmwareFromAPI(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a, err := api.New(api.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if err := controller.MountFirmwareRead(a, st); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(a.Handler())
	defer hs.Close()
	tok, _, err := st.CreateAdminToken("ops", state.ActorLocal)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(envToken, tok)

	dir := t.TempDir()
	for _, name := range inventory.Files {
		data, err := fs.ReadFile(inventoryexample.FS, name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	editFile(t, filepath.Join(dir, "profiles.yaml"), "    count: 2\n", "    count: 2\n    firmware:\n      settings: {ProcVirtualization: Enabled}\n      secureBoot: true\n")
	res, err := inventory.Load(os.DirFS(dir), inventory.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	inv := res.Inventory
	for i := range inv.Servers {
		if _, err := st.CreateServer(plan.Record(&inv.Servers[i])); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"r1-n01", "r1-n02"} {
		for _, m := range [][2]state.Lifecycle{{state.LifecycleNew, state.LifecycleCommissioning}, {state.LifecycleCommissioning, state.LifecycleReady},
			{state.LifecycleReady, state.LifecycleAllocated}, {state.LifecycleAllocated, state.LifecycleDeploying}, {state.LifecycleDeploying, state.LifecycleDeployed}} {
			if _, err := st.Transition(name, m[0], m[1], "test"); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := st.UpdateServer(name, func(s *state.Server) error {
			s.Allocation = &state.Allocation{Profile: "hypervisor", Reason: plan.ReasonCount, At: time.Now()}
			if name == "r1-n01" {
				s.Firmware = &state.Firmware{ReadAt: time.Now().UTC(),
					BIOS: &state.FirmwareBIOS{Attributes: state.NewBIOSValues(map[string]any{"ProcVirtualization": "Disabled"}),
						Registry: []state.BIOSAttribute{{Name: "ProcVirtualization", Type: "Enumeration", Values: []string{"Enabled", "Disabled"}}}},
					SecureBoot: &state.SecureBootState{Enable: false}}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}

	_, out, errOut := runPlan(t, "--repo", dir, "--observed", hs.URL)
	for _, want := range []string{
		"bios-set r1-n01 ProcVirtualization Disabled -> Enabled (held: deployed; applies after machinactl approve)",
		"secureboot-set r1-n01 false -> true (held: deployed; applies after machinactl approve)",
		"HELD: held until approved (machinactl approve " + plan.DigestPrefix(inv.Digest) + "): the firmware step would reset 1 deployed server",
		"! server/r1-n02 FirmwareNotRead (Waiting)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("plan output lacks %q:\n%s%s", want, out, errOut)
		}
	}
	if err := st.Approve(plan.DigestPrefix(inv.Digest), "ops"); err != nil {
		t.Fatal(err)
	}
	_, out, errOut = runPlan(t, "--repo", dir, "--observed", hs.URL)
	if !strings.Contains(out, "  firmware       r1-n01") || strings.Contains(out, "HELD:") || strings.Contains(out, "(held") {
		t.Errorf("approved: want the firmware step of r1-n01 and nothing held:\n%s%s", out, errOut)
	}
}
