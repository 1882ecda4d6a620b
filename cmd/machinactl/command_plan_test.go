package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"

	inventoryexample "github.com/machina-metal/machina/inventory-example"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// statusFixture is a status tree committed by the real controller over the
// simulated example site (TestVerbsAgainstController -write-status-fixture):
// 11 servers commissioned, hypervisor ×2 and storage ×1 deployed, r3-n03
// new (want: retired, never commissioned).
const statusFixture = "testdata/plan/status"

// fixedNow is the plan clock in golden tests.
var fixedNow = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// planRepo is a Git repository holding the example inventory and the
// status fixture (commit base), and the sample change on top (commit head):
// profiles.yaml raises hypervisor's count from 2 to 3. Commit times are
// fixed, so the hashes are stable.
type planRepo struct {
	dir        string
	repo       *git.Repository
	base, head plumbing.Hash
}

func newPlanRepo(t *testing.T) *planRepo {
	t.Helper()
	dir := t.TempDir()
	repo, err := git.PlainInit(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range inventoryFiles {
		data, err := fs.ReadFile(inventoryexample.FS, name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.CopyFS(filepath.Join(dir, "status"), os.DirFS(statusFixture)); err != nil {
		t.Fatal(err)
	}
	r := &planRepo{dir: dir, repo: repo}
	r.base = r.commit(t, "example site with status", 0)
	editFile(t, filepath.Join(dir, "profiles.yaml"), "count: 2", "count: 3")
	r.head = r.commit(t, "hypervisor: count 3", 1)
	return r
}

func (r *planRepo) commit(t *testing.T, msg string, n int) plumbing.Hash {
	t.Helper()
	wt, err := r.repo.Worktree()
	if err != nil {
		t.Fatal(err)
	}
	if err := wt.AddGlob("."); err != nil {
		t.Fatal(err)
	}
	sig := &object.Signature{Name: "op", Email: "op@example.invalid", When: time.Date(2026, 1, 1, 0, n, 0, 0, time.UTC)}
	h, err := wt.Commit(msg, &git.CommitOptions{Author: sig, Committer: sig})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func runPlan(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	old := planNow
	planNow = func() time.Time { return fixedNow }
	t.Cleanup(func() { planNow = old })
	t.Setenv(envAPI, "")
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"plan"}, args...), strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", "plan", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update)", err)
	}
	if got != string(want) {
		t.Errorf("%s: got\n%s\nwant\n%s", name, got, want)
	}
}

// TestPlanGolden plans the sample change (hypervisor count 2 → 3) merged
// into the base against the status tree committed at the base: one more
// zone-a server allocated and deployed; exit code 1.
func TestPlanGolden(t *testing.T) {
	r := newPlanRepo(t)
	for _, c := range []struct{ format, golden string }{
		{"text", "sample-change.txt.golden"},
		{"json", "sample-change.json.golden"},
		{"markdown", "sample-change.md.golden"},
	} {
		t.Run(c.format, func(t *testing.T) {
			code, out, errOut := runPlan(t, "--repo", r.dir, "--base", r.base.String(), "--format", c.format)
			if code != 1 {
				t.Fatalf("exit %d, want 1 (changes); stderr %q", code, errOut)
			}
			checkGolden(t, c.golden, out)
		})
	}
	// A revision expression names the same base.
	if code, out, errOut := runPlan(t, "--repo", r.dir, "--base", "HEAD~1"); code != 1 {
		t.Errorf("--base HEAD~1: exit %d, stderr %q", code, errOut)
	} else {
		checkGolden(t, "sample-change.txt.golden", out)
	}
	// The JSON names the planned steps.
	_, out, _ := runPlan(t, "--repo", r.dir, "--base", r.base.String(), "--format", "json")
	var rep planReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Steps) != 2 || rep.Steps[0].Action != "allocate" || rep.Steps[1].Action != "deploy" || rep.Steps[0].Profile != "hypervisor" ||
		rep.Base != r.base.String() || rep.Head != r.head.String() || !rep.Changes || rep.Observed != "status" || rep.Servers != 12 {
		t.Errorf("report %+v", rep)
	}
}

func TestPlanModes(t *testing.T) {
	r := newPlanRepo(t)

	t.Run("working tree with --observed status folder", func(t *testing.T) {
		code, out, errOut := runPlan(t, "--repo", r.dir, "--observed", statusFixture)
		if code != 1 || !strings.Contains(out, "(working tree)") || !strings.Contains(out, "allocate") {
			t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
		}
	})
	t.Run("working tree with --observed repository", func(t *testing.T) {
		code, out, errOut := runPlan(t, "--repo", r.dir, "--observed", r.dir)
		if code != 1 || !strings.Contains(out, "12 servers observed from the status tree") {
			t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
		}
	})
	t.Run("uncommitted edit is ignored with --base", func(t *testing.T) {
		p := filepath.Join(r.dir, "profiles.yaml")
		editFile(t, p, "count: 3", "count: 4")
		defer editFile(t, p, "count: 4", "count: 3")
		_, withBase, _ := runPlan(t, "--repo", r.dir, "--base", r.base.String())
		_, tree, _ := runPlan(t, "--repo", r.dir)
		if strings.Count(withBase, " allocate ") != 1 || strings.Count(tree, " allocate ") != 2 {
			t.Errorf("with --base:\n%s\nworking tree:\n%s", withBase, tree)
		}
	})
	t.Run("HEAD does not contain base: exit 2; base is HEAD: exit 0", func(t *testing.T) {
		wt, _ := r.repo.Worktree()
		if err := wt.Checkout(&git.CheckoutOptions{Hash: r.base}); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := wt.Checkout(&git.CheckoutOptions{Hash: r.head}); err != nil {
				t.Fatal(err)
			}
		}()
		code, _, errOut := runPlan(t, "--repo", r.dir, "--base", r.head.String())
		if code != 2 || !strings.Contains(errOut, "does not contain --base") {
			t.Errorf("exit %d, stderr %q", code, errOut)
		}
		// HEAD is the base itself: the base's inventory against its own
		// status, no changes, exit 0.
		code, out, errOut := runPlan(t, "--repo", r.dir, "--base", "HEAD")
		if code != 0 || !strings.Contains(out, "no changes") {
			t.Errorf("base is HEAD: exit %d, stdout %q, stderr %q", code, out, errOut)
		}
	})
	t.Run("--repo is a folder inside the repository", func(t *testing.T) {
		dir := t.TempDir()
		repo, err := git.PlainInit(dir, false)
		if err != nil {
			t.Fatal(err)
		}
		site := filepath.Join(dir, "sites", "lab1")
		if err := os.CopyFS(site, os.DirFS(r.dir)); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(filepath.Join(site, ".git")); err != nil {
			t.Fatal(err)
		}
		editFile(t, filepath.Join(site, "profiles.yaml"), "count: 3", "count: 2")
		sub := &planRepo{dir: dir, repo: repo}
		sub.commit(t, "base", 0)
		editFile(t, filepath.Join(site, "profiles.yaml"), "count: 2", "count: 3")
		sub.commit(t, "change", 1)
		code, out, errOut := runPlan(t, "--repo", site, "--base", "HEAD~1")
		if code != 1 || !strings.Contains(out, "allocate       r1-n04") || !strings.Contains(out, "observed from the status tree") {
			t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
		}
	})
	t.Run("safety brake: held steps shown, exit 1", func(t *testing.T) {
		p := filepath.Join(r.dir, "profiles.yaml")
		editFile(t, p, "count: 1", "count: 0")
		defer editFile(t, p, "count: 0", "count: 1")
		code, out, errOut := runPlan(t, "--repo", r.dir, "--observed", statusFixture)
		if code != 1 || !strings.Contains(out, "HELD: held until approved (machinactl approve ") ||
			!strings.Contains(out, "release        r2-n03") || !strings.Contains(out, "profile storage from 1 deployed server to zero") {
			t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
		}
		_, md, _ := runPlan(t, "--repo", r.dir, "--observed", statusFixture, "--format", "markdown")
		if !strings.Contains(md, "| **held** release | `r2-n03` |") || !strings.Contains(md, "**Safety brake:**") {
			t.Errorf("markdown:\n%s", md)
		}
		if code, _, _ := runPlan(t, "--repo", r.dir, "--observed", statusFixture, "--brake-share", "2"); code != 2 {
			t.Errorf("--brake-share 2: exit %d, want 2", code)
		}
	})
	t.Run("invalid inventory: exit 2 with file:line", func(t *testing.T) {
		p := filepath.Join(r.dir, "servers.yaml")
		editFile(t, p, "zone: zone-a", "zone: 17")
		defer editFile(t, p, "zone: 17", "zone: zone-a")
		code, _, errOut := runPlan(t, "--repo", r.dir)
		if code != 2 || !strings.Contains(errOut, "servers.yaml:") {
			t.Errorf("exit %d, stderr %q", code, errOut)
		}
	})
	t.Run("no observed state: exit 2", func(t *testing.T) {
		dir := t.TempDir()
		for _, name := range inventoryFiles {
			data, _ := os.ReadFile(filepath.Join(r.dir, name))
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		code, _, errOut := runPlan(t, "--repo", dir)
		if code != 2 || !strings.Contains(errOut, "no observed state") {
			t.Errorf("exit %d, stderr %q", code, errOut)
		}
	})
	t.Run("bad format: exit 2", func(t *testing.T) {
		if code, _, _ := runPlan(t, "--repo", r.dir, "--format", "yaml"); code != 2 {
			t.Errorf("exit %d", code)
		}
	})
}

// TestPlanMarkdownSplit: a plan larger than one comment is split into
// parts, each under the limit, separated by MarkdownPartSeparator.
func TestPlanMarkdownSplit(t *testing.T) {
	r := newPlanRepo(t)
	// Every server new: empty status tree → 12 register steps.
	empty := t.TempDir()
	if err := os.MkdirAll(filepath.Join(empty, "servers"), 0o755); err != nil {
		t.Fatal(err)
	}
	const limit = 700
	code, out, errOut := runPlan(t, "--repo", r.dir, "--observed", empty, "--format", "markdown", "--max-comment-bytes", "700")
	if code != 1 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	parts := strings.Split(out, MarkdownPartSeparator+"\n")
	if len(parts) < 2 {
		t.Fatalf("%d parts, want several:\n%s", len(parts), out)
	}
	rows := 0
	for i, p := range parts {
		if len(p) > limit {
			t.Errorf("part %d is %d bytes, limit %d", i+1, len(p), limit)
		}
		if !strings.HasPrefix(p, "### Machina plan\n") {
			t.Errorf("part %d does not start with the heading: %q", i+1, p)
		}
		rows += strings.Count(p, "| register |")
	}
	if rows != 12 {
		t.Errorf("%d register rows over all parts, want 12", rows)
	}
}

// TestParseStatusServer reads a status file the writer renders back into
// the fields the plan needs.
func TestParseStatusServer(t *testing.T) {
	data := []byte(`# Written by the Machina controller from what it observed; do not edit by hand.
name: r1-n02
lifecycle: deployed
power: powered_on
profile: hypervisor
allocation: count
hardware:
  vendor: Dell Inc.
  arch: arm64
  smbiosArch: arm64
  cores: 16
  memoryGiB: 64
  disks:
    - name: nvme0n1
      sizeGiB: 480
conditions:
  - type: Stalled
    status: "True"
    reason: ActionFailed
    message: "not retried"
    lastTransitionTime: "2026-11-29T10:00:00Z"
observedActions:
  commission: 2
  powerCycle: 0
  powerOn: 0
  powerOff: 0
lastError: "deploy: boom"
events:
  - time: null
    type: Warning
`)
	s, err := parseStatusServer(data, fixedNow)
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "r1-n02" || s.Lifecycle != state.LifecycleDeployed || s.Allocation == nil || s.Allocation.Profile != "hypervisor" ||
		s.Allocation.Reason != "count" || s.Hardware.Cores != 16 || s.Hardware.Arch != "arm64" || s.Hardware.SMBIOSArch != "arm64" || s.Hardware.MemoryBytes != 64<<30 || s.Hardware.Disks[0].SizeBytes != 480<<30 ||
		s.Actions["commission"] != 2 || len(s.Actions) != 1 || s.Stalled == "" || s.LastError != "deploy: boom" || !s.LifecycleAt.Equal(fixedNow) {
		t.Errorf("parsed %+v", s)
	}
	for name, bad := range map[string]string{
		"unknown field":     "name: a\nlifecycle: ready\nbogus: 1\n",
		"unknown lifecycle": "name: a\nlifecycle: flying\n",
		"no name":           "lifecycle: ready\n",
		"negative counter":  "name: a\nlifecycle: ready\nobservedActions:\n  commission: -1\n",
		"huge memory":       "name: a\nlifecycle: ready\nhardware:\n  memoryGiB: 99999999999999\n",
	} {
		if _, err := parseStatusServer([]byte(bad), fixedNow); err == nil {
			t.Errorf("%s: parsed without error", name)
		}
	}
}

// FuzzParseStatusServer: status files come from a Git repository anyone
// with push access can edit; parsing must not panic.
func FuzzParseStatusServer(f *testing.F) {
	f.Add([]byte("name: a\nlifecycle: ready\nhardware:\n  disks:\n    - {sizeGiB: 1}\n"))
	f.Add([]byte("name: b\nlifecycle: deployed\nprofile: p\nallocation: count\nobservedActions: {commission: 1}\nconditions:\n- {type: Stalled, status: \"True\"}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 64<<10 {
			return
		}
		s, err := parseStatusServer(data, fixedNow)
		if err == nil && (s.Name == "" || !s.Lifecycle.Valid()) {
			t.Errorf("accepted %q as %+v", data, s)
		}
	})
}

// TestPlanHeaderCounts checks the summary line's nouns: "1 server", "1
// step" (it said "1 servers", "1 steps").
func TestPlanHeaderCounts(t *testing.T) {
	r := planReport{Inventory: "sha256:2be4aadd8c93aabbccdd", Observed: "status", Servers: 1,
		Result: plan.Result{Steps: []plan.Step{{Server: "r1-n01", Action: "commission"}}}}
	want := "Plan for inventory 2be4aadd8c93 (working tree) against 1 server observed from the status tree: 1 step."
	if got := planHeader(r, ""); got != want {
		t.Errorf("planHeader = %q, want %q", got, want)
	}
	r.Servers, r.Steps = 3, append(r.Steps, plan.Step{Server: "r1-n02", Action: "commission"})
	want = "Plan for inventory 2be4aadd8c93 (working tree) against 3 servers observed from the status tree: 2 steps."
	if got := planHeader(r, ""); got != want {
		t.Errorf("planHeader = %q, want %q", got, want)
	}
}
