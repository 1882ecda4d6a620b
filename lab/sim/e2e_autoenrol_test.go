package sim_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/controller"
	"github.com/machina-metal/machina/discover"
	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/state"
)

// smallSite is a one-server site, so the auto-enrol tests run beside a
// quiet fleet.
var smallSite = fstest.MapFS{
	inventory.ServersFile: {Data: []byte(`servers:
  - name: r1-n01
    zone: zone-a
    rack: r1
    bootMAC: "52:54:00:00:01:01"
    bootMode: uefi
    bmc: {driver: redfish, address: "https://10.10.1.11", credentials: bmc-redfish}
`)},
	inventory.ProfilesFile: {Data: []byte(`profiles:
  - name: hypervisor
    image: ubuntu-24.04
    zone: zone-a
    sshKeys: ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO4VqFGm2ahY3KSc9k9lrQMD0j2/tR46oEgCPUxiE9s7 ops@lab1"]
    count: 0
`)},
	inventory.ImagesFile: {Data: []byte("images:\n  - {name: ubuntu-24.04, catalog: ubuntu-24.04}\n")},
}

const strayMAC = "52:54:00:5e:00:01"

// TestAutoEnrolThroughLab: with auto-enrol on, a machine whose MAC no
// server has PXE-boots (powered on by hand: Machina knows no BMC for it),
// is enrolled as auto-5254005e0001, commissioned to ready by the real
// agent, and its servers.yaml entry (no bmc) appears on a discovered/DATE
// branch of the inventory remote, valid against that branch; main is not
// touched by the proposal. `server bmc-set` on the branch's entry
// validates. The reviewer renames it, attaches its BMC and merges: the
// controller adopts the enrolled record under the new name (no second
// registration), copies the BMC, and a commission counter then works
// through that BMC.
func TestAutoEnrolThroughLab(t *testing.T) {
	var bmcURL string
	r := startRig(t, rigOptions{lab: sim.Config{Inventory: smallSite},
		before: func(l *sim.Lab) {
			var err error
			if _, bmcURL, err = l.AddStray("stray", strayMAC); err != nil {
				t.Fatal(err)
			}
		},
		config: func(c *controller.Config) { c.AutoEnroll = true }})
	r.waitServer("r1-n01", "ready", time.Minute, func(s state.Server) bool { return s.Lifecycle == state.LifecycleReady })

	stray := r.lab.Machine("stray")
	stray.PowerOn()
	const auto = "auto-5254005e0001"
	srv := r.waitServer(auto, "enrolled and commissioned to ready", time.Minute, func(s state.Server) bool {
		return s.Lifecycle == state.LifecycleReady && s.Hardware != nil
	})
	if srv.Enrolled == nil || srv.Enrolled.Source != "ipxe" || srv.Zone != gitops.DefaultEnrollZone || srv.BootMAC != strayMAC || srv.BMC.Driver != "" {
		t.Errorf("enrolled server = %+v", srv)
	}
	if srv.Hardware.Cores != stray.HW.Sockets*stray.HW.CoresPerSocket {
		t.Errorf("commissioned cores %d, machine has %d", srv.Hardware.Cores, stray.HW.Sockets*stray.HW.CoresPerSocket)
	}
	evs := r.events(auto, 0)
	if moves(evs, state.LifecycleCommissioning) != 1 || moves(evs, state.LifecycleReady) != 1 {
		t.Errorf("lifecycle events of %s: %+v", auto, evs)
	}

	srv = r.waitServer(auto, "proposed", time.Minute, func(s state.Server) bool { return s.Enrolled != nil && s.Enrolled.Branch != "" })
	if !strings.HasPrefix(srv.Enrolled.Branch, "discovered/") {
		t.Fatalf("proposal branch %q", srv.Enrolled.Branch)
	}
	bare := strings.TrimPrefix(r.lab.RepoURL, "file://")
	repo, err := git.PlainOpen(bare)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := repo.Reference(plumbing.NewBranchReferenceName(srv.Enrolled.Branch), true)
	if err != nil || ref.Hash().String() != srv.Enrolled.Commit {
		t.Fatalf("branch %s on the remote = %v, %v; want %s", srv.Enrolled.Branch, ref, err, srv.Enrolled.Commit)
	}
	raw, inv, err := discover.ReadInventory(bare, srv.Enrolled.Branch)
	if err != nil {
		t.Fatalf("proposed inventory: %v", err)
	}
	e := inv.Server(auto)
	if e == nil || e.BootMAC != strayMAC || !e.BMC.IsZero() || e.Zone != gitops.DefaultEnrollZone || len(e.Tags) != 1 || e.Tags[0] != gitops.EnrolledTag {
		t.Fatalf("proposed entry = %+v\n%s", e, raw)
	}
	if !strings.Contains(string(raw), "# hardware: Machina Sim SimServer 1U") {
		t.Errorf("proposed servers.yaml lacks the hardware comment:\n%s", raw)
	}
	mainRaw, mainInv, err := discover.ReadInventory(bare, "main")
	if err != nil || mainInv.Server(auto) != nil {
		t.Fatalf("main has the proposal (%v):\n%s", err, mainRaw)
	}
	// The admin API shows the enrolment and where it was proposed.
	code, body := r.admin("GET", "/api/v1/servers/"+auto, nil)
	var wire v1.Server
	if err := json.Unmarshal(body, &wire); code != 200 || err != nil || wire.Enrolled == nil || wire.Enrolled.Branch != srv.Enrolled.Branch || wire.BMC.Driver != "" {
		t.Errorf("GET /api/v1/servers/%s = %d %s", auto, code, body)
	}
	// The reconciler shows it waiting for review, not orphaned.
	r.waitFor("awaiting review in the plan", 10*time.Second, func(state.Snapshot) bool {
		for _, c := range r.run.Reconciler.LastPlan().Conditions {
			if c.Subject == "server/"+auto && c.Reason == "AwaitingReview" && strings.Contains(c.Message, srv.Enrolled.Branch) {
				return true
			}
		}
		return false
	})

	// server bmc-set on the proposal's entry, as machinactl does it.
	nb := inventory.BMC{Driver: inventory.DriverRedfish, Address: bmcURL, Credentials: "bmc-redfish"}
	withBMC, err := discover.SetBMC(raw, auto, nb)
	if err != nil {
		t.Fatal(err)
	}
	checked, err := discover.Validate(bare, srv.Enrolled.Branch, withBMC)
	if err != nil {
		t.Fatalf("bmc-set on %s: %v", srv.Enrolled.Branch, err)
	}
	if s := checked.Server(auto); s == nil || s.BMC != nb {
		t.Fatalf("after bmc-set: %+v", s)
	}

	// Review: rename it, keep the BMC, merge into main.
	reviewed := strings.Replace(string(withBMC), `- name: "`+auto+`"`, `- name: r1-n02`, 1)
	reviewed = strings.Replace(reviewed, `zone: "`+gitops.DefaultEnrollZone+`"`+"\n    tags", `zone: "zone-a"`+"\n    rack: \"r1\"\n    tags", 1)
	r.commit("merge discovered: r1-n02 (was "+auto+")", func(dir string) {
		if err := os.WriteFile(filepath.Join(dir, inventory.ServersFile), []byte(reviewed), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	adopted := r.waitServer("r1-n02", "adopted with its BMC", time.Minute, func(s state.Server) bool {
		return s.BMC.Address == bmcURL && s.Zone == "zone-a" && s.Rack == "r1"
	})
	if adopted.Lifecycle != state.LifecycleReady || adopted.Hardware == nil || adopted.Enrolled == nil || adopted.BootMAC != strayMAC {
		t.Errorf("adopted = %+v", adopted)
	}
	snap, err := r.run.Store.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := snap.Servers[auto]; ok {
		t.Errorf("%s still in the store after adoption", auto)
	}
	macs := 0
	for _, s := range snap.Servers {
		if s.BootMAC == strayMAC {
			macs++
		}
	}
	if macs != 1 {
		t.Errorf("%d servers with the stray's MAC, want 1", macs)
	}

	// The BMC now works: recommission through it.
	before := r.resets("stray")
	r.commit("recommission r1-n02", func(dir string) { r.setActions(dir, "r1-n02", inventory.Actions{Commission: 1}) })
	r.waitServer("r1-n02", "recommissioned through its BMC", time.Minute, func(s state.Server) bool {
		return s.Actions["commission"] == 1 && s.Lifecycle == state.LifecycleReady && s.InFlight == nil
	})
	if r.resets("stray") <= before {
		t.Errorf("no power action reached the stray's BMC")
	}
	for _, c := range r.run.Reconciler.LastPlan().Conditions {
		if strings.Contains(c.Subject, "r1-n02") || strings.Contains(c.Subject, auto) {
			t.Errorf("condition left after merge: %+v", c)
		}
	}
}

// TestAutoEnrolOff: without MACHINA_METAL_AUTO_ENROLL the same machine is
// ignored: iPXE answers `exit` (the machine finds nothing to boot on its
// empty disk), no server is created and nothing is proposed.
func TestAutoEnrolOff(t *testing.T) {
	r := startRig(t, rigOptions{lab: sim.Config{Inventory: smallSite},
		before: func(l *sim.Lab) {
			if _, _, err := l.AddStray("stray", strayMAC); err != nil {
				t.Fatal(err)
			}
		}})
	r.waitServer("r1-n01", "ready", time.Minute, func(s state.Server) bool { return s.Lifecycle == state.LifecycleReady })
	stray := r.lab.Machine("stray")
	stray.PowerOn()
	deadline := time.Now().Add(30 * time.Second)
	for stray.Phase() != sim.PhaseNoOS {
		if time.Now().After(deadline) {
			t.Fatalf("stray machine phase %s, want %s (iPXE exit, empty disk)", stray.Phase(), sim.PhaseNoOS)
		}
		time.Sleep(20 * time.Millisecond)
	}
	snap, err := r.run.Store.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range snap.Servers {
		if s.BootMAC == strayMAC || s.Enrolled != nil {
			t.Errorf("server %s created with auto-enrol off", s.Name)
		}
	}
	if len(snap.Servers) != 1 {
		t.Errorf("%d servers, want 1", len(snap.Servers))
	}
	repo, err := git.PlainOpen(strings.TrimPrefix(r.lab.RepoURL, "file://"))
	if err != nil {
		t.Fatal(err)
	}
	refs, err := repo.References()
	if err != nil {
		t.Fatal(err)
	}
	_ = refs.ForEach(func(ref *plumbing.Reference) error {
		if strings.Contains(ref.Name().String(), "discovered") {
			t.Errorf("proposal branch %s with auto-enrol off", ref.Name())
		}
		return nil
	})
}
