package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/discover"
	"github.com/machina-metal/machina/inventory"
	inventoryexample "github.com/machina-metal/machina/inventory-example"
	"github.com/machina-metal/machina/state"
)

// exampleClone makes a go-git clone holding the example inventory on main.
func exampleClone(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "inventory")
	repo, err := git.PlainInitWithOptions(dir, &git.PlainInitOptions{InitOptions: git.InitOptions{DefaultBranch: "refs/heads/main"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range inventory.Files {
		b, _ := fs.ReadFile(inventoryexample.FS, n)
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	wt, _ := repo.Worktree()
	_ = wt.AddGlob(".")
	sig := &object.Signature{Name: "t", Email: "t@example.invalid", When: time.Unix(1e9, 0)}
	if _, err := wt.Commit("example", &git.CommitOptions{Author: sig, Committer: sig}); err != nil {
		t.Fatal(err)
	}
	return dir
}

func runScanCtl(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

// TestScanVerb runs machinactl scan against an admin API whose scan route
// resolves credentials in a real state store and scans loopback bmcsim
// BMCs (the test's stand-in for the controller's mountDiscovery, which
// refuses loopback).
func TestScanVerb(t *testing.T) {
	var trees bmcsim.Trees
	var targets []string
	sims := map[string]*bmcsim.Server{}
	for tree, pw := range map[string]string{"dell-poweredge-r750-idrac9": "pw-dell", "hpe-proliant-dl385gen10plusv2-ilo5": "pw-hpe"} {
		dir, err := bmcsim.TreeDir("", tree)
		if err != nil {
			t.Fatal(err)
		}
		sim, err := trees.New(dir, bmcsim.Config{Username: "admin", Password: pw, LockoutThreshold: 3})
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewTLSServer(sim)
		t.Cleanup(ts.Close)
		targets = append(targets, ts.Listener.Addr().String())
		sims[tree] = sim
	}
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for name, pw := range map[string]string{"bmc-dell": "pw-dell", "bmc-hpe": "pw-hpe"} {
		if _, err := st.PutSecret(name, state.Credential{Username: "admin", Password: pw}, "test"); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := api.New(api.Config{Store: st, Heartbeat: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var asked v1.ScanRequest
	var calls atomic.Int32
	err = srv.HandleAdmin("POST /api/v1/scan", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_ = json.NewDecoder(r.Body).Decode(&asked)
		var creds []discover.Credential
		for _, n := range asked.Credentials {
			c, err := st.Secret(n)
			if err != nil {
				http.Error(w, `{"code":"not_found","error":"no such credential"}`, http.StatusNotFound)
				return
			}
			creds = append(creds, discover.Credential{Name: n, Username: c.Username, Password: c.Password})
		}
		rep, err := discover.Scan(r.Context(), discover.Config{Targets: targets, AllowLoopback: true, Credentials: creds,
			LockoutThreshold: asked.LockoutThreshold, InsecureTLS: asked.InsecureTLS})
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		_ = json.NewEncoder(w).Encode(rep)
	}))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	tok, _, err := st.CreateAdminToken("ops", state.ActorLocal)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(envToken, tok)

	code, out, errs := runScanCtl(t, "scan", "10.20.0.0/29", "--credentials", "bmc-dell,bmc-hpe", "--insecure-tls", "--api", hs.URL)
	if code != 0 {
		t.Fatalf("scan: %d %s %s", code, out, errs)
	}
	if asked.CIDR != "10.20.0.0/29" || strings.Join(asked.Credentials, ",") != "bmc-dell,bmc-hpe" || !asked.InsecureTLS || asked.LockoutThreshold != 3 {
		t.Errorf("request: %+v", asked)
	}
	if !strings.Contains(out, "ADDRESS") || strings.Count(out, "authenticated") < 2 || !strings.Contains(out, "Dell Inc.") || !strings.Contains(out, "bmc-hpe") {
		t.Errorf("table:\n%s", out)
	}
	for _, pw := range []string{"pw-dell", "pw-hpe"} {
		if strings.Contains(out, pw) {
			t.Fatal("password in output")
		}
	}
	for n, s := range sims {
		if s.Locked() {
			t.Errorf("%s locked", n)
		}
	}

	repo := exampleClone(t)
	code, out, errs = runScanCtl(t, "scan", "10.20.0.0/29", "--credentials", "bmc-dell,bmc-hpe", "--insecure-tls", "--api", hs.URL,
		"--format", "json", "--register", "--zone", "zone-b", "--repo", repo)
	if code != 0 {
		t.Fatalf("scan --register: %d %s %s", code, out, errs)
	}
	var got struct {
		discover.Report
		Registered *discover.Registered `json:"registered"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("json: %v\n%s", err, out)
	}
	if len(got.Results) != 2 || got.Registered == nil || len(got.Registered.Added) != 2 || !strings.HasPrefix(got.Registered.Branch, "discovered/") {
		t.Fatalf("json report: %s", out)
	}
	r, _ := git.PlainOpen(repo)
	ref, err := r.Reference(plumbing.NewBranchReferenceName(got.Registered.Branch), true)
	if err != nil || ref.Hash().String() != got.Registered.Commit {
		t.Fatalf("branch %s: %v %v", got.Registered.Branch, ref, err)
	}

	// An inventory branch other than main: --branch is the base, and
	// --commit-to may only name it.
	head, _ := r.Head()
	if err := r.Storer.SetReference(plumbing.NewHashReference(plumbing.NewBranchReferenceName("production"), head.Hash())); err != nil {
		t.Fatal(err)
	}
	code, out, errs = runScanCtl(t, "scan", "10.20.0.0/29", "--credentials", "bmc-dell,bmc-hpe", "--insecure-tls", "--api", hs.URL,
		"--register", "--zone", "zone-b", "--repo", repo, "--branch", "production", "--commit-to", "main")
	if code != 2 || !strings.Contains(errs, "only the base branch production") {
		t.Errorf("--commit-to main from production: %d %s %s", code, out, errs)
	}
	code, out, errs = runScanCtl(t, "scan", "10.20.0.0/29", "--credentials", "bmc-dell,bmc-hpe", "--insecure-tls", "--api", hs.URL,
		"--register", "--zone", "zone-b", "--repo", repo, "--branch", "production", "--commit-to", "production")
	if code != 0 || !strings.Contains(out, "on branch production") {
		t.Fatalf("--branch production --commit-to production: %d %s %s", code, out, errs)
	}
	prod, _ := r.Reference(plumbing.NewBranchReferenceName("production"), true)
	if main, _ := r.Head(); prod.Hash() == head.Hash() || main.Hash() != head.Hash() {
		t.Errorf("production %s, main %s, was %s: want production moved, main not", prod.Hash(), main.Hash(), head.Hash())
	}

	for _, bad := range [][]string{
		{"scan", "10.0.0.0/30", "--credentials", "a,b,c,d", "--api", hs.URL},
		{"scan", "10.0.0.0/30", "--credentials", "bmc-dell,,bmc-hpe", "--api", hs.URL},
		{"scan", "10.0.0.0/30", "--credentials", "bmc-dell", "--lockout-threshold", "1", "--api", hs.URL},
		{"scan", "10.0.0.0/30", "--credentials", "bmc-dell", "--port", "70000", "--api", hs.URL},
		{"scan", "10.0.0.0/30", "--credentials", "bmc-dell", "--commit-to", "main", "--api", hs.URL},
		{"scan", "8.8.8.0/24", "--credentials", "bmc-dell", "--api", hs.URL},
		{"scan", "10.0.0.0/16", "--credentials", "bmc-dell", "--api", hs.URL},
		{"scan", "10.0.0.0/30", "--api", hs.URL},
		{"scan", "10.0.0.0/30", "--credentials", "bmc-dell", "--format", "xml", "--api", hs.URL},
		{"scan", "10.0.0.0/30", "--credentials", "bmc-dell", "--register", "--api", hs.URL},
	} {
		before := calls.Load()
		if code, _, _ := runScanCtl(t, bad...); code != 2 {
			t.Errorf("%v: exit %d, want 2", bad, code)
		}
		if calls.Load() != before {
			t.Errorf("%v: refused only by the controller, want refused before asking it", bad)
		}
	}
}

func TestImportVerb(t *testing.T) {
	repo := exampleClone(t)
	corpus := filepath.Join("..", "..", "discover", "testdata", "import")
	code, out, errs := runScanCtl(t, "import", filepath.Join(corpus, "rack5.json"), "--repo", repo, "--dry-run")
	if code != 1 || !strings.Contains(out, "rack5.json:8: invalid r5-n04") || !strings.Contains(errs, "nothing written") {
		t.Fatalf("dry-run with invalid rows: %d\n%s\n%s", code, out, errs)
	}
	code, out, errs = runScanCtl(t, "import", filepath.Join(corpus, "rack5.json"), "--repo", repo, "--dry-run", "--skip-invalid")
	if code != 0 || !strings.Contains(out, "+++ b/servers.yaml") || !strings.Contains(out, `+  - name: "r5-n01"`) {
		t.Fatalf("dry-run: %d\n%s\n%s", code, out, errs)
	}
	r, _ := git.PlainOpen(repo)
	head0, _ := r.Head()
	code, out, errs = runScanCtl(t, "import", filepath.Join(corpus, "rack5.json"), "--repo", repo, "--skip-invalid")
	if code != 0 || !strings.Contains(out, "committed") {
		t.Fatalf("import: %d\n%s\n%s", code, out, errs)
	}
	head1, _ := r.Head()
	if head1.Hash() == head0.Hash() {
		t.Fatal("no commit")
	}
	b, _ := os.ReadFile(filepath.Join(repo, inventory.ServersFile))
	if !strings.Contains(string(b), "r5-n02") {
		t.Error("worktree servers.yaml not updated")
	}
	code, out, _ = runScanCtl(t, "import", filepath.Join(corpus, "rack5.json"), "--repo", repo, "--skip-invalid")
	if code != 0 || !strings.Contains(out, "nothing to add") || !strings.Contains(out, "0 added, 3 skipped, 3 invalid") {
		t.Fatalf("re-import: %d\n%s", code, out)
	}
	if code, _, _ := runScanCtl(t, "import", "nope.csv", "--repo", repo); code != 2 {
		t.Errorf("missing file: %d", code)
	}
}

func TestServerBMCSetVerb(t *testing.T) {
	repo := exampleClone(t)
	args := []string{"server", "bmc-set", "r1-n04", "--driver", "redfish", "--address", "https://10.10.9.14", "--credentials", "bmc-new", "--repo", repo}
	code, out, errs := runScanCtl(t, append(args, "--dry-run")...)
	if code != 0 || !strings.Contains(out, `+      address: "https://10.10.9.14"`) || !strings.Contains(out, "-      address: 10.10.1.14:623") {
		t.Fatalf("dry-run: %d\n%s\n%s", code, out, errs)
	}
	code, out, errs = runScanCtl(t, args...)
	if code != 0 || !strings.Contains(out, "committed") {
		t.Fatalf("bmc-set: %d\n%s\n%s", code, out, errs)
	}
	_, inv, err := discover.ReadInventory(repo, "main")
	if err != nil {
		t.Fatal(err)
	}
	if s := inv.Server("r1-n04"); s == nil || s.BMC.Address != "https://10.10.9.14" || s.BMC.Driver != "redfish" || s.BMC.Credentials != "bmc-new" {
		t.Fatalf("r1-n04: %+v", s)
	}
	// The same again: nothing to change, exit 0, no commit (it failed
	// with exit 2 and "cannot create empty commit: clean working tree").
	rs, _ := git.PlainOpen(repo)
	hs0, _ := rs.Head()
	for _, again := range [][]string{args, append(slices.Clone(args), "--dry-run")} {
		code, out, errs = runScanCtl(t, again...)
		if code != 0 || !strings.Contains(out, "nothing to change: r1-n04 already has this bmc block on main") || errs != "" {
			t.Errorf("bmc-set (dry-run %v) with no change: exit %d, %q %q", len(again) > len(args), code, out, errs)
		}
	}
	if hs1, _ := rs.Head(); hs1.Hash() != hs0.Hash() {
		t.Errorf("bmc-set with no change committed %s", hs1.Hash())
	}
	// Another server's address: the result is invalid, nothing committed.
	r, _ := git.PlainOpen(repo)
	h0, _ := r.Head()
	code, _, errs = runScanCtl(t, "server", "bmc-set", "r1-n05", "--driver", "redfish", "--address", "https://10.10.9.14", "--credentials", "bmc-new", "--repo", repo)
	h1, _ := r.Head()
	if code != 1 || h1.Hash() != h0.Hash() {
		t.Errorf("duplicate address: exit %d, %s", code, errs)
	}
	if code, _, _ := runScanCtl(t, "server", "bmc-set", "nope", "--driver", "redfish", "--address", "https://10.10.9.99", "--credentials", "x", "--repo", repo); code != 1 {
		t.Errorf("unknown server: exit %d", code)
	}
}

// TestImportInterrupted: an import whose context ends (Ctrl-C) before the
// commit commits nothing and exits 2 saying so; the branch and the
// working tree are as they were.
func TestImportInterrupted(t *testing.T) {
	repo := exampleClone(t)
	corpus := filepath.Join("..", "..", "discover", "testdata", "import")
	r, _ := git.PlainOpen(repo)
	head0, _ := r.Head()
	before, _ := os.ReadFile(filepath.Join(repo, inventory.ServersFile))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errb bytes.Buffer
	code := run(ctx, []string{"import", filepath.Join(corpus, "rack5.json"), "--repo", repo, "--skip-invalid"}, strings.NewReader(""), &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "interrupted, nothing committed") {
		t.Errorf("interrupted import: exit %d\n%s\n%s", code, out.String(), errb.String())
	}
	if head1, _ := r.Head(); head1.Hash() != head0.Hash() {
		t.Error("an interrupted import committed")
	}
	if after, _ := os.ReadFile(filepath.Join(repo, inventory.ServersFile)); !bytes.Equal(before, after) {
		t.Error("an interrupted import changed servers.yaml")
	}
}
