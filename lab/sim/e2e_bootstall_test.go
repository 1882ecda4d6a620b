package sim_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/controller"
	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// TestBootStalledShownAndCleared: a commissioning machine whose firmware
// fetches the ramdisk's kernel and refuses it (sim.Machine.RefuseKernel:
// Secure Boot with an unsigned kernel) is noted as having fetched
// /boot/ramdisk/vmlinuz by http, shows Waiting/BootStalled naming the file
// and the time in the admin API's plan (what machinactl status lists) and
// in its status commit, and is re-netbooted on the silent machine's
// bounded schedule, whose event names the stall; once the firmware takes
// the kernel, the next boot commissions it and the condition is gone.
func TestBootStalledShownAndCleared(t *testing.T) {
	ramdisk := t.TempDir()
	for _, f := range []string{"vmlinuz", "initrd.cpio.gz"} {
		if err := os.WriteFile(filepath.Join(ramdisk, f), []byte("simulated "+f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r := startRig(t, rigOptions{})
	r.steady()
	r.stopController()
	// Short silences, and re-netboots to spare: the kernel is taken again
	// after the first re-netboot.
	r.plan.SilentAfter, r.plan.MaxRenetboots = 4*time.Second, 10
	r.config = func(c *controller.Config) { c.RamdiskDir = ramdisk }
	r.startController()
	m := r.lab.Machine(progressTarget)
	m.RefuseKernel(true)
	before, err := r.run.Store.Server(progressTarget)
	if err != nil {
		t.Fatal(err)
	}
	seq := r.lastSeq()
	r.commit("recommission "+progressTarget, func(dir string) {
		r.setActions(dir, progressTarget, inventory.Actions{Commission: before.Actions["commission"] + 1})
	})

	msg := r.waitCondition("Waiting", plan.CondBootStalled, "commissioning: boot stalled: the machine fetched /boot/ramdisk/vmlinuz by http at ",
		"the ramdisk has not called the controller")
	t.Logf("BootStalled: %s", msg)
	code, body := r.admin(http.MethodGet, "/api/v1/servers/"+progressTarget, nil)
	var s v1.Server
	if code != http.StatusOK || json.Unmarshal(body, &s) != nil || s.LastHeard != "boot file fetched: /boot/ramdisk/vmlinuz by http" {
		t.Fatalf("GET /api/v1/servers/%s: %d %s", progressTarget, code, body)
	}
	r.waitStatus(gitops.ServerStatusPath(progressTarget), "reason: BootStalled", "boot stalled: the machine fetched /boot/ramdisk/vmlinuz")
	r.waitFor("a re-netboot naming the stall", time.Minute, func(state.Snapshot) bool {
		for _, e := range r.events(progressTarget, seq) {
			if e.Kind == "machine.renetboot" && strings.Contains(e.Message, "boot file fetched: /boot/ramdisk/vmlinuz by http at ") &&
				strings.Contains(e.Message, "nothing from the ramdisk since") {
				return true
			}
		}
		return false
	})

	m.RefuseKernel(false)
	r.waitServer(progressTarget, "commissioned after the kernel was taken", 2*time.Minute, func(s state.Server) bool {
		return s.Lifecycle == state.LifecycleReady && s.Actions["commission"] == before.Actions["commission"]+1 && s.InFlight == nil
	})
	r.waitFor("no BootStalled condition", time.Minute, func(state.Snapshot) bool {
		for _, c := range r.run.Reconciler.LastPlan().Conditions {
			if c.Subject == "server/"+progressTarget && c.Reason == plan.CondBootStalled {
				return false
			}
		}
		return true
	})
}
