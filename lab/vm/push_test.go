package vm

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-git/go-git/v5"
	gitconfig "github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing/object"
)

// TestPushRacesStatusCommit checks the lab's push against a controller
// that commits status between the lab's pull and its push (a restarted
// controller does so right after start): the first push is refused as a
// non-fast-forward update, push resets to the remote's main, applies the
// edit again and pushes; the remote then holds both the status commit and
// the edit, on one line of history.
func TestPushRacesStatusCommit(t *testing.T) {
	dir := t.TempDir()
	bare := filepath.Join(dir, "repo.git")
	if _, err := git.PlainInitWithOptions(bare, &git.PlainInitOptions{Bare: true, InitOptions: git.InitOptions{DefaultBranch: "refs/heads/main"}}); err != nil {
		t.Fatal(err)
	}
	clone := func(name string) (*git.Repository, *git.Worktree, string) {
		path := filepath.Join(dir, name)
		repo, err := git.PlainInitWithOptions(path, &git.PlainInitOptions{InitOptions: git.InitOptions{DefaultBranch: "refs/heads/main"}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := repo.CreateRemote(&gitconfig.RemoteConfig{Name: "origin", URLs: []string{"file://" + bare}}); err != nil {
			t.Fatal(err)
		}
		if err := repo.CreateBranch(&gitconfig.Branch{Name: "main", Remote: "origin", Merge: "refs/heads/main"}); err != nil {
			t.Fatal(err)
		}
		wt, err := repo.Worktree()
		if err != nil {
			t.Fatal(err)
		}
		return repo, wt, path
	}
	commit := func(repo *git.Repository, wt *git.Worktree, path, file, body, msg string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(path, file), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := wt.Add(file); err != nil {
			t.Fatal(err)
		}
		sig := &object.Signature{Name: "t", Email: "t@lab.invalid", When: time.Now()}
		if _, err := wt.Commit(msg, &git.CommitOptions{Author: sig, Committer: sig}); err != nil {
			t.Fatal(err)
		}
		if err := repo.Push(&git.PushOptions{RemoteName: "origin"}); err != nil {
			t.Fatal(err)
		}
	}
	opRepo, opWT, opPath := clone("inventory")
	commit(opRepo, opWT, opPath, "profiles.yaml", "    count: 1\n", "inventory")
	ctlRepo, ctlWT, ctlPath := clone("controller")
	if err := ctlWT.Pull(&git.PullOptions{RemoteName: "origin"}); err != nil {
		t.Fatal(err)
	}

	l := &lab{log: slog.New(slog.DiscardHandler), clone: opPath, hc: &http.Client{Timeout: time.Second}, adminBase: "http://127.0.0.1:1"}
	edits := 0
	err := l.push(context.Background(), "count 0", func() error {
		edits++
		if edits == 1 {
			// The controller's status commit lands after the lab's pull.
			commit(ctlRepo, ctlWT, ctlPath, "status.yaml", "ready\n", "status")
		}
		return replaceFile(filepath.Join(opPath, "profiles.yaml"), "count: 1", "count: 0")
	})
	if err != nil {
		t.Fatalf("push: %v", err)
	}
	if edits != 2 {
		t.Fatalf("edit applied %d times, want 2 (refused once, then again on the remote's main)", edits)
	}
	if err := ctlWT.Pull(&git.PullOptions{RemoteName: "origin"}); err != nil {
		t.Fatalf("controller pull after the lab's push: %v (want a fast-forward)", err)
	}
	for file, want := range map[string]string{"status.yaml": "ready\n", "profiles.yaml": "    count: 0\n"} {
		b, err := os.ReadFile(filepath.Join(ctlPath, file))
		if err != nil || string(b) != want {
			t.Errorf("remote's %s = %q, %v; want %q", file, b, err, want)
		}
	}
}
