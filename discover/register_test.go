package discover

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/machina-metal/machina/inventory"
	inventoryexample "github.com/machina-metal/machina/inventory-example"
)

// newRepo makes a clone at dir/inventory holding the example inventory,
// committed on main, and returns its path.
func newRepo(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "inventory")
	repo, err := git.PlainInitWithOptions(dir, &git.PlainInitOptions{InitOptions: git.InitOptions{DefaultBranch: "refs/heads/main"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range inventory.Files {
		b, err := fs.ReadFile(inventoryexample.FS, n)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	wt, _ := repo.Worktree()
	if err := wt.AddGlob("."); err != nil {
		t.Fatal(err)
	}
	sig := &object.Signature{Name: "t", Email: "t@example.invalid", When: time.Unix(1e9, 0)}
	if _, err := wt.Commit("example", &git.CommitOptions{Author: sig, Committer: sig}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// atBranch loads the inventory at the head of branch.
func atBranch(t *testing.T, dir, branch string) *inventory.Inventory {
	t.Helper()
	_, inv, err := ReadInventory(dir, branch)
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

func TestRegisterReviewBranchAndCommitTo(t *testing.T) {
	_, aDell := startSim(t, "dell-poweredge-r750-idrac9", creds[0], 3)
	_, aHPE := startSim(t, "hpe-proliant-dl385gen10plusv2-ilo5", creds[1], 3)
	_, aDup := startSim(t, "dell-poweredge-r750-idrac9", creds[0], 3) // same MACs as aDell
	_, aLenovo := startSim(t, "lenovo-thinksystem-sr670v2-xcc", Credential{Username: "x", Password: "y"}, 3)
	rep, err := Scan(context.Background(), Config{Targets: []string{aDell, aHPE, aDup, aLenovo}, AllowLoopback: true, Credentials: creds, InsecureTLS: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := newRepo(t)
	before := atBranch(t, dir, "main")
	now := func() time.Time { return time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC) }
	reg, err := Register(rep, RegisterConfig{Repo: dir, Zone: "zone-a", Site: "lab1", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if reg.Branch != "discovered/2026-11-29" || len(reg.Added) != 2 || len(reg.Skipped) != 1 || !strings.Contains(reg.Skipped[0].Reason, "boot MAC") {
		t.Fatalf("register: %+v", reg)
	}
	inv := atBranch(t, dir, reg.Branch)
	if len(inv.Servers) != len(before.Servers)+2 {
		t.Fatalf("branch has %d servers, want %d", len(inv.Servers), len(before.Servers)+2)
	}
	for _, e := range reg.Added {
		s := inv.Server(e.Name)
		if s == nil || s.BMC.Credentials == "" || !s.BMC.InsecureTLS || s.Zone != "zone-a" || s.BootMAC != e.BootMAC {
			t.Errorf("entry %s: %+v", e.Name, s)
		}
	}
	if s := inv.Server(nameFor("https://" + aHPE)); s == nil || s.BMC.Credentials != "bmc-hpe" {
		t.Errorf("hpe entry: %+v", s)
	}
	// main is untouched: same head content, clean worktree.
	if got := atBranch(t, dir, "main"); got.Digest != before.Digest {
		t.Error("main changed")
	}
	repo, _ := git.PlainOpen(dir)
	wt, _ := repo.Worktree()
	if st, _ := wt.Status(); !st.IsClean() {
		t.Errorf("worktree dirty after a review-branch commit: %v", st)
	}
	// The same day again: a second branch.
	reg2, err := Register(rep, RegisterConfig{Repo: dir, Zone: "zone-a", Now: now})
	if err != nil || reg2.Branch != "discovered/2026-11-29-2" {
		t.Fatalf("second register: %+v %v", reg2, err)
	}
	// Straight onto main (checked out): the worktree moves with it.
	reg3, err := Register(rep, RegisterConfig{Repo: dir, Zone: "zone-a", CommitTo: "main", Now: now})
	if err != nil || reg3.Branch != "main" || len(reg3.Added) != 2 {
		t.Fatalf("commit-to main: %+v %v", reg3, err)
	}
	head, _ := repo.Head()
	if head.Hash().String() != reg3.Commit {
		t.Errorf("main head %s, want %s", head.Hash(), reg3.Commit)
	}
	if st, _ := wt.Status(); !st.IsClean() {
		t.Errorf("worktree dirty after commit-to main: %v", st)
	}
	// Now everything is known: nothing to add, no commit.
	reg4, err := Register(rep, RegisterConfig{Repo: dir, Zone: "zone-a", CommitTo: "main", Now: now})
	if err != nil || len(reg4.Added) != 0 || len(reg4.Skipped) != 3 || reg4.Commit != "" {
		t.Fatalf("re-register: %+v %v", reg4, err)
	}
	if _, err := Register(rep, RegisterConfig{Repo: dir, Zone: "zone-a", CommitTo: "other"}); err == nil {
		t.Error("commit-to a non-base branch accepted")
	}
}

func TestRegisterRefusesInvalidResult(t *testing.T) {
	_, a := startSim(t, "dell-poweredge-r750-idrac9", creds[0], 3)
	rep, err := Scan(context.Background(), Config{Targets: []string{a}, AllowLoopback: true, Credentials: creds, InsecureTLS: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := newRepo(t)
	// "Zone_A" is not a label: the proposal fails validation, nothing is committed.
	_, err = Register(rep, RegisterConfig{Repo: dir, Zone: "Zone_A"})
	var ve *inventory.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("err %v, want a validation error", err)
	}
	repo, _ := git.PlainOpen(dir)
	refs, _ := repo.References()
	_ = refs.ForEach(func(r *plumbing.Reference) error {
		if strings.HasPrefix(r.Name().String(), "refs/heads/discovered") {
			t.Errorf("branch %s created for an invalid proposal", r.Name())
		}
		return nil
	})
}

func TestAppendEntries(t *testing.T) {
	e := Entry{Name: "n1", Zone: "z", Tags: []string{"a", "b"}, BootMAC: "52:54:00:00:00:01", BMC: inventory.BMC{Driver: "redfish", Address: "https://10.0.0.1", Credentials: "c"}}
	for in, want := range map[string]string{
		"":                         "servers:\n  - name: \"n1\"\n",
		"servers: []\n":            "servers:\n  - name: \"n1\"\n",
		"# c\nservers:\n- name: x": "# c\nservers:\n- name: x\n- name: \"n1\"\n",
		"servers:\n    - name: x\n      zone: y\n": "servers:\n    - name: x\n      zone: y\n    - name: \"n1\"\n      zone: \"z\"\n",
	} {
		got, err := AppendEntries([]byte(in), []Entry{e})
		if err != nil || !strings.HasPrefix(string(got), want) {
			t.Errorf("%q: got %q, %v; want prefix %q", in, got, err, want)
		}
	}
	if _, err := AppendEntries([]byte("servers:\n  - name: x\nother: 1\n"), []Entry{e}); err == nil {
		t.Error("appended into a list followed by another key")
	}
	// A value cannot escape its field.
	evil := e
	evil.Name = "x\"\n  - name: injected"
	got, _ := AppendEntries(nil, []Entry{evil})
	if strings.Count(string(got), "\n  - name:") != 1 {
		t.Errorf("injection: %q", got)
	}
}

// TestCommitRefusesDirtyOrStagedWorktree: a commit onto the checked-out
// branch goes through the worktree, whose index go-git commits whole. An
// edited servers.yaml (ErrDirty) or any other staged change (ErrStaged)
// refuses the commit, so nothing unvalidated rides along; an untracked
// file does not.
func TestCommitRefusesDirtyOrStagedWorktree(t *testing.T) {
	dir := newRepo(t)
	raw, _, err := ReadInventory(dir, "main")
	if err != nil {
		t.Fatal(err)
	}
	out, err := AppendEntries(raw, []Entry{{Name: "r9-n01", Zone: "zone-a", BootMAC: "52:54:00:09:00:01",
		BMC: inventory.BMC{Driver: inventory.DriverRedfish, Address: "https://10.10.9.11", Credentials: "bmc-redfish"}}})
	if err != nil {
		t.Fatal(err)
	}
	repo, _ := git.PlainOpen(dir)
	wt, _ := repo.Worktree()
	head0, _ := repo.Head()
	commit := func() error {
		_, err := Commit(Change{Repo: dir, Branch: "main", Message: "add r9-n01"}, out)
		return err
	}

	// servers.yaml edited by hand, not staged.
	sp := filepath.Join(dir, inventory.ServersFile)
	if err := os.WriteFile(sp, append(bytes.Clone(raw), "# local edit\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := commit(); !errors.Is(err, ErrDirty) {
		t.Fatalf("edited servers.yaml: %v, want ErrDirty", err)
	}
	if err := os.WriteFile(sp, raw, 0o644); err != nil {
		t.Fatal(err)
	}

	// Another file staged: it would be committed with the servers.
	pp := filepath.Join(dir, inventory.ProfilesFile)
	prof, _ := os.ReadFile(pp)
	if err := os.WriteFile(pp, append(bytes.Clone(prof), "# staged, not reviewed\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := wt.Add(inventory.ProfilesFile); err != nil {
		t.Fatal(err)
	}
	if err := commit(); !errors.Is(err, ErrStaged) || !strings.Contains(err.Error(), inventory.ProfilesFile) {
		t.Fatalf("staged profiles.yaml: %v, want ErrStaged naming it", err)
	}
	if head, _ := repo.Head(); head.Hash() != head0.Hash() {
		t.Fatal("a refused commit moved main")
	}
	// Unstaged again (edit kept in the worktree) and an untracked file:
	// the commit goes through and records servers.yaml only.
	if err := wt.Reset(&git.ResetOptions{Mode: git.MixedReset}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := Commit(Change{Repo: dir, Branch: "main", Message: "add r9-n01"}, out)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := repo.CommitObject(h)
	parent, _ := c.Parent(0)
	changes, _ := parent.Patch(c)
	var files []string
	for _, fp := range changes.FilePatches() {
		from, to := fp.Files()
		switch {
		case to != nil:
			files = append(files, to.Path())
		case from != nil:
			files = append(files, from.Path())
		}
	}
	if strings.Join(files, ",") != inventory.ServersFile {
		t.Errorf("commit changed %v, want servers.yaml only", files)
	}
}

// TestCommitUnchangedIsErrNoChange: committing the base's servers.yaml
// unchanged is ErrNoChange, through the worktree (the checked-out branch:
// go-git said "cannot create empty commit") and as objects (another branch,
// which would get a commit changing nothing); no ref moves.
func TestCommitUnchangedIsErrNoChange(t *testing.T) {
	dir := newRepo(t)
	raw, _, err := ReadInventory(dir, "main")
	if err != nil {
		t.Fatal(err)
	}
	repo, _ := git.PlainOpen(dir)
	head0, _ := repo.Head()
	for _, branch := range []string{"main", "review/nothing"} {
		if _, err := Commit(Change{Repo: dir, Base: "main", Branch: branch, Message: "no change"}, raw); !errors.Is(err, ErrNoChange) {
			t.Errorf("branch %s: %v, want ErrNoChange", branch, err)
		}
	}
	if head, _ := repo.Head(); head.Hash() != head0.Hash() {
		t.Error("main moved")
	}
	if _, err := repo.Reference(plumbing.NewBranchReferenceName("review/nothing"), false); err == nil {
		t.Error("a branch was made for no change")
	}
}

// TestCommitInterrupted: a Change whose Context has ended validates and
// then writes nothing (no commit, no branch).
func TestCommitInterrupted(t *testing.T) {
	dir := newRepo(t)
	raw, _, err := ReadInventory(dir, "main")
	if err != nil {
		t.Fatal(err)
	}
	changed := append([]byte("# a comment\n"), raw...)
	repo, _ := git.PlainOpen(dir)
	head0, _ := repo.Head()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, branch := range []string{"main", "review/interrupted"} {
		if _, err := Commit(Change{Repo: dir, Base: "main", Branch: branch, Message: "x", Context: ctx}, changed); !errors.Is(err, context.Canceled) {
			t.Errorf("branch %s: %v, want context.Canceled", branch, err)
		}
	}
	if head, _ := repo.Head(); head.Hash() != head0.Hash() {
		t.Error("main moved")
	}
	if _, err := repo.Reference(plumbing.NewBranchReferenceName("review/interrupted"), false); err == nil {
		t.Error("a branch was made by an interrupted commit")
	}
}
