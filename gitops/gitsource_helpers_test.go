package gitops

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	git "github.com/go-git/go-git/v5"
	gitconfig "github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/machina-metal/machina/reconciler/plan/plantest"
)

// testRepo is a bare "remote" in a temp dir and a working clone that plays
// the operator, both made with go-git.
type testRepo struct {
	t    testing.TB
	bare string
	work string
	repo *git.Repository
}

var testLogger = plantest.Logger

// exampleDir is inventory-example/ at the repository root.
func exampleDir(t testing.TB) string {
	t.Helper()
	d, err := filepath.Abs(filepath.Join("..", "inventory-example"))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// newTestRepo creates the bare remote seeded with inventory-example/ on
// branch main.
func newTestRepo(t testing.TB) *testRepo {
	t.Helper()
	root := t.TempDir()
	r := &testRepo{t: t, bare: filepath.Join(root, "remote.git"), work: filepath.Join(root, "work")}
	if _, err := git.PlainInitWithOptions(r.bare, &git.PlainInitOptions{Bare: true,
		InitOptions: git.InitOptions{DefaultBranch: plumbing.NewBranchReferenceName("main")}}); err != nil {
		t.Fatal(err)
	}
	repo, err := git.PlainInitWithOptions(r.work, &git.PlainInitOptions{
		InitOptions: git.InitOptions{DefaultBranch: plumbing.NewBranchReferenceName("main")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := repo.CreateRemote(&gitconfig.RemoteConfig{Name: "origin", URLs: []string{r.url()}}); err != nil {
		t.Fatal(err)
	}
	r.repo = repo
	ents, err := os.ReadDir(exampleDir(t))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(exampleDir(t), e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = string(b)
	}
	r.commit("seed from inventory-example", files)
	r.push(false)
	return r
}

func (r *testRepo) url() string { return "file://" + r.bare }

// read returns a file of the working clone.
func (r *testRepo) read(name string) string {
	r.t.Helper()
	b, err := os.ReadFile(filepath.Join(r.work, name))
	if err != nil {
		r.t.Fatal(err)
	}
	return string(b)
}

// commit writes files (content "" deletes) and commits them as a human.
func (r *testRepo) commit(msg string, files map[string]string) plumbing.Hash {
	r.t.Helper()
	wt, err := r.repo.Worktree()
	if err != nil {
		r.t.Fatal(err)
	}
	for name, content := range files {
		p := filepath.Join(r.work, name)
		if content == "" {
			if _, err := wt.Remove(name); err != nil {
				r.t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			r.t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			r.t.Fatal(err)
		}
		if _, err := wt.Add(name); err != nil {
			r.t.Fatal(err)
		}
	}
	h, err := wt.Commit(msg, &git.CommitOptions{Author: &object.Signature{Name: "Op", Email: "op@example.org", When: time.Now()}})
	if err != nil {
		r.t.Fatal(err)
	}
	return h
}

// edit replaces old with new in file name and commits.
func (r *testRepo) edit(name, old, new, msg string) plumbing.Hash {
	r.t.Helper()
	s := r.read(name)
	if !strings.Contains(s, old) {
		r.t.Fatalf("%s does not contain %q", name, old)
	}
	return r.commit(msg, map[string]string{name: strings.Replace(s, old, new, 1)})
}

func (r *testRepo) push(force bool) {
	r.t.Helper()
	if err := r.tryPush(force); err != nil {
		r.t.Fatalf("push: %v", err)
	}
}

func (r *testRepo) tryPush(force bool) error {
	err := r.repo.Push(&git.PushOptions{RemoteName: "origin", Force: force,
		RefSpecs: []gitconfig.RefSpec{"refs/heads/main:refs/heads/main"}})
	if errors.Is(err, git.NoErrAlreadyUpToDate) {
		return nil
	}
	return err
}

// pull fetches main and hard-resets the working clone to it.
func (r *testRepo) pull() {
	r.t.Helper()
	err := r.repo.Fetch(&git.FetchOptions{RemoteName: "origin", Force: true,
		RefSpecs: []gitconfig.RefSpec{"+refs/heads/main:refs/remotes/origin/main"}})
	if err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
		r.t.Fatal(err)
	}
	ref, err := r.repo.Reference("refs/remotes/origin/main", true)
	if err != nil {
		r.t.Fatal(err)
	}
	r.resetTo(ref.Hash())
}

// resetTo moves main and the work tree to h.
func (r *testRepo) resetTo(h plumbing.Hash) {
	r.t.Helper()
	wt, err := r.repo.Worktree()
	if err != nil {
		r.t.Fatal(err)
	}
	if err := wt.Reset(&git.ResetOptions{Commit: h, Mode: git.HardReset}); err != nil {
		r.t.Fatal(err)
	}
}

// remoteHead returns the remote's commit for branch.
func (r *testRepo) remoteHead(branch string) plumbing.Hash {
	r.t.Helper()
	bare, err := git.PlainOpen(r.bare)
	if err != nil {
		r.t.Fatal(err)
	}
	ref, err := bare.Reference(plumbing.NewBranchReferenceName(branch), true)
	if err != nil {
		r.t.Fatal(err)
	}
	return ref.Hash()
}

// remoteCommit reads a commit of the remote.
func (r *testRepo) remoteCommit(h plumbing.Hash) *object.Commit {
	r.t.Helper()
	bare, err := git.PlainOpen(r.bare)
	if err != nil {
		r.t.Fatal(err)
	}
	c, err := bare.CommitObject(h)
	if err != nil {
		r.t.Fatal(err)
	}
	return c
}

// events collects source events.
type eventLog struct{ evs []SourceEvent }

func (l *eventLog) add(e SourceEvent) { l.evs = append(l.evs, e) }

func (l *eventLog) kinds() []SourceEventKind {
	var out []SourceEventKind
	for _, e := range l.evs {
		out = append(out, e.Kind)
	}
	return out
}
