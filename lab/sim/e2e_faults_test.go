package sim_test

import (
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// TestMemoryFailureThenRecommission: a machine whose memory test
// finds a stuck bit lands in failed with the reason in status; once the
// DIMM is "replaced" (fault cleared), bumping actions.commission brings it
// back to ready, with the counter observed.
func TestMemoryFailureThenRecommission(t *testing.T) {
	const name = "r3-n01"
	r := startRig(t, rigOptions{before: func(l *sim.Lab) { l.Machine(name).FailMemory(true) }})
	srv := r.waitServer(name, "failed", time.Minute, func(s state.Server) bool { return s.Lifecycle == state.LifecycleFailed })
	if srv.Hardware != nil && srv.Lifecycle == state.LifecycleReady {
		t.Fatalf("%s passed commissioning with a failing DIMM", name)
	}
	var reason string
	for _, e := range r.events(name, 0) {
		if e.To == state.LifecycleFailed {
			reason = e.Message
		}
	}
	if !strings.Contains(strings.ToLower(reason), "memory") {
		t.Errorf("%s failed for %q, want the memory test", name, reason)
	}
	body := r.waitStatus(gitops.ServerStatusPath(name), "lifecycle: failed")
	if !strings.Contains(strings.ToLower(body), "memory") {
		t.Errorf("%s does not say why:\n%s", gitops.ServerStatusPath(name), body)
	}
	if p := r.lab.Machine(name).Phase(); p != sim.PhaseOff {
		t.Errorf("%s failed but its machine is %s", name, p)
	}
	// The others are unaffected.
	r.waitFor("10 others commissioned", time.Minute, func(s state.Snapshot) bool {
		return count(s, state.LifecycleReady)+count(s, state.LifecycleDeployed)+count(s, state.LifecycleAllocated)+count(s, state.LifecycleDeploying) == 10
	})

	r.lab.Machine(name).FailMemory(false)
	r.commit("recommission "+name+" after the DIMM swap", func(dir string) { r.setActions(dir, name, inventory.Actions{Commission: 1}) })
	srv = r.waitServer(name, "ready again", time.Minute, func(s state.Server) bool {
		return s.Lifecycle == state.LifecycleReady && s.Actions["commission"] == 1
	})
	if srv.Hardware == nil || srv.LastError != "" {
		t.Errorf("%s ready again: hardware %v last error %q", name, srv.Hardware, srv.LastError)
	}
	r.waitStatus(gitops.ServerStatusPath(name), "commission: 1")
	r.steady()
}

// TestChecksumMismatchLeavesDiskUntouched: every image the
// zone-b machines download arrives with a flipped byte. The storage deploy
// fails with a checksum error reported by the agent, the target's disks are
// byte-for-byte as before (the agent verifies before it writes), the
// server is failed and off; with the network fixed and the server
// recommissioned, the storage profile is deployed.
func TestChecksumMismatchLeavesDiskUntouched(t *testing.T) {
	zoneB := []string{"r2-n01", "r2-n02", "r2-n03", "r2-n04"}
	before := map[string]diskPrint{}
	r := startRig(t, rigOptions{before: func(l *sim.Lab) {
		for _, name := range zoneB {
			m := l.Machine(name)
			m.CorruptImages(true)
			for _, d := range []string{"sda", "sdb", "sdc"} {
				before[name+"/"+d] = printDisk(t, m.DiskPath(d))
			}
		}
	}})
	snap := r.waitFor("a storage deploy failed", time.Minute, func(s state.Snapshot) bool {
		for _, name := range zoneB {
			if record(s, name).Lifecycle == state.LifecycleFailed {
				return true
			}
		}
		return false
	})
	var failed []string
	for _, name := range zoneB {
		srv := record(snap, name)
		if srv.Lifecycle != state.LifecycleFailed {
			continue
		}
		failed = append(failed, name)
		if !strings.Contains(srv.LastError, "checksum") {
			t.Errorf("%s failed with %q, want a checksum mismatch", name, srv.LastError)
		}
		if srv.Allocation != nil {
			t.Errorf("%s failed but keeps its allocation %+v", name, srv.Allocation)
		}
		r.waitMachine(r.lab.Machine(name), sim.PhaseOff)
		for _, d := range []string{"sda", "sdb", "sdc"} {
			if got := printDisk(t, r.lab.Machine(name).DiskPath(d)); got != before[name+"/"+d] {
				t.Errorf("%s %s changed by a deploy that failed its checksum", name, d)
			}
		}
		r.waitStatus(gitops.ServerStatusPath(failed[0]), "lifecycle: failed")
	}
	if len(failed) == 0 {
		t.Fatal("no failed server")
	}

	// Fix the network, recommission whatever failed by then: storage deploys.
	for _, name := range zoneB {
		r.lab.Machine(name).CorruptImages(false)
	}
	// Let the failures settle (deploys already running with the corrupting
	// client finish failing) before recommissioning.
	snap = r.waitFor("no zone-b deploy running", time.Minute, func(s state.Snapshot) bool {
		for _, name := range zoneB {
			if lc := record(s, name).Lifecycle; lc == state.LifecycleAllocated || lc == state.LifecycleDeploying {
				return false
			}
		}
		return true
	})
	if deployedBy(snap, "storage") == 0 {
		r.commit("recommission failed storage servers", func(dir string) {
			for _, name := range zoneB {
				if record(snap, name).Lifecycle == state.LifecycleFailed {
					r.setActions(dir, name, inventory.Actions{Commission: 1})
				}
			}
		})
	}
	snap = r.waitFor("storage deployed", time.Minute, func(s state.Snapshot) bool { return deployedBy(s, "storage") == 1 })
	for _, name := range zoneB {
		if srv := record(snap, name); srv.Lifecycle == state.LifecycleDeployed {
			r.waitMachine(r.lab.Machine(name), sim.PhaseOS)
			if printDisk(t, r.lab.Machine(name).DiskPath("sda")) == before[name+"/sda"] {
				t.Errorf("%s deployed but sda is unchanged", name)
			}
		}
	}
}

// TestRestartMidDeploy: the controller stops while a machine
// writes its image and starts again on the same state, work folder and
// address. The deploy finishes (deployed, booted from disk) or fails
// cleanly by the deploy deadline (failed with the reason, powered off,
// replaced by the profile's top-up); nothing stays deploying or in flight
// and the profiles' counts are met.
func TestRestartMidDeploy(t *testing.T) {
	r := startRig(t, rigOptions{plan: plan.Options{DeployTimeout: 8 * time.Second}})
	caught := r.firstInPhase(sim.PhaseDeploying, "deploying")
	r.stopController()
	r.startController()
	snap, err := r.run.Store.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("caught %s deploying; at restart it is %s", caught, record(snap, caught).Lifecycle)

	snap = r.waitFor("counts met, nothing deploying or in flight", time.Minute, func(s state.Snapshot) bool {
		for _, srv := range s.Servers {
			if srv.InFlight != nil || srv.Lifecycle == state.LifecycleAllocated || srv.Lifecycle == state.LifecycleDeploying ||
				srv.Lifecycle == state.LifecycleCommissioning || srv.FinishDeploy {
				return false
			}
		}
		return deployedBy(s, "hypervisor") == 2 && deployedBy(s, "storage") == 1
	})
	switch srv := record(snap, caught); srv.Lifecycle {
	case state.LifecycleDeployed:
		r.waitMachine(r.lab.Machine(caught), sim.PhaseOS)
	case state.LifecycleFailed:
		if srv.LastError == "" {
			t.Errorf("%s failed without a reason", caught)
		}
		r.waitMachine(r.lab.Machine(caught), sim.PhaseOff)
		r.waitStatus(gitops.ServerStatusPath(caught), "lifecycle: failed")
	default:
		t.Errorf("%s ended %s, want deployed or failed", caught, srv.Lifecycle)
	}
	for name, srv := range snap.Servers {
		if srv.Lifecycle == state.LifecycleFailed && (srv.LastError == "" || r.lab.Machine(name).Phase() != sim.PhaseOff) {
			t.Errorf("%s failed uncleanly: reason %q, machine %s", name, srv.LastError, r.lab.Machine(name).Phase())
		}
		if srv.Lifecycle == state.LifecycleDeployed {
			r.waitMachine(r.lab.Machine(name), sim.PhaseOS)
		}
	}
}
