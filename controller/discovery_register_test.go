package controller

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/go-git/go-git/v5"
	gitconfig "github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/discover"
	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// TestScanRouteRegisters: POST /api/v1/scan with register proposes the
// authenticated BMC as a servers.yaml entry through the controller's own
// clone: a validated commit on a new discovered/DATE branch of the
// inventory remote (main untouched), or with commitTo straight on main;
// a BMC the branch already has is skipped and nothing is committed; a
// proposal the inventory's validation refuses pushes nothing (422);
// register without zone, zone without register, and commitTo another
// branch are 400 before any probe.
func TestScanRouteRegisters(t *testing.T) {
	var trees bmcsim.Trees
	dir, err := bmcsim.TreeDir("", "dell-poweredge-r750-idrac9")
	if err != nil {
		t.Fatal(err)
	}
	sim, err := trees.New(dir, bmcsim.Config{Username: "root", Password: "s3cret-dell", LockoutThreshold: 3})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewTLSServer(sim)
	defer ts.Close()
	probes := 0
	loop := func(ctx context.Context, cfg discover.Config) (*discover.Report, error) {
		probes++
		cfg.AllowLoopback, cfg.Targets = true, []string{ts.Listener.Addr().String()}
		return discover.Scan(ctx, cfg)
	}
	remote := inventoryRemote(t)
	propose := scanProposers(gitops.Remote{URL: "file://" + remote}, t.TempDir(), slog.New(slog.DiscardHandler))
	c, st := newScanAPIWith(t, loop, propose, "main")
	if _, err := st.PutSecret("bmc-dell", state.Credential{Username: "root", Password: "s3cret-dell"}, "test"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	base := v1.ScanRequest{CIDR: "10.0.0.0/30", Credentials: []string{"bmc-dell"}, InsecureTLS: true}
	mainBefore := branchTip(t, remote, "main")

	for _, tc := range []struct {
		name string
		mod  func(*v1.ScanRequest)
		want string
	}{
		{"register without zone", func(r *v1.ScanRequest) { r.Register = true }, "needs zone"},
		{"zone without register", func(r *v1.ScanRequest) { r.Zone = "zone-a" }, "only go with register"},
		{"commitTo another branch", func(r *v1.ScanRequest) { r.Register, r.Zone, r.CommitTo = true, "zone-a", "prod" }, "only the inventory branch"},
	} {
		req := base
		tc.mod(&req)
		var out map[string]any
		if err := c.Scan(ctx, req, &out); !v1.IsCode(err, "bad_request") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a 400 saying %q", tc.name, err, tc.want)
		}
	}
	if probes != 0 {
		t.Fatalf("%d scans ran for refused requests", probes)
	}

	// A review branch.
	var out struct {
		discover.Report
		Registered *discover.Registered `json:"registered"`
	}
	req := base
	req.Register, req.Zone, req.Site = true, "zone-a", "lab1"
	if err := c.Scan(ctx, req, &out); err != nil {
		t.Fatal(err)
	}
	reg := out.Registered
	if reg == nil || len(out.Results) != 1 {
		t.Fatalf("answer: %+v", out)
	}
	wantBranch := "discovered/" + time.Now().UTC().Format("2006-01-02")
	if reg.Branch != wantBranch || reg.Commit == "" || len(reg.Added) != 1 || len(reg.Skipped) != 0 {
		t.Fatalf("registered %+v, want one entry on %s", reg, wantBranch)
	}
	e := reg.Added[0]
	if e.Zone != "zone-a" || e.Site != "lab1" || e.BMC.Credentials != "bmc-dell" || e.BMC.Address != out.Results[0].Address || e.BootMAC == "" {
		t.Errorf("entry %+v from result %+v", e, out.Results[0])
	}
	servers := fileAt(t, remote, reg.Branch, inventory.ServersFile)
	if !strings.Contains(servers, e.Name) || strings.Contains(servers, "s3cret") {
		t.Errorf("%s servers.yaml lacks %s or holds the password:\n%s", reg.Branch, e.Name, servers)
	}
	if got := branchTip(t, remote, "main"); got != mainBefore {
		t.Errorf("main moved %s → %s: a review proposal must not touch it", mainBefore, got)
	}
	if got := branchTip(t, remote, reg.Branch); got.String() != reg.Commit {
		t.Errorf("%s is at %s, the answer says %s", reg.Branch, got, reg.Commit)
	}
	loadBranch(t, remote, reg.Branch)

	// A zone the schema refuses: 422, nothing pushed (no second review
	// branch, main as it was).
	bad := req
	bad.Zone = "Zone A!"
	if err := c.Scan(ctx, bad, &out); !v1.IsCode(err, "invalid_proposal") || !strings.Contains(err.Error(), "zone") {
		t.Errorf("invalid zone: %v, want 422 invalid_proposal naming the zone", err)
	}
	if repo, _ := git.PlainOpen(remote); repo != nil {
		if _, err := repo.Reference(plumbing.NewBranchReferenceName(wantBranch+"-2"), true); err == nil {
			t.Errorf("an invalid proposal pushed %s-2", wantBranch)
		}
	}
	if got := branchTip(t, remote, "main"); got != mainBefore {
		t.Errorf("main moved on an invalid proposal")
	}

	// Straight onto main; then the same BMC again is skipped, nothing committed.
	req.CommitTo = "main"
	out.Registered = nil
	if err := c.Scan(ctx, req, &out); err != nil {
		t.Fatal(err)
	}
	if reg := out.Registered; reg == nil || reg.Branch != "main" || len(reg.Added) != 1 || branchTip(t, remote, "main").String() != reg.Commit {
		t.Fatalf("commitTo main: %+v", out.Registered)
	}
	tip := branchTip(t, remote, "main")
	out.Registered = nil
	if err := c.Scan(ctx, req, &out); err != nil {
		t.Fatal(err)
	}
	if reg := out.Registered; reg == nil || reg.Commit != "" || len(reg.Added) != 0 || len(reg.Skipped) != 1 || !strings.Contains(reg.Skipped[0].Reason, e.Name) {
		t.Errorf("the same BMC again: %+v", out.Registered)
	}
	if got := branchTip(t, remote, "main"); got != tip {
		t.Errorf("main moved with nothing to add")
	}

	evs, err := st.Events(state.EventQuery{Limit: state.MaxPageSize})
	if err != nil {
		t.Fatal(err)
	}
	proposed := 0
	for _, ev := range evs {
		if ev.Kind == "scan" && strings.Contains(ev.Message, "proposed on") && ev.Actor == "ops" {
			proposed++
		}
	}
	if proposed != 2 {
		t.Errorf("%d proposal events, want 2 (review branch, main)", proposed)
	}
}

// inventoryRemote makes a bare repository whose main holds the example
// site's inventory and returns its path.
func inventoryRemote(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	bare, work := filepath.Join(dir, "remote.git"), filepath.Join(dir, "work")
	if _, err := git.PlainInitWithOptions(bare, &git.PlainInitOptions{Bare: true, InitOptions: git.InitOptions{DefaultBranch: "refs/heads/main"}}); err != nil {
		t.Fatal(err)
	}
	repo, err := git.PlainInitWithOptions(work, &git.PlainInitOptions{InitOptions: git.InitOptions{DefaultBranch: "refs/heads/main"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range inventory.Files {
		b, err := os.ReadFile(filepath.Join("..", "inventory-example", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(work, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	wt, err := repo.Worktree()
	if err != nil {
		t.Fatal(err)
	}
	if err := wt.AddGlob("."); err != nil {
		t.Fatal(err)
	}
	sig := &object.Signature{Name: "Operator", Email: "op@example.invalid", When: time.Now()}
	if _, err := wt.Commit("inventory", &git.CommitOptions{Author: sig, Committer: sig}); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.CreateRemote(&gitconfig.RemoteConfig{Name: "origin", URLs: []string{"file://" + bare}}); err != nil {
		t.Fatal(err)
	}
	if err := repo.Push(&git.PushOptions{RemoteName: "origin", RefSpecs: []gitconfig.RefSpec{"refs/heads/main:refs/heads/main"}}); err != nil {
		t.Fatal(err)
	}
	return bare
}

func branchTip(t *testing.T, bare, branch string) plumbing.Hash {
	t.Helper()
	repo, err := git.PlainOpen(bare)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := repo.Reference(plumbing.NewBranchReferenceName(branch), true)
	if err != nil {
		t.Fatalf("branch %s: %v", branch, err)
	}
	return ref.Hash()
}

func treeFiles(t *testing.T, bare, branch string) map[string][]byte {
	t.Helper()
	repo, err := git.PlainOpen(bare)
	if err != nil {
		t.Fatal(err)
	}
	c, err := repo.CommitObject(branchTip(t, bare, branch))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	iter, err := c.Files()
	if err != nil {
		t.Fatal(err)
	}
	if err := iter.ForEach(func(f *object.File) error {
		s, err := f.Contents()
		files[f.Name] = []byte(s)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return files
}

func fileAt(t *testing.T, bare, branch, name string) string {
	t.Helper()
	return string(treeFiles(t, bare, branch)[name])
}

// loadBranch validates branch's inventory as machinactl validate would.
func loadBranch(t *testing.T, bare, branch string) {
	t.Helper()
	fs := fstest.MapFS{}
	for name, b := range treeFiles(t, bare, branch) {
		fs[name] = &fstest.MapFile{Data: b}
	}
	if _, err := inventory.Load(fs, inventory.Limits{}); err != nil {
		t.Errorf("%s's inventory is invalid: %v", branch, fmt.Sprint(err))
	}
}
