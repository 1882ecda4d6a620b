package sim_test

import (
	"encoding/binary"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// holding returns the servers holding a count allocation of profile in
// any active lifecycle, sorted.
func holding(s state.Snapshot, profile, reason string) []string {
	var out []string
	for name, srv := range s.Servers {
		if srv.Allocation != nil && srv.Allocation.Profile == profile && srv.Allocation.Reason == reason {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// TestProfileCountUpAndDown: raising hypervisor's count from 2
// to 4 deploys two more zone-a servers through the real agent; lowering it
// to 2 releases the two newest (deployed → ready, powered off), within the
// safety brake's 20% of 12 servers; the controller then PXE-boots each into
// the ramdisk's wipe mode, the real agent wipes the disk's partition table
// and signatures, reports, powers off, and NeedsWipe is cleared.
func TestProfileCountUpAndDown(t *testing.T) {
	r := startRig(t, rigOptions{})
	first := r.steady()
	orig := holding(first, "hypervisor", plan.ReasonCount)
	if len(orig) != 2 {
		t.Fatalf("hypervisor holds %v, want 2 servers", orig)
	}

	r.commit("hypervisor count 4", func(dir string) { r.setCount(dir, "hypervisor", 4) })
	snap := r.waitFor("4 hypervisors deployed", time.Minute, func(s state.Snapshot) bool { return deployedBy(s, "hypervisor") == 4 })
	four := holding(snap, "hypervisor", plan.ReasonCount)
	if len(four) != 4 {
		t.Fatalf("hypervisor holds %v, want 4", four)
	}
	var added []string
	for _, name := range four {
		srv := record(snap, name)
		if srv.Zone != "zone-a" || srv.Lifecycle != state.LifecycleDeployed {
			t.Errorf("%s: zone %s lifecycle %s, want zone-a deployed", name, srv.Zone, srv.Lifecycle)
		}
		if !slices.Contains(orig, name) {
			added = append(added, name)
		}
		r.waitMachine(r.lab.Machine(name), sim.PhaseOS)
	}
	if len(added) != 2 {
		t.Fatalf("added %v, want 2 new servers", added)
	}
	// Deployed means the boot override went back to disk: the Redfish
	// BMCs (IPMI ones run in ipmi_sim) now hold Hdd, not the deploy's Pxe.
	checked := 0
	for _, name := range four {
		target, enabled, ok := r.bootOverride(name)
		if !ok {
			continue
		}
		checked++
		if target != "Hdd" || (enabled != "Continuous" && enabled != "Once") {
			t.Errorf("%s deployed, but its BMC's boot override is %s/%s, want Hdd (Continuous, or Once where the BMC has no persistent override)", name, target, enabled)
		}
	}
	if checked == 0 {
		t.Fatalf("no Redfish BMC among the deployed %v: the boot override check proves nothing", four)
	}
	r.waitStatus(gitops.ServerStatusPath(added[0]), "lifecycle: deployed")
	// The deployed disks hold the image's MBR, its partition and the
	// NoCloud seed's FAT filesystem.
	parts := map[string][][2]int64{}
	for _, name := range added {
		parts[name] = diskLabels(t, r.lab.Machine(name).DiskPath("sda"), true)
	}
	seq := r.lastSeq()

	r.commit("hypervisor count 2", func(dir string) { r.setCount(dir, "hypervisor", 2) })
	snap = r.waitFor("2 hypervisors released and wiped", time.Minute, func(s state.Snapshot) bool {
		for _, name := range added {
			if srv := record(s, name); srv.Lifecycle != state.LifecycleReady || srv.NeedsWipe || !srv.WipeStartedAt.IsZero() {
				return false
			}
		}
		return deployedBy(s, "hypervisor") == 2
	})
	if got := holding(snap, "hypervisor", plan.ReasonCount); !slices.Equal(got, orig) {
		t.Errorf("after lowering, hypervisor holds %v, want the first two %v", got, orig)
	}
	for _, name := range added {
		srv := record(snap, name)
		if srv.Allocation != nil || srv.NeedsWipe || srv.WipeFailures != 0 || srv.Power.State != state.PowerOff {
			t.Errorf("%s released: allocation %v, needsWipe %v, wipe failures %d, power %s; want none, false, 0, off",
				name, srv.Allocation, srv.NeedsWipe, srv.WipeFailures, srv.Power.State)
		}
		r.waitMachine(r.lab.Machine(name), sim.PhaseOff)
		r.waitStatus(gitops.ServerStatusPath(name), "lifecycle: ready")
		// The ramdisk wiped the partition table and every signature.
		disk := r.lab.Machine(name).DiskPath("sda")
		if left := diskLabels(t, disk, false); len(left) != 0 {
			t.Errorf("%s: partition table still readable after the wipe: %v", name, left)
		}
		for _, p := range parts[name] {
			if sig := probeSignature(t, disk, p[0]); sig != "" {
				t.Errorf("%s: signature at byte %d survived the wipe: %s", name, p[0], sig)
			}
		}
		var kinds []string
		for _, e := range r.events(name, seq) {
			kinds = append(kinds, string(e.Kind))
		}
		if !slices.Contains(kinds, "wipe.done") {
			t.Errorf("%s: no wipe.done event after release: %v", name, kinds)
		}
		if !slices.Contains(kinds, string(state.EventHostForgotten)) {
			t.Errorf("%s: no %s event after release: %v", name, state.EventHostForgotten, kinds)
		}
		// The host that ran on it is no longer listed as joined, and its
		// node certificate is forgotten (the join listener refuses it).
		hosts := 0
		for _, h := range snap.Hosts {
			if h.Server != name {
				continue
			}
			hosts++
			if h.JoinStatus != state.HostReleased || h.CertFingerprint != "" {
				t.Errorf("host %s on released %s: join status %q, fingerprint %q; want released and none", h.Name, name, h.JoinStatus, h.CertFingerprint)
			}
		}
		if hosts == 0 {
			t.Errorf("no host record for %s (it joined when deployed)", name)
		}
		r.waitStatus("status/hosts/"+name+".yaml", "released")
	}
	if res := r.run.Reconciler.LastPlan(); len(res.Held) != 0 {
		t.Errorf("lowering by 2 of 12 was held: %s", res.Brake)
	}
}

// TestRetireAndUnretire: want: retired on a deployed server
// powers it off through its BMC and retires it; the profile's count is
// topped up by another server; want: ready again brings it back through
// new → commissioning → ready.
func TestRetireAndUnretire(t *testing.T) {
	r := startRig(t, rigOptions{})
	snap := r.steady()
	name := holding(snap, "hypervisor", plan.ReasonCount)[0]
	m := r.lab.Machine(name)
	if m.Phase() != sim.PhaseOS {
		t.Fatalf("%s is %s, want running its OS", name, m.Phase())
	}
	r.lab.BMC(name).ClearRequests()

	r.commit("retire "+name, func(dir string) { r.setServer(dir, name, "want", "retired") })
	srv := r.waitServer(name, "retired", time.Minute, func(s state.Server) bool { return s.Lifecycle == state.LifecycleRetired && s.InFlight == nil })
	if m.Phase() != sim.PhaseOff {
		t.Errorf("%s retired but its machine is %s", name, m.Phase())
	}
	if srv.Power.State != state.PowerOff || srv.Allocation != nil {
		t.Errorf("%s: power %s allocation %v, want off and none", name, srv.Power.State, srv.Allocation)
	}
	if n := r.resets(name); n != 1 {
		t.Errorf("%s: %d power actions, want 1 (off): %v", name, n, r.bmcWrites(name))
	}
	r.waitStatus(gitops.ServerStatusPath(name), "lifecycle: retired")
	r.waitFor("hypervisor topped up to 2", time.Minute, func(s state.Snapshot) bool { return deployedBy(s, "hypervisor") == 2 })

	seq := r.lastSeq()
	r.commit("unretire "+name, func(dir string) { r.setServer(dir, name, "want", "ready") })
	r.waitServer(name, "commissioned again", time.Minute, func(s state.Server) bool { return s.Lifecycle == state.LifecycleReady })
	// The way back is retired → new, then commissioning as for a new server.
	var moves []string
	for _, e := range r.events(name, seq) {
		if e.Kind == state.EventTransition {
			moves = append(moves, string(e.From)+"→"+string(e.To))
		}
	}
	if want := []string{"retired→new", "new→commissioning", "commissioning→ready"}; len(moves) < len(want) || !slices.Equal(moves[:len(want)], want) {
		t.Errorf("%s unretired through %v, want %v", name, moves, want)
	}
}

// TestDeletedServerOrphaned: a server deleted from servers.yaml
// is left as it is: same lifecycle, no BMC write, flagged Orphaned in
// status/servers/XX/NAME.yaml (gitops.ServerStatusPath).
func TestDeletedServerOrphaned(t *testing.T) {
	r := startRig(t, rigOptions{})
	before := r.steady()
	const name = "r3-n02"
	r.lab.BMC(name).ClearRequests()
	r.commit("delete "+name, func(dir string) { r.editBlock(dir, inventory.ServersFile, name, func(string) string { return "" }) })
	body := r.waitStatus(gitops.ServerStatusPath(name), "Orphaned")
	if !strings.Contains(body, "lifecycle: ready") || !strings.Contains(body, "reason: NotInInventory") {
		t.Errorf("%s:\n%s", gitops.ServerStatusPath(name), body)
	}
	r.settled(name, "Orphaned")
	srv, err := r.run.Store.Server(name)
	if err != nil {
		t.Fatal(err)
	}
	if srv.Lifecycle != record(before, name).Lifecycle || srv.Power.State != record(before, name).Power.State {
		t.Errorf("%s changed: %s/%s → %s/%s", name, record(before, name).Lifecycle, record(before, name).Power.State, srv.Lifecycle, srv.Power.State)
	}
	if w := r.bmcWrites(name); len(w) != 0 {
		t.Errorf("orphan %s got BMC writes %v", name, w)
	}
	if p := r.lab.Machine(name).Phase(); p != sim.PhaseOff {
		t.Errorf("orphan %s machine is %s", name, p)
	}
}

// TestSafetyBrakeHoldsMassRetire: a revision retiring 6 of the
// 12 servers is held: nothing retired, no BMC write, the hold visible in
// the plan (admin API) and in status/inventory.yaml; after POST
// /api/v1/approve of the revision, all six are powered off and retired.
func TestSafetyBrakeHoldsMassRetire(t *testing.T) {
	r := startRig(t, rigOptions{})
	snap := r.steady()
	var victims []string
	for _, name := range []string{"r1-n01", "r1-n02", "r1-n03", "r1-n04", "r1-n05", "r2-n01", "r2-n02", "r2-n03", "r2-n04", "r3-n01", "r3-n02"} {
		if record(snap, name).Lifecycle == state.LifecycleReady && len(victims) < 6 {
			victims = append(victims, name)
		}
	}
	if len(victims) != 6 {
		t.Fatalf("only %d ready servers", len(victims))
	}
	for _, v := range victims {
		r.lab.BMC(v).ClearRequests()
	}
	r.commit("retire half the fleet", func(dir string) {
		for _, v := range victims {
			r.setServer(dir, v, "want", "retired")
		}
	})
	r.waitFor("retirements held", time.Minute, func(state.Snapshot) bool { return len(r.run.Reconciler.LastPlan().Held) == 6 })
	digest := r.run.Reconciler.Desired().Digest
	code, body := r.admin(http.MethodGet, "/api/v1/plan", nil)
	var res plan.Result
	if code != http.StatusOK || json.Unmarshal(body, &res) != nil {
		t.Fatalf("GET /api/v1/plan: %d %s", code, body)
	}
	if len(res.Held) != 6 || !strings.Contains(res.Brake, "retire 6 of 12") {
		t.Errorf("plan: held %v brake %q", res.Held, res.Brake)
	}
	for _, h := range res.Held {
		if h.Action != plan.ActRetire || !slices.Contains(victims, h.Server) {
			t.Errorf("held step %v", h)
		}
	}
	inv := r.waitStatus("status/inventory.yaml", "held:")
	if !strings.Contains(inv, strings.TrimPrefix(digest, "sha256:")[:12]) || !strings.Contains(inv, "retire") {
		t.Errorf("status/inventory.yaml does not show the hold:\n%s", inv)
	}
	snap, err := r.run.Store.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range victims {
		if record(snap, v).Lifecycle != state.LifecycleReady {
			t.Errorf("%s is %s while held", v, record(snap, v).Lifecycle)
		}
		if w := r.bmcWrites(v); len(w) != 0 {
			t.Errorf("%s got BMC writes while held: %v", v, w)
		}
	}

	code, body = r.admin(http.MethodPost, "/api/v1/approve", v1.ApproveRequest{Revision: strings.TrimPrefix(digest, "sha256:")[:12]})
	if code != http.StatusOK {
		t.Fatalf("approve: %d %s", code, body)
	}
	r.waitFor("6 retired", time.Minute, func(s state.Snapshot) bool { return count(s, state.LifecycleRetired) == 6 })
	for _, v := range victims {
		r.waitMachine(r.lab.Machine(v), sim.PhaseOff)
		r.waitStatus(gitops.ServerStatusPath(v), "lifecycle: retired")
	}
	r.waitStatus("status/inventory.yaml", "valid: true")
	if inv, _ := readHead(r.lab.RepoURL, "status/inventory.yaml"); strings.Contains(inv, "held:") {
		t.Errorf("hold still shown after approval:\n%s", inv)
	}
}

// TestProvisionAPI: POST /api/v1/provision {"profile":
// "hypervisor","count":2} answers two server names that both reach
// deployed; asking for more than fit answers 409 and allocates nothing.
func TestProvisionAPI(t *testing.T) {
	r := startRig(t, rigOptions{})
	r.steady()
	code, body := r.admin(http.MethodPost, "/api/v1/provision", v1.ProvisionRequest{Profile: "hypervisor", Count: 2})
	var resp v1.ProvisionResponse
	if code != http.StatusOK || json.Unmarshal(body, &resp) != nil || len(resp.Servers) != 2 {
		t.Fatalf("provision: %d %s", code, body)
	}
	snap := r.waitFor("provisioned servers deployed", time.Minute, func(s state.Snapshot) bool {
		for _, name := range resp.Servers {
			if srv := record(s, name); srv.Lifecycle != state.LifecycleDeployed || srv.FinishDeploy {
				return false
			}
		}
		return true
	})
	for _, name := range resp.Servers {
		srv := record(snap, name)
		if srv.Allocation == nil || srv.Allocation.Profile != "hypervisor" || srv.Allocation.Reason != plan.ReasonProvision || srv.Zone != "zone-a" {
			t.Errorf("%s: allocation %+v zone %s", name, srv.Allocation, srv.Zone)
		}
		r.waitMachine(r.lab.Machine(name), sim.PhaseOS)
		r.waitStatus(gitops.ServerStatusPath(name), "allocation: provision")
	}
	if n := deployedBy(snap, "hypervisor"); n != 4 {
		t.Errorf("%d hypervisors deployed, want 2 by count + 2 provisioned", n)
	}

	// zone-a has 5 servers: 4 are deployed, one is left; ask for 2.
	before, err := r.run.Store.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	code, body = r.admin(http.MethodPost, "/api/v1/provision", v1.ProvisionRequest{Profile: "hypervisor", Count: 2})
	if code != http.StatusConflict || !strings.Contains(string(body), "insufficient_capacity") {
		t.Errorf("provision beyond capacity: %d %s, want 409 insufficient_capacity", code, body)
	}
	after, err := r.run.Store.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range after.Servers {
		b := record(before, name)
		if s.Lifecycle != b.Lifecycle || (s.Allocation == nil) != (b.Allocation == nil) {
			t.Errorf("%s changed by a refused provision: %s → %s", name, b.Lifecycle, s.Lifecycle)
		}
	}
	if n := count(after, state.LifecycleAllocated); n != 0 {
		t.Errorf("%d servers allocated after a refused provision", n)
	}
}

// diskLabels reads the MBR of a simulated disk file and returns its
// partitions as [start, end) byte ranges; must says the table must be there
// (with at least the image's partition and the seed's).
func diskLabels(t *testing.T, path string, must bool) [][2]int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mbr := make([]byte, 512)
	if _, err := f.ReadAt(mbr, 0); err != nil {
		t.Fatal(err)
	}
	if mbr[510] != 0x55 || mbr[511] != 0xAA {
		if must {
			t.Fatalf("%s has no MBR before the release", path)
		}
		return nil
	}
	var out [][2]int64
	for i := 0; i < 4; i++ {
		e := mbr[446+16*i : 446+16*(i+1)]
		if e[4] == 0 {
			continue
		}
		start, n := int64(binary.LittleEndian.Uint32(e[8:])), int64(binary.LittleEndian.Uint32(e[12:]))
		out = append(out, [2]int64{start * 512, (start + n) * 512})
	}
	if must && len(out) < 2 {
		t.Fatalf("%s: %d partitions before the release, want the image's and the seed's", path, len(out))
	}
	if must && probeSignature(t, path, out[len(out)-1][0]) == "" {
		t.Fatalf("%s: the seed partition has no filesystem signature before the release; the test proves nothing", path)
	}
	return out
}

// probeSignature asks util-linux's blkid for a filesystem or RAID signature
// at byte off of the disk file; "" when none.
func probeSignature(t *testing.T, path string, off int64) string {
	t.Helper()
	peertest.Command(t, "blkid")
	out, _ := exec.Command("blkid", "-p", "-O", strconv.FormatInt(off, 10), "-o", "export", path).Output()
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "TYPE=") || strings.HasPrefix(l, "PTTYPE=") {
			return strings.TrimSpace(string(out))
		}
	}
	return ""
}

// TestReleaseWipeFailureRetried: a release wipe that fails (the
// released machine's disk cannot be opened) is never silent: the wipe.failed
// event and LastError carry the agent's reason, status shows WipeFailed,
// the server is not allocated meanwhile, and the wipe is retried after the
// backoff; once the disk is back the retry wipes it and NeedsWipe clears.
func TestReleaseWipeFailureRetried(t *testing.T) {
	r := startRig(t, rigOptions{plan: plan.Options{WipeRetryBase: 2 * time.Second, WipeRetryCap: 4 * time.Second}})
	snap := r.steady()
	held := holding(snap, "hypervisor", plan.ReasonCount)
	sort.Slice(held, func(i, j int) bool { // the plan's release order: newest first, then name descending
		a, b := snap.Servers[held[i]].Allocation.At, record(snap, held[j]).Allocation.At
		if !a.Equal(b) {
			return a.After(b)
		}
		return held[i] > held[j]
	})
	victim := held[0] // the newest count allocation is released first
	if len(held) != 2 {
		t.Fatalf("hypervisor holds %v", held)
	}
	// Break the victim's disk: its device node is no longer a disk.
	disk := r.lab.Machine(victim).DiskPath("sda")
	if err := os.Rename(disk, disk+".away"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(disk, 0o755); err != nil {
		t.Fatal(err)
	}
	seq := r.lastSeq()
	r.commit("hypervisor count 1", func(dir string) { r.setCount(dir, "hypervisor", 1) })
	// A failure with its reason: under load the retry (2 s backoff) may
	// already have started and cleared LastError when the store is read;
	// the retry fails the same way and records it again.
	srv := r.waitServer(victim, "wipe failed", time.Minute, func(s state.Server) bool { return s.WipeFailures >= 1 && s.LastError != "" })
	if !srv.NeedsWipe || srv.Lifecycle != state.LifecycleReady || !strings.Contains(srv.LastError, "release wipe failed") || !strings.Contains(srv.LastError, "sda") {
		t.Errorf("%s after a failed wipe: lifecycle %s needsWipe %v lastError %q", victim, srv.Lifecycle, srv.NeedsWipe, srv.LastError)
	}
	// The condition, not the wipe.failed event (rendered with reason
	// WipeFailed too, and committed a pass before the plan's condition).
	body := r.waitStatus(gitops.ServerStatusPath(victim), "type: WipeFailed", "reason: ReleaseWipeFailed")
	if !strings.Contains(body, "ReleaseWipeFailed") {
		t.Errorf("%s:\n%s", gitops.ServerStatusPath(victim), body)
	}
	var kinds []string
	for _, e := range r.events(victim, seq) {
		kinds = append(kinds, string(e.Kind))
	}
	if !slices.Contains(kinds, "wipe.failed") {
		t.Errorf("no wipe.failed event: %v", kinds)
	}
	// Repair the disk: the retry after the backoff wipes it.
	if err := os.Remove(disk); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(disk+".away", disk); err != nil {
		t.Fatal(err)
	}
	srv = r.waitServer(victim, "wiped on retry", time.Minute, func(s state.Server) bool { return !s.NeedsWipe })
	if srv.WipeFailures != 0 || srv.LastError != "" || srv.Lifecycle != state.LifecycleReady {
		t.Errorf("%s after the retry: failures %d lastError %q lifecycle %s", victim, srv.WipeFailures, srv.LastError, srv.Lifecycle)
	}
	if left := diskLabels(t, disk, false); len(left) != 0 {
		t.Errorf("%s: partition table survived the retried wipe: %v", victim, left)
	}
	for _, e := range r.events(victim, seq) {
		if e.Kind == state.EventTransition && strings.Contains(e.Message, "allocated") {
			t.Errorf("%s was allocated while its wipe was pending: %s", victim, e.Message)
		}
	}
}
