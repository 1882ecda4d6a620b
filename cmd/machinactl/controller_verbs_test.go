package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/machina-metal/machina/controller"
	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/lab/sim/simtest"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// writeStatusFixture, when set, copies the status tree the controller
// committed in TestVerbsAgainstController into that folder (how
// testdata/plan/status was made).
var writeStatusFixture = flag.String("write-status-fixture", "", "copy the simulated lab's committed status/ tree to this folder")

// ctlHarness is the simulated lab (lab/sim) with the whole controller
// running in-process through controller.Run, as lab/sim's end-to-end test
// starts it, plus an admin token for machinactl.
type ctlHarness struct {
	t     *testing.T
	lab   *sim.Lab
	run   *controller.Running
	token string
}

func startController(t *testing.T) *ctlHarness {
	t.Helper()
	return startControllerWith(t, nil)
}

// startControllerWith is startController with edit applied to the
// controller's Config before it starts.
func startControllerWith(t *testing.T, edit func(*controller.Config)) *ctlHarness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	lab, err := sim.Start(ctx, sim.Config{Dir: filepath.Join(dir, "lab"), Logger: log.With("lab", "sim")})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	h := &ctlHarness{t: t, lab: lab}
	cfg := simtest.Config(dir, lab, log.With("lab", "controller"))
	cfg.OnReady = func(r *controller.Running) {
		if err := simtest.PutLabSecrets(r.Store, lab); err != nil {
			t.Error(err)
		}
		tok, _, err := r.Store.CreateAdminToken("ops", state.ActorLocal)
		if err != nil {
			t.Errorf("admin token: %v", err)
		}
		h.token = tok
		lab.SetController(r.URL)
	}
	if edit != nil {
		edit(&cfg)
	}
	c, err := simtest.Start(cfg)
	if err != nil {
		cancel()
		lab.Close()
		t.Fatal(err)
	}
	h.run = c.Run
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("controller: %v", err)
		}
		cancel()
		lab.Close()
	})
	return h
}

// waitFor polls the store until cond holds or d passes.
func (h *ctlHarness) waitFor(what string, d time.Duration, cond func(state.Snapshot) bool) state.Snapshot {
	h.t.Helper()
	deadline := time.Now().Add(d)
	for {
		snap, err := h.run.Store.Snapshot()
		if err != nil {
			h.t.Fatal(err)
		}
		if cond(snap) {
			return snap
		}
		if time.Now().After(deadline) {
			var lines []string
			for name, s := range snap.Servers {
				lines = append(lines, fmt.Sprintf("%s=%s(%s)", name, s.Lifecycle, s.LastError))
			}
			h.t.Fatalf("timed out after %s waiting for %s; servers: %s\nplan:\n%s", d, what, strings.Join(lines, " "), h.run.Reconciler.LastPlan().Text())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitPlanIdle waits until the reconciler's newest pass planned no step:
// the store can reach a steady state a pass before the plan says so.
func (h *ctlHarness) waitPlanIdle(d time.Duration) {
	h.t.Helper()
	deadline := time.Now().Add(d)
	for {
		p := h.run.Reconciler.LastPlan()
		if len(p.Steps) == 0 {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("plan still has steps after %s:\n%s", d, p.Text())
		}
		h.run.Reconciler.Trigger()
		time.Sleep(50 * time.Millisecond)
	}
}

// ctl runs machinactl with the harness's API and token.
func (h *ctlHarness) ctl(args ...string) (code int, stdout, stderr string) {
	h.t.Helper()
	h.t.Setenv(envToken, h.token)
	h.t.Setenv(envAPI, h.run.URL)
	var out, errb bytes.Buffer
	code = run(context.Background(), args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

// pull brings the operator's clone up to date with the controller's status commits.
func (h *ctlHarness) pull() {
	h.t.Helper()
	// The clone holds nothing unpushed here: fetch and move to the
	// remote's tip (what a pull does), with the git CLI as an operator has.
	var out []byte
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		if out, err = h.git("fetch", "-q", "origin"); err == nil {
			if out, err = h.git("reset", "-q", "--hard", "origin/main"); err == nil {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.t.Fatalf("pull: %v\n%s", err, out)
}

// git runs the git CLI in the operator's clone.
func (h *ctlHarness) git(args ...string) ([]byte, error) {
	cmd := exec.Command("git", append([]string{"-C", h.lab.Clone, "-c", "user.name=op", "-c", "user.email=op@sim.invalid"}, args...)...)
	return cmd.CombinedOutput()
}

// push pulls, applies edit to the clone, commits and pushes; when the
// controller's status push lands in between, the whole step is retried on
// the new tip.
func (h *ctlHarness) push(msg string, edit func()) {
	h.t.Helper()
	var out []byte
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		h.pull()
		edit()
		if out, err = h.git("commit", "-qam", msg); err != nil {
			h.t.Fatalf("commit: %v\n%s", err, out)
		}
		if out, err = h.git("push", "-q", "origin", "HEAD:main"); err == nil {
			h.run.Source.Trigger()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.t.Fatalf("push: %v\n%s", err, out)
}

// waitStatusTree pulls the clone until the status tree the controller
// committed shows every server in the lifecycle and allocation the store
// has (the status writer commits on its own interval).
func (h *ctlHarness) waitStatusTree(d time.Duration) {
	h.t.Helper()
	deadline := time.Now().Add(d)
	for {
		h.pull()
		want, err := h.run.Store.Snapshot()
		if err != nil {
			h.t.Fatal(err)
		}
		got, err := snapshotFromStatus(os.DirFS(h.lab.Clone), "status", nil, time.Now())
		if err == nil && sameFleet(want, got) {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("status tree did not catch up within %s (last error %v)", d, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func sameFleet(a, b state.Snapshot) bool {
	if len(a.Servers) != len(b.Servers) {
		return false
	}
	for name, x := range a.Servers {
		y, ok := b.Servers[name]
		if !ok || x.Lifecycle != y.Lifecycle || (x.Allocation == nil) != (y.Allocation == nil) {
			return false
		}
		if x.Allocation != nil && (x.Allocation.Profile != y.Allocation.Profile || x.Allocation.Reason != y.Allocation.Reason) {
			return false
		}
	}
	return true
}

func lifecycleCount(snap state.Snapshot, lc state.Lifecycle) int {
	n := 0
	for _, s := range snap.Servers {
		if s.Lifecycle == lc {
			n++
		}
	}
	return n
}

func steady(s state.Snapshot) bool {
	deployed := 0
	for _, srv := range s.Servers {
		switch {
		case srv.Lifecycle == state.LifecycleDeployed && !srv.FinishDeploy:
			deployed++
		case srv.Lifecycle == state.LifecycleReady:
		case srv.Name == "r3-n03" && srv.Lifecycle == state.LifecycleNew: // want: retired, never commissioned
		default:
			return false
		}
	}
	return deployed == 3 && len(s.Servers) == 12
}

func editFile(t *testing.T, path, old, new string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(old)) {
		t.Fatalf("%s does not contain %q", path, old)
	}
	if err := os.WriteFile(path, bytes.Replace(b, []byte(old), []byte(new), 1), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestVerbsAgainstController runs plan, status, provision and approve
// against the whole controller (controller.Run) over the simulated lab of
// the example site: bmcsim BMCs and machines running the real agent.
func TestVerbsAgainstController(t *testing.T) {
	peertest.Slow(t, "simulated lab end to end")
	h := startController(t)
	h.waitFor("11 servers ready or deployed, 3 deployed", 3*time.Minute, steady)
	h.waitPlanIdle(time.Minute)

	// status: counts, inventory, unsealed secrets (no master key here).
	code, out, errOut := h.ctl("status")
	if code != 0 {
		t.Fatalf("status: exit %d: %s", code, errOut)
	}
	t.Logf("machinactl status:\n%s", out)
	for _, want := range []string{"Inventory:  valid, acting on commit", "Servers:    12: 1 new, 8 ready, 3 deployed",
		"Secrets:    UNSEALED", "Plan:       nothing pending", "Attention:  no failed, stalled or waiting servers, no unreadable BMCs"} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}

	// images list asks the controller (it read a local store
	// directory and showed nothing of the controller's images).
	code, out, errOut = h.ctl("images", "list")
	if code != 0 || !strings.Contains(out, "Images of the controller at "+h.run.URL) ||
		!regexp.MustCompile(`(?m)^ubuntu-24\.04\s+yes\s+verified\s+\S+ \S+\s+sha256:`).MatchString(out) {
		t.Errorf("images list: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// GET /api/v1/inventory speaks the API's camelCase, conditions [] not null.
	req, _ := http.NewRequest(http.MethodGet, h.run.URL+"/api/v1/inventory", nil)
	req.Header.Set("Authorization", "Bearer "+h.token)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		var raw map[string]json.RawMessage
		err := json.NewDecoder(resp.Body).Decode(&raw)
		resp.Body.Close()
		if err != nil || !strings.Contains(string(raw["good"]), `"commit":"`) || string(raw["conditions"]) != "[]" || raw["Good"] != nil {
			t.Errorf("GET /api/v1/inventory: %v %s", err, raw)
		}
	}

	// plan of the unchanged working tree against the API: no changes, exit 0.
	// (The status writer commits on its own; Running.FlushStatus is not
	// used because it races with the writer's loop on the same go-git
	// repository under -race.)
	h.waitStatusTree(time.Minute)
	code, out, errOut = h.ctl("plan", "--repo", h.lab.Clone)
	if code != 0 || !strings.Contains(out, "no changes") {
		t.Fatalf("plan unchanged: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	// The sample change, uncommitted: hypervisor count 2 → 3.
	profiles := filepath.Join(h.lab.Clone, "profiles.yaml")
	editFile(t, profiles, "count: 2", "count: 3")
	code, apiJSON, errOut := h.ctl("plan", "--repo", h.lab.Clone, "--format", "json")
	if code != 1 {
		t.Fatalf("plan change via API: exit %d, want 1; stderr %q", code, errOut)
	}
	var fromAPI planReport
	if err := json.Unmarshal([]byte(apiJSON), &fromAPI); err != nil {
		t.Fatal(err)
	}
	if len(fromAPI.Steps) != 2 || fromAPI.Steps[0].Action != plan.ActAllocate || fromAPI.Steps[1].Action != plan.ActDeploy ||
		fromAPI.Steps[0].Profile != "hypervisor" || fromAPI.Observed != "api" || fromAPI.Servers != 12 {
		t.Fatalf("plan via API = %+v, want allocate+deploy of one hypervisor", fromAPI)
	}
	// The same change planned against the status tree the controller
	// committed (flushed and pulled above) gives the same steps: the status parser reads what the
	// status writer writes.
	code, statusJSON, errOut := h.ctl("plan", "--repo", h.lab.Clone, "--observed", filepath.Join(h.lab.Clone, "status"), "--format", "json")
	if code != 1 {
		t.Fatalf("plan change via status: exit %d, want 1; stderr %q", code, errOut)
	}
	var fromStatus planReport
	if err := json.Unmarshal([]byte(statusJSON), &fromStatus); err != nil {
		t.Fatal(err)
	}
	// Actions in flight are the controller's memory, not its status tree:
	// a server whose BMC call is being retried (a slow ipmi_sim under
	// load) has a BehindAction condition in the API's plan only.
	fromAPI.Result.Conditions = slices.DeleteFunc(fromAPI.Result.Conditions, func(c plan.Condition) bool { return c.Reason == plan.ReasonBehindAction })
	if len(fromAPI.Result.Conditions) == 0 {
		fromAPI.Result.Conditions = nil
	}
	if diff := cmp.Diff(fromAPI.Result, fromStatus.Result); diff != "" || fromStatus.Observed != "status" || fromStatus.Servers != 12 {
		t.Errorf("plan from status tree differs from plan from API (-api +status):\n%s", diff)
	}
	if *writeStatusFixture != "" {
		if err := os.CopyFS(*writeStatusFixture, os.DirFS(filepath.Join(h.lab.Clone, "status"))); err != nil {
			t.Fatal(err)
		}
	}
	editFile(t, profiles, "count: 3", "count: 2")

	// provision (`machinactl provision hypervisor 2`): two more
	// hypervisors, both named in the answer and both deployed.
	code, out, errOut = h.ctl("provision", "hypervisor", "2")
	if code != 0 {
		t.Fatalf("provision: exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "allocated 2 servers to profile hypervisor") || lines[1] == lines[2] {
		t.Fatalf("provision output %q", out)
	}
	names := lines[1:]
	h.waitFor(strings.Join(names, " and ")+" deployed by provision", 3*time.Minute, func(s state.Snapshot) bool {
		for _, name := range names {
			srv := record(s, name)
			if srv.Lifecycle != state.LifecycleDeployed || srv.FinishDeploy || srv.Allocation == nil ||
				srv.Allocation.Reason != plan.ReasonProvision || srv.Allocation.Profile != "hypervisor" || srv.Zone != "zone-a" {
				return false
			}
		}
		return true
	})
	// Not enough capacity: a clear message, exit 1, nothing allocated.
	before, _ := h.run.Store.Snapshot()
	code, out, errOut = h.ctl("provision", "hypervisor", "50")
	if code != 1 || !strings.Contains(errOut, "not enough capacity, nothing allocated") {
		t.Fatalf("provision 50: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	after, _ := h.run.Store.Snapshot()
	if a, b := lifecycleCount(before, state.LifecycleReady), lifecycleCount(after, state.LifecycleReady); a != b {
		t.Errorf("ready servers %d → %d after a refused provision", a, b)
	}

	// Safety brake: storage's count to zero brings the profile from 1
	// deployed server to zero, so the release is held until approved.
	h.push("storage: count 0", func() { editFile(t, profiles, "count: 1", "count: 0") })
	var brake string
	deadline := time.Now().Add(time.Minute)
	for brake == "" {
		if time.Now().After(deadline) {
			t.Fatalf("no held plan; plan:\n%s", h.run.Reconciler.LastPlan().Text())
		}
		if p := h.run.Reconciler.LastPlan(); p.Brake != "" {
			brake = p.Brake
		}
		time.Sleep(50 * time.Millisecond)
	}
	code, out, _ = h.ctl("status")
	t.Logf("machinactl status with a held plan:\n%s", out)
	if code != 0 || !strings.Contains(out, "HELD:       1 step:") {
		t.Errorf("status does not show the held plan:\n%s", out)
	}
	h.pull()
	code, out, errOut = h.ctl("plan", "--repo", h.lab.Clone)
	if code != 1 || !strings.Contains(out, "HELD: held until approved") || !strings.Contains(out, "release") {
		t.Errorf("plan of the held revision: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	rev := regexp.MustCompile(`machinactl approve ([0-9a-f]{12})`).FindStringSubmatch(brake)
	if rev == nil {
		t.Fatalf("brake %q names no revision", brake)
	}
	if code, _, errOut := h.ctl("approve", "NOT-HEX"); code != 2 || !strings.Contains(errOut, "hex digits") {
		t.Errorf("approve NOT-HEX: exit %d, %q", code, errOut)
	}
	// The acting commit id instead of the digest: refused, naming the digest.
	good, _ := h.run.Source.Latest()
	if code, _, errOut := h.ctl("approve", good.Commit[:12]); code != 2 || !strings.Contains(errOut, "is a commit id, not an inventory digest") || !strings.Contains(errOut, rev[1]) {
		t.Errorf("approve of a commit id: exit %d, %q", code, errOut)
	}
	// A digest that matches no held plan (a typo was recorded
	// and exited 0): exit 1, naming the held revision, nothing recorded.
	code, out, errOut = h.ctl("approve", "0123456789ab")
	if code != 1 || !strings.Contains(errOut, "matches no held plan") || !strings.Contains(errOut, "held: inventory revision "+rev[1]) {
		t.Errorf("approve of another revision: exit %d, %q %q", code, out, errOut)
	}
	if list, err := h.run.Store.Approvals(); err != nil || len(list) != 0 {
		t.Errorf("approvals after the refused approve: %v, %v; want none", list, err)
	}
	// plan reads the approvals from the API: that one does not cover
	// this revision, so the plan is still held.
	if code, out, errOut := h.ctl("plan", "--repo", h.lab.Clone); code != 1 || !strings.Contains(out, "HELD: held until approved") {
		t.Errorf("plan after an approval of another revision: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, errOut = h.ctl("approve", rev[1])
	if code != 0 || !regexp.MustCompile(`approved the held plan of inventory revision `+rev[1]+`: (1 held step runs|[1-9][0-9]* held steps run) now`).MatchString(out) {
		t.Fatalf("approve: exit %d, %q %q", code, out, errOut)
	}
	h.waitFor("storage server released after approval", 3*time.Minute, func(s state.Snapshot) bool {
		for _, srv := range s.Servers {
			if srv.Allocation != nil && srv.Allocation.Profile == "storage" {
				return false
			}
		}
		return true
	})
	evs, err := h.run.Store.Events(state.EventQuery{})
	if err != nil {
		t.Fatal(err)
	}
	audited := false
	for _, e := range evs {
		if e.Kind == state.EventApproval && e.Actor == "ops" && strings.Contains(e.Message, rev[1]) {
			audited = true
		}
	}
	if !audited {
		t.Error("no approval event by ops")
	}
}

// record is name's record in s, or a zero record when s has none yet;
// read-only.
func record(s state.Snapshot, name string) *state.Server {
	if srv, ok := s.Servers[name]; ok {
		return srv
	}
	return &state.Server{Name: name}
}
