package sim_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// stepsFor returns the plan's steps (and held steps) on server.
func stepsFor(res plan.Result, server string) []plan.Step {
	var out []plan.Step
	for _, s := range append(append([]plan.Step(nil), res.Steps...), res.Held...) {
		if s.Server == server {
			out = append(out, s)
		}
	}
	return out
}

// settled waits until a fresh planning pass has nothing to do on server
// and the status commit shows text in its status file, and returns that
// pass's plan.
func (r *rig) settled(server, text string) plan.Result {
	r.t.Helper()
	r.waitStatus(gitops.ServerStatusPath(server), text)
	deadline := time.Now().Add(30 * time.Second)
	for {
		res := r.run.Reconciler.Pass(context.Background())
		srv, err := r.run.Store.Server(server)
		if err != nil {
			r.t.Fatal(err)
		}
		if len(stepsFor(res, server)) == 0 && srv.InFlight == nil {
			return res
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: still planned: %v (in flight %v)", server, stepsFor(res, server), srv.InFlight)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPowerCycleCounterRunsOnce: bumping actions.powerCycle on
// one server resets it through its BMC exactly once, the counter is then
// observed in status, and later passes plan nothing more for it.
func TestPowerCycleCounterRunsOnce(t *testing.T) {
	r := startRig(t, rigOptions{})
	r.steady()
	const name = "r3-n01" // zone-c: no profile deploys it, so it stays ready
	m := r.lab.Machine(name)
	r.lab.BMC(name).ClearRequests()
	boots := m.Boots()
	for _, other := range []string{"r3-n02", "r2-n02"} {
		r.lab.BMC(other).ClearRequests()
	}

	r.commit("power-cycle r3-n01", func(dir string) { r.setActions(dir, name, inventory.Actions{PowerCycle: 1}) })
	srv := r.waitServer(name, "powerCycle observed", time.Minute, func(s state.Server) bool { return s.Actions["powerCycle"] == 1 })
	body := r.waitStatus(gitops.ServerStatusPath(name), "powerCycle: 1")
	r.settled(name, "powerCycle: 1")

	if n := r.resets(name); n != 1 {
		t.Errorf("%s BMC accepted %d resets, want exactly 1: %v", name, n, r.bmcWrites(name))
	}
	if got := m.Boots() - boots; got != 1 {
		t.Errorf("%s booted %d times after the bump, want 1", name, got)
	}
	if srv.Lifecycle != state.LifecycleReady || srv.LastError != "" {
		t.Errorf("%s: lifecycle %s, last error %q; want ready and no error", name, srv.Lifecycle, srv.LastError)
	}
	if !strings.Contains(body, "observedActions:\n  commission: 0\n  powerCycle: 1\n") {
		t.Errorf("%s observedActions:\n%s", gitops.ServerStatusPath(name), body)
	}
	for _, other := range []string{"r3-n02", "r2-n02"} {
		if w := r.bmcWrites(other); len(w) != 0 {
			t.Errorf("%s (not bumped) got BMC writes %v", other, w)
		}
	}
}

// TestCommissionCounterRunsOnce: bumping actions.commission on a
// ready server recommissions it exactly once (one boot, one
// ready→commissioning move) and status shows the observed counter.
func TestCommissionCounterRunsOnce(t *testing.T) {
	r := startRig(t, rigOptions{})
	r.steady()
	const name = "r3-n02"
	m := r.lab.Machine(name)
	boots := m.Boots()
	seq := r.lastSeq()

	r.commit("recommission r3-n02", func(dir string) { r.setActions(dir, name, inventory.Actions{Commission: 1}) })
	srv := r.waitServer(name, "recommissioned", time.Minute, func(s state.Server) bool {
		return s.Actions["commission"] == 1 && s.Lifecycle == state.LifecycleReady
	})
	// The counter is observed when commissioning starts: wait for the
	// status commit that also shows the server ready again.
	body := r.waitStatus(gitops.ServerStatusPath(name), "commission: 1", "lifecycle: ready")
	r.settled(name, "commission: 1")

	evs := r.events(name, seq)
	if n := moves(evs, state.LifecycleCommissioning); n != 1 {
		t.Errorf("%s moved into commissioning %d times, want 1: %v", name, n, evs)
	}
	if n := moves(evs, state.LifecycleReady); n != 1 {
		t.Errorf("%s moved into ready %d times, want 1", name, n)
	}
	if got := m.Boots() - boots; got != 1 {
		t.Errorf("%s booted %d times, want 1", name, got)
	}
	if srv.Hardware == nil || srv.Hardware.Cores == 0 {
		t.Errorf("%s has no hardware facts after recommissioning", name)
	}
	if !strings.Contains(body, "lifecycle: ready") || !strings.Contains(body, "observedActions:\n  commission: 1\n") {
		t.Errorf("%s:\n%s", gitops.ServerStatusPath(name), body)
	}
}

// TestInvalidCommitKeepsLastGood: a commit with a malformed MAC
// (which also bumps a power counter and raises a profile count) is not
// applied at all: no power action, no new deploy, the controller keeps
// acting on the last good digest, and status/inventory.yaml names the file
// and line. Fixing the MAC applies the rest once.
func TestInvalidCommitKeepsLastGood(t *testing.T) {
	r := startRig(t, rigOptions{})
	r.steady()
	good := r.run.Reconciler.Desired().Digest
	for _, m := range r.lab.Machines() {
		r.lab.BMC(m.Name).ClearRequests()
	}
	const bump, broken = "r3-n01", "r3-n02"

	bad := r.commit("break a MAC", func(dir string) {
		r.setActions(dir, bump, inventory.Actions{PowerCycle: 1})
		r.setServer(dir, broken, "bootMAC", `"52:54:00:zz:00:02"`)
		r.setCount(dir, "hypervisor", 3)
	})
	line := lineOf(t, filepath.Join(r.lab.Clone, inventory.ServersFile), "52:54:00:zz:00:02")
	inv := r.waitStatus("status/inventory.yaml", bad)
	if !strings.Contains(inv, "valid: false") || !strings.Contains(inv, "file: servers.yaml") || !strings.Contains(inv, fmt.Sprintf("line: %d\n", line)) {
		t.Errorf("status/inventory.yaml does not carry servers.yaml:%d:\n%s", line, inv)
	}
	if !strings.Contains(inv, good) {
		t.Errorf("status/inventory.yaml does not act on the last good digest %s:\n%s", good, inv)
	}
	// Passes after the invalid commit plan from the last good revision.
	res := r.run.Reconciler.Pass(context.Background())
	if d := r.run.Reconciler.Desired().Digest; d != good {
		t.Errorf("desired digest %s, want the last good %s", d, good)
	}
	if s := stepsFor(res, bump); len(s) != 0 {
		t.Errorf("plan on the invalid revision has steps for %s: %v", bump, s)
	}
	if len(res.Steps) != 0 {
		t.Errorf("plan after an invalid commit is not empty: %v", res.Steps)
	}
	snap, err := r.run.Store.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range r.lab.Machines() {
		if w := r.bmcWrites(m.Name); len(w) != 0 {
			t.Errorf("%s got BMC writes after an invalid commit: %v", m.Name, w)
		}
	}
	if n := count(snap, state.LifecycleAllocated) + count(snap, state.LifecycleDeploying); n != 0 {
		t.Errorf("%d servers allocated or deploying after an invalid commit", n)
	}
	if record(snap, broken).BootMAC != "52:54:00:03:00:02" {
		t.Errorf("%s boot MAC changed to %q", broken, record(snap, broken).BootMAC)
	}

	// Fixing the MAC makes the revision valid: the counter runs once and
	// the count is raised.
	r.commit("fix the MAC", func(dir string) { r.setServer(dir, broken, "bootMAC", `"52:54:00:03:00:02"`) })
	r.waitServer(bump, "powerCycle observed", time.Minute, func(s state.Server) bool { return s.Actions["powerCycle"] == 1 })
	r.waitStatus("status/inventory.yaml", "valid: true")
	r.settled(bump, "powerCycle: 1")
	if n := r.resets(bump); n != 1 {
		t.Errorf("%s: %d resets after the fix, want 1", bump, n)
	}
	r.waitFor("3 hypervisors deployed", time.Minute, func(s state.Snapshot) bool { return deployedBy(s, "hypervisor") == 3 })
}

// TestReadmeOnlyCommitIsNoop: a commit that changes only
// README.md is fetched but is no new revision: no NewRevision event, the
// same desired inventory, nothing planned, no BMC call that writes.
func TestReadmeOnlyCommitIsNoop(t *testing.T) {
	r := startRig(t, rigOptions{})
	r.steady()
	before := r.run.Reconciler.Desired()
	seq := r.lastSeq()
	for _, m := range r.lab.Machines() {
		r.lab.BMC(m.Name).ClearRequests()
	}
	id := r.commit("docs only", func(dir string) {
		if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte("# Simulated site\n\nOnly the docs changed.\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for !r.seenByController(id) {
		if time.Now().After(deadline) {
			t.Fatalf("the controller never fetched %s", id)
		}
		time.Sleep(50 * time.Millisecond)
	}
	res := r.run.Reconciler.Pass(context.Background())
	if after := r.run.Reconciler.Desired(); after != before {
		t.Errorf("desired inventory replaced: digest %s → %s", before.Digest, after.Digest)
	}
	if len(res.Steps) != 0 || len(res.Held) != 0 {
		t.Errorf("README commit planned steps %v held %v", res.Steps, res.Held)
	}
	evs, err := r.run.Store.Events(state.EventQuery{After: seq, Limit: state.MaxPageSize})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if strings.HasPrefix(string(e.Kind), "inventory.") || strings.HasPrefix(string(e.Kind), "action.") || e.To != "" {
			t.Errorf("event after a README-only commit: %+v", e)
		}
	}
	// Status commits trail the store by up to the status interval: wait
	// for the one that names the revision (the digest is unchanged, so it
	// is the same revision the fleet was built from).
	r.waitStatus("status/inventory.yaml", before.Digest)
	for _, m := range r.lab.Machines() {
		if w := r.bmcWrites(m.Name); len(w) != 0 {
			t.Errorf("%s got BMC writes after a README-only commit: %v", m.Name, w)
		}
	}
}

// TestRestartMidCommissioning: the controller is stopped while a
// machine runs its commissioning in the ramdisk and started again on the
// same state file, work folder and address. Every server ends ready or
// failed with its reason (a test that could not reach the stopped
// controller, reported once it is back; or the commissioning deadline),
// powered off, and a recommission brings it back: none is left
// commissioning or with an action in flight.
func TestRestartMidCommissioning(t *testing.T) {
	r := startRig(t, rigOptions{plan: plan.Options{CommissionTimeout: 8 * time.Second}})
	caught := r.firstInPhase(sim.PhaseCommissioning, "commissioning")
	r.stopController()
	snap, err := r.run.Store.Snapshot()
	if err == nil {
		t.Logf("stopped with %d commissioning", count(snap, state.LifecycleCommissioning))
	}
	stoppedCommissioning := map[string]bool{}
	r.startController()
	snap, err = r.run.Store.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range snap.Servers {
		if s.Lifecycle == state.LifecycleCommissioning {
			stoppedCommissioning[name] = true
		}
	}
	switch lc := record(snap, caught).Lifecycle; lc {
	case state.LifecycleCommissioning, state.LifecycleReady, state.LifecycleFailed:
	default:
		t.Errorf("%s was commissioning at the stop; after restart it is %s", caught, lc)
	}
	t.Logf("caught %s commissioning; %d servers commissioning at restart", caught, len(stoppedCommissioning))

	snap = r.waitFor("every server ready or failed, none in flight", time.Minute, func(s state.Snapshot) bool {
		for name, srv := range s.Servers {
			if name == "r3-n03" {
				continue
			}
			if srv.InFlight != nil || (srv.Lifecycle != state.LifecycleReady && srv.Lifecycle != state.LifecycleFailed &&
				srv.Lifecycle != state.LifecycleAllocated && srv.Lifecycle != state.LifecycleDeploying && srv.Lifecycle != state.LifecycleDeployed) {
				return false
			}
		}
		return true
	})
	var failed []string
	for name, s := range snap.Servers {
		if s.Lifecycle != state.LifecycleFailed {
			continue
		}
		failed = append(failed, name)
		// Failed cleanly: by the deadline, or by its report (delivered
		// after the restart) of a test that could not reach the stopped
		// controller.
		if !strings.Contains(s.LastError, "no commissioning report") && !strings.Contains(s.LastError, "test failed") {
			t.Errorf("%s failed without a reason: %q; events %v", name, s.LastError, r.events(name, 0))
		}
		if m := r.lab.Machine(name); m.Phase() != sim.PhaseOff {
			t.Errorf("%s failed but its machine is %s, not off", name, m.Phase())
		}
	}
	t.Logf("after restart: failed cleanly %v", failed)
	if len(failed) > 0 {
		r.commit("recommission after the restart", func(dir string) {
			for _, name := range failed {
				r.setActions(dir, name, inventory.Actions{Commission: 1})
			}
		})
	}
	r.steady()
}

// deployedBy counts the servers deployed (and finished) with profile.
func deployedBy(s state.Snapshot, profile string) int {
	n := 0
	for _, srv := range s.Servers {
		if srv.Lifecycle == state.LifecycleDeployed && !srv.FinishDeploy && srv.Allocation != nil && srv.Allocation.Profile == profile {
			n++
		}
	}
	return n
}

// TestSecretSetUnstalls: a server whose servers.yaml names a credential
// that is not in the secret store stalls on its first BMC action (the
// power-cycle counter here) and, once the operator sets that secret through
// the admin API, is retried without any change to its desired state: the
// cycle runs exactly once and a server.unstalled event says why.
func TestSecretSetUnstalls(t *testing.T) {
	r := startRig(t, rigOptions{})
	r.steady()
	const name = "r3-n01" // zone-c: stays ready
	r.lab.BMC(name).ClearRequests()
	r.commit("r3-n01: own credential, power-cycle", func(dir string) {
		r.editBlock(dir, inventory.ServersFile, name, func(b string) string {
			return strings.Replace(b, "credentials: bmc-redfish", "credentials: bmc-r3n01", 1)
		})
		r.setActions(dir, name, inventory.Actions{PowerCycle: 1})
	})
	srv := r.waitServer(name, "stalled on the missing credential", time.Minute, func(s state.Server) bool {
		return s.Stalled != "" && s.BMC.Credentials == "bmc-r3n01"
	})
	if !strings.Contains(srv.LastError, "bmc-r3n01") || srv.Actions["powerCycle"] != 0 {
		t.Fatalf("stalled server: last error %q, actions %v", srv.LastError, srv.Actions)
	}
	if n := r.resets(name); n != 0 {
		t.Fatalf("%d resets before the credential exists", n)
	}
	seq := r.lastSeq()
	user, pass := r.lab.Credentials()
	if code, body := r.admin(http.MethodPut, "/api/v1/secrets/bmc-r3n01", map[string]string{"username": user, "password": pass}); code != http.StatusOK {
		t.Fatalf("PUT secret: %d %s", code, body)
	}
	srv = r.waitServer(name, "powerCycle observed after the secret was set", time.Minute, func(s state.Server) bool { return s.Actions["powerCycle"] == 1 })
	if srv.Stalled != "" {
		t.Errorf("still stalled: %q", srv.Stalled)
	}
	if n := r.resets(name); n != 1 {
		t.Errorf("%d resets, want exactly 1: %v", n, r.bmcWrites(name))
	}
	found := false
	for _, e := range r.events(name, seq) {
		found = found || e.Kind == state.EventUnstalled
	}
	if !found {
		t.Errorf("no %s event for %s", state.EventUnstalled, name)
	}
}

// TestRefusedCredentialDeployResumes: a deploy whose BMC login is refused
// after the server moved to deploying stalls without booting it; setting
// the secret again resumes that deploy (the journaled action), which then
// boots, writes the image and finishes, well before the deploy deadline.
// Before, the journal was dropped on the stall, the plan has no deploy step
// for a deploying server, and the server sat in deploying for an hour.
func TestRefusedCredentialDeployResumes(t *testing.T) {
	r := startRig(t, rigOptions{})
	snap := r.steady()
	for n := range snap.Servers {
		r.lab.BMC(n).ClearRequests()
	}
	user, pass := r.lab.Credentials()
	// Every BMC here is bmcsim Redfish, the IPMI servers' too (RedfishOnly),
	// under the two credential names of the inventory.
	secrets := []string{"bmc-redfish", "bmc-ipmi"}
	for _, sec := range secrets {
		if code, body := r.admin(http.MethodPut, "/api/v1/secrets/"+sec, map[string]string{"username": user, "password": "not-" + pass}); code != http.StatusOK {
			t.Fatalf("PUT wrong secret %s: %d %s", sec, code, body)
		}
	}
	deployed := 0
	for _, s := range snap.Servers {
		if s.Allocation != nil && s.Allocation.Profile == "hypervisor" {
			deployed++
		}
	}
	r.commit("one more hypervisor", func(dir string) { r.setCount(dir, "hypervisor", deployed+1) })
	var name string
	r.waitFor("a hypervisor deploy stalled on the refused login", time.Minute, func(s state.Snapshot) bool {
		for n, srv := range s.Servers {
			if srv.Lifecycle == state.LifecycleDeploying && srv.Stalled != "" {
				name = n
				return true
			}
		}
		return false
	})
	srv, _ := r.run.Store.Server(name)
	if !strings.Contains(srv.LastError, "401") && !strings.Contains(srv.LastError, "authentication") {
		t.Errorf("%s stalled with %q, want the refused login", name, srv.LastError)
	}
	if srv.InFlight == nil || srv.InFlight.Action != string(plan.ActDeploy) {
		t.Fatalf("%s lost its journal on the stall: %+v", name, srv.InFlight)
	}
	if n := r.resets(name); n != 0 {
		t.Fatalf("%s was reset %d times with a refused credential", name, n)
	}
	for _, sec := range secrets {
		if code, body := r.admin(http.MethodPut, "/api/v1/secrets/"+sec, map[string]string{"username": user, "password": pass}); code != http.StatusOK {
			t.Fatalf("PUT secret %s: %d %s", sec, code, body)
		}
	}
	// The finish-deploy step clears FinishDeploy in its own transaction and
	// the action's journal in the next one (reconciler/actions.go), so the
	// wait is for both: a journal that never clears times the wait out.
	srv = r.waitServer(name, "deployed after the secret was fixed, its journal cleared", time.Minute, func(s state.Server) bool {
		return s.Lifecycle == state.LifecycleDeployed && !s.FinishDeploy && s.InFlight == nil
	})
	if srv.Stalled != "" {
		t.Errorf("%s deployed but stalled %q", name, srv.Stalled)
	}
	if r.lab.Machine(name).Phase() != sim.PhaseOS {
		r.waitFor(name+" booted its OS", time.Minute, func(state.Snapshot) bool { return r.lab.Machine(name).Phase() == sim.PhaseOS })
	}
}

// TestRenameAdoptsRecord: renaming a server in servers.yaml moves its
// record (lifecycle, hardware, history) to the new name instead of
// registering a second server with the same boot MAC, and the machine
// then answers to the new name: a commission counter on it boots the
// ramdisk (whose iPXE script names the new server) back to ready.
func TestRenameAdoptsRecord(t *testing.T) {
	r := startRig(t, rigOptions{})
	snap := r.steady()
	const from, to = "r3-n01", "r3-n11" // zone-c: stays ready
	before := record(snap, from)
	if before.Lifecycle != state.LifecycleReady || before.Hardware == nil {
		t.Fatalf("%s is %s (hardware %v), want ready and commissioned", from, before.Lifecycle, before.Hardware != nil)
	}
	rename := func(dir string) {
		p := filepath.Join(dir, inventory.ServersFile)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		old := "- name: " + from + "\n"
		if strings.Count(string(b), old) != 1 {
			t.Fatalf("servers.yaml has %d %q", strings.Count(string(b), old), old)
		}
		if err := os.WriteFile(p, []byte(strings.Replace(string(b), old, "- name: "+to+"\n", 1)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r.commit("rename "+from+" to "+to, rename)
	got := r.waitFor(from+" adopted as "+to, time.Minute, func(s state.Snapshot) bool {
		_, old := s.Servers[from]
		_, renamed := s.Servers[to]
		return renamed && !old
	}).Servers[to]
	if got.Lifecycle != state.LifecycleReady || got.BootMAC != before.BootMAC || got.Hardware == nil || got.Hardware.Serial != before.Hardware.Serial {
		t.Errorf("%s after the rename: %s, MAC %s, hardware %+v; want the record of %s", to, got.Lifecycle, got.BootMAC, got.Hardware, from)
	}
	seq := r.lastSeq()
	r.commit("recommission "+to, func(dir string) { r.setActions(dir, to, inventory.Actions{Commission: 1}) })
	r.waitServer(to, "recommissioned under its new name", time.Minute, func(s state.Server) bool {
		return s.Actions["commission"] == 1 && s.Lifecycle == state.LifecycleReady
	})
	commissioned := false
	for _, e := range r.events(to, seq) {
		commissioned = commissioned || e.Kind == state.EventTransition && e.To == state.LifecycleCommissioning
	}
	if !commissioned {
		t.Errorf("%s never went through commissioning", to)
	}
}
