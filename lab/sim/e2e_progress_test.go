package sim_test

import (
	"encoding/json"
	"github.com/machina-metal/machina/gitops"
	"net/http"
	"strings"
	"testing"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// progressTarget is the server these tests deploy on its own: zone-c, no
// profile deploys it in the example, and it fits the gpu profile.
const progressTarget = "r3-n01"

// progressSilentAfter is the tests' --machine-silent-after: short, so a
// throttled 4 MiB image takes several times longer to write.
const progressSilentAfter = 3 * time.Second

// startProgressRig settles the example site with the default silent-after
// (commissioning a whole lab on a loaded machine can pause longer than
// progressSilentAfter), then restarts the controller with
// progressSilentAfter and shapes progressTarget's image downloads.
func startProgressRig(t *testing.T, shape func(*sim.Machine)) *rig {
	t.Helper()
	r := startRig(t, rigOptions{})
	r.steady()
	r.stopController()
	r.plan.SilentAfter = progressSilentAfter
	r.startController()
	shape(r.lab.Machine(progressTarget))
	return r
}

// pinToGPU commits progressTarget as wanted deployed with profile gpu.
func (r *rig) pinToGPU() {
	r.t.Helper()
	r.commit("deploy "+progressTarget+" as gpu", func(dir string) {
		r.setServer(dir, progressTarget, "want", "deployed")
		r.setServer(dir, progressTarget, "profile", "gpu")
	})
}

// TestLongImageWriteNotRenetbooted: a deploy whose image download and
// write take several times --machine-silent-after (a 4 MiB image at
// 400 KiB/s, about 10 s, against 3 s) completes without a re-netboot: the
// ramdisk's progress reports, whose bytes move, count as hearing from the
// machine. Meanwhile the progress shows in the API's server view and in
// the status commit. Before progress reports, only the image GET's start
// counted, and the machine was network-booted again mid-write, each time.
func TestLongImageWriteNotRenetbooted(t *testing.T) {
	r := startProgressRig(t, func(m *sim.Machine) { m.ThrottleImages(400 << 10) })
	r.pinToGPU()
	r.waitMachine(r.lab.Machine(progressTarget), sim.PhaseDeploying)

	// The API's server view carries the running deploy's progress, and the
	// status commit has it in tens of percent.
	var seen v1.ServerProgress
	deadline := time.Now().Add(time.Minute)
	for seen.BytesDone == 0 && time.Now().Before(deadline) {
		code, body := r.admin(http.MethodGet, "/api/v1/servers/"+progressTarget, nil)
		var s v1.Server
		if code != http.StatusOK || json.Unmarshal(body, &s) != nil {
			t.Fatalf("GET /api/v1/servers/%s: %d %s", progressTarget, code, body)
		}
		if s.Progress != nil {
			seen = *s.Progress
		}
		if s.Lifecycle != string(state.LifecycleDeploying) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if seen.Step != v1.StepImageDownload || seen.BytesDone == 0 || seen.BytesTotal != 4<<20 || seen.BytesDone > seen.BytesTotal {
		t.Errorf("API progress while deploying %+v, want image-download of 4 MiB under way", seen)
	} else {
		r.waitStatus(gitops.ServerStatusPath(progressTarget), `progress: "image-download `, `% of 4 MiB"`)
	}

	srv := r.waitServer(progressTarget, "deployed", 2*time.Minute, func(s state.Server) bool {
		return s.Lifecycle == state.LifecycleDeployed && !s.FinishDeploy && s.InFlight == nil
	})
	r.waitMachine(r.lab.Machine(progressTarget), sim.PhaseOS)
	var deploying, deployed time.Time
	renetboots := 0
	for _, e := range r.events(progressTarget, 0) {
		switch {
		case e.To == state.LifecycleDeploying:
			deploying = e.At
		case e.To == state.LifecycleDeployed:
			deployed = e.At
		case e.Kind == "machine.renetboot":
			renetboots++
			t.Errorf("re-netbooted mid-deploy: %s", e.Message)
		}
	}
	took := deployed.Sub(deploying)
	t.Logf("deploy took %s against a silent-after of %s; %d re-netboots; last progress %+v", took.Round(100*time.Millisecond), progressSilentAfter, renetboots, srv.Progress)
	if took < 2*progressSilentAfter {
		t.Fatalf("the deploy took %s, not longer than twice the silent-after %s: the throttle did not hold, the test proves nothing", took, progressSilentAfter)
	}
	if srv.Renetboots != 0 {
		t.Errorf("Renetboots = %d, want 0", srv.Renetboots)
	}
	if srv.Progress == nil || srv.Progress.BytesTotal != 4<<20 {
		t.Errorf("no progress stored: %+v", srv.Progress)
	}
}

// TestStalledImageWriteRenetbooted: a deploy whose image download stops
// after 1 MiB while the ramdisk goes on reporting progress (the same
// bytes every interval) is still taken for silent: it is network-booted
// again after --machine-silent-after, and the re-netboot says the progress
// stalled. With the link fixed, the next boot's deploy completes.
func TestStalledImageWriteRenetbooted(t *testing.T) {
	r := startProgressRig(t, func(m *sim.Machine) { m.StallImages(1 << 20) })
	r.pinToGPU()
	srv := r.waitServer(progressTarget, "re-netbooted", 2*time.Minute, func(s state.Server) bool { return s.Renetboots >= 1 })
	// The renetboot's event follows the record's move.
	var why string
	for deadline := time.Now().Add(time.Minute); why == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for _, e := range r.events(progressTarget, 0) {
			if e.Kind == "machine.renetboot" && why == "" {
				why = e.Message
			}
		}
	}
	t.Logf("re-netboot: %s", why)
	if !strings.Contains(why, "stalled at image-download 1048576 of 4194304 bytes") {
		t.Errorf("re-netboot says %q, want it to name the stalled progress (image-download 1048576 of 4194304 bytes)", why)
	}
	if srv.Lifecycle != state.LifecycleDeploying {
		t.Errorf("%s is %s after the re-netboot, want deploying", progressTarget, srv.Lifecycle)
	}
	r.lab.Machine(progressTarget).StallImages(-1)
	r.waitServer(progressTarget, "deployed after the link is fixed", 2*time.Minute, func(s state.Server) bool {
		return s.Lifecycle == state.LifecycleDeployed && !s.FinishDeploy && s.InFlight == nil
	})
	r.waitMachine(r.lab.Machine(progressTarget), sim.PhaseOS)
}

// TestFailingFinishDeployShownAndReleaseWaits: a BMC that refuses the boot
// override of the finish-deploy (503 to every PATCH of the system, as a
// BMC busy with a firmware task or a stuck Redfish service answers) keeps
// the action failing with backoff. From the second failure in a row the
// plan (admin API), the status commit and machinactl status (its plan
// conditions) show a Failing condition naming the action, the count, the
// next retry time and the last error; a release asked for in Git then
// shows a Waiting condition naming the action it waits for. With the BMC
// fixed, the finish-deploy succeeds and the release runs. Before, the
// status showed nothing and the release waited silently.
func TestFailingFinishDeployShownAndReleaseWaits(t *testing.T) {
	r := startRig(t, rigOptions{})
	r.steady()
	m := r.lab.Machine(progressTarget)
	m.ThrottleImages(1 << 20) // a 4 s write: room to inject the fault after the PXE override
	r.pinToGPU()
	r.waitMachine(m, sim.PhaseDeploying)
	r.lab.BMC(progressTarget).Inject(bmcsim.Fault{Method: http.MethodPatch, Kind: bmcsim.FaultUnavailable})
	r.waitServer(progressTarget, "finish-deploy failed twice", 2*time.Minute, func(s state.Server) bool {
		return s.Lifecycle == state.LifecycleDeployed && s.FinishDeploy && s.Failures >= plan.FailingAfter
	})
	failing := r.waitCondition(plan.CondFailing, plan.ReasonActionFailing, "finish-deploy failed ", " times in a row; next retry at ", "last error: finish-deploy: ")
	t.Logf("Failing: %s", failing)
	r.waitStatus(gitops.ServerStatusPath(progressTarget), "type: Failing", "reason: ActionFailing", "finish-deploy failed")

	r.commit("release "+progressTarget, func(dir string) { r.setServer(dir, progressTarget, "want", "ready") })
	// The release brings profile gpu to zero: the safety brake holds it
	// until the operator approves the revision, as machinactl approve does.
	rev := r.waitBrake()
	if code, body := r.admin(http.MethodPost, "/api/v1/approve", v1.ApproveRequest{Revision: rev}); code != http.StatusOK {
		t.Fatalf("approve %s: %d %s", rev, code, body)
	}
	waiting := r.waitCondition("Waiting", plan.ReasonBehindAction, "release waits for finish-deploy in flight, failing (", "next retry at ")
	t.Logf("Waiting: %s", waiting)
	r.waitStatus(gitops.ServerStatusPath(progressTarget), "reason: BehindAction", "release waits for finish-deploy")
	if s, _ := r.run.Store.Server(progressTarget); s.Lifecycle != state.LifecycleDeployed {
		t.Errorf("%s is %s while its finish-deploy fails, want deployed", progressTarget, s.Lifecycle)
	}

	r.lab.BMC(progressTarget).ClearFaults()
	r.waitServer(progressTarget, "released", 2*time.Minute, func(s state.Server) bool {
		return s.Lifecycle == state.LifecycleReady && !s.FinishDeploy && s.Failures == 0
	})
	r.waitFor("no Failing condition", time.Minute, func(state.Snapshot) bool {
		for _, c := range r.run.Reconciler.LastPlan().Conditions {
			if c.Subject == "server/"+progressTarget && (c.Type == plan.CondFailing || c.Reason == plan.ReasonBehindAction) {
				return false
			}
		}
		return true
	})
}

// waitBrake waits until the acting plan holds steps behind the safety
// brake and returns the revision to approve (the brake's message names
// it: "machinactl approve REV").
func (r *rig) waitBrake() string {
	r.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, after, ok := strings.Cut(r.run.Reconciler.LastPlan().Brake, "machinactl approve "); ok && len(after) >= 12 {
			return after[:12]
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("no safety brake in the plan: %s", r.run.Reconciler.LastPlan().Text())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitCondition waits until the admin API's plan (GET /api/v1/plan, what
// machinactl status lists) has a condition of progressTarget with typ and
// reason whose message contains every one of texts, and returns the
// message.
func (r *rig) waitCondition(typ, reason string, texts ...string) string {
	r.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		code, body := r.admin(http.MethodGet, "/api/v1/plan", nil)
		var res plan.Result
		if code == http.StatusOK && json.Unmarshal(body, &res) == nil {
			for _, c := range res.Conditions {
				if c.Subject == "server/"+progressTarget && c.Type == typ && c.Reason == reason && containsAll(c.Message, texts) {
					return c.Message
				}
			}
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("no %s/%s condition of %s containing %q in the plan: %d %s", typ, reason, progressTarget, texts, code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestStalledImageRetriesReportedNotSilent: a deploy whose image download
// stops after 1 MiB on every attempt, with the agent's stall timeout
// (300 ms) well inside --machine-silent-after (3 s), is never taken for
// silent: each retry reaches the controller as progress naming the
// download, the stall and the retry (stored on the server, shown by the
// API), and once no retry may start within the silent-after less a
// progress interval (2 s) the agent reports the failure, which the server
// records (failed, LastError naming the download, the stall and the
// attempts) with no re-netboot. Before, the agent retried 20 times
// unheard (the same bytes every attempt) and the controller re-netbooted
// it as silent, never learning why.
func TestStalledImageRetriesReportedNotSilent(t *testing.T) {
	r := startProgressRig(t, func(m *sim.Machine) {
		m.StallImages(1 << 20)
		m.SetStallTimeout(300 * time.Millisecond)
	})
	r.pinToGPU()
	var retry string
	srv := r.waitServer(progressTarget, "deploy failed", 2*time.Minute, func(s state.Server) bool {
		if p := s.Progress; p != nil && p.Retry != "" && retry == "" {
			retry = p.Retry // the first retry the controller stored that this poll saw
		}
		return s.Lifecycle == state.LifecycleFailed || s.Renetboots > 0
	})
	t.Logf("retry seen: %q; last error: %s", retry, srv.LastError)
	if srv.Renetboots != 0 || srv.Lifecycle != state.LifecycleFailed {
		t.Fatalf("%s: %s after %d re-netboots, want failed by the agent's report and none", progressTarget, srv.Lifecycle, srv.Renetboots)
	}
	if !strings.HasPrefix(retry, "image download: controller request stalled for 300ms, retry ") || !strings.Contains(retry, " of 19 in ") {
		t.Errorf("retry seen on the server %q, want a retry of the stalled download", retry)
	}
	for _, want := range []string{"image download: gave up after", "no attempt starts later than 2s after the first", "stalled: no bytes received for 300ms"} {
		if !strings.Contains(srv.LastError, want) {
			t.Errorf("LastError %q does not name %q", srv.LastError, want)
		}
	}
	for _, e := range r.events(progressTarget, 0) {
		if e.Kind == "machine.renetboot" {
			t.Errorf("re-netboot event: %s", e.Message)
		}
	}
}
