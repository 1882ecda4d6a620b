package gitops

import (
	"errors"
	"testing"

	git "github.com/go-git/go-git/v5"
	gitconfig "github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/google/go-cmp/cmp"
)

func TestCheckStatusUntouched(t *testing.T) {
	r := newTestRepo(t)
	// The controller writes status to main.
	w := newTestWriter(t, r, nil)
	if _, err := w.Write(t.Context(), sampleSnapshot()); err != nil {
		t.Fatal(err)
	}
	r.pull()
	base := r.remoteHead("main")
	branch := func(name string) {
		t.Helper()
		r.resetTo(base)
		if err := r.repo.Storer.SetReference(plumbing.NewHashReference(plumbing.NewBranchReferenceName(name), base)); err != nil {
			t.Fatal(err)
		}
	}
	tag := func(name string, h plumbing.Hash) {
		t.Helper()
		if err := r.repo.Storer.SetReference(plumbing.NewHashReference(plumbing.ReferenceName("refs/tags/"+name), h)); err != nil {
			t.Fatal(err)
		}
	}

	branch("readme")
	tag("readme", r.commit("docs", map[string]string{"README.md": "# docs\n", "servers.yaml": r.read("servers.yaml") + "# c\n"}))

	r.resetTo(base)
	tag("edit", r.commit("hand edit", map[string]string{"status/servers/r1-n01.yaml": "lifecycle: deployed\n", "README.md": "x\n"}))

	r.resetTo(base)
	tag("delete", r.commit("delete status", map[string]string{"status/README.md": ""}))

	r.resetTo(base)
	tag("add", r.commit("add status", map[string]string{"status/servers/zz.yaml": "x: 1\n"}))

	// A branch made before the controller's next status commit, which
	// then merged main (with that commit) in: it carries status changes,
	// but only the controller's own.
	r.resetTo(base)
	feature := r.commit("feature", map[string]string{"README.md": "feature\n"})
	s := sampleSnapshot()
	s.Servers[0].Lifecycle = "ready"
	if _, err := w.Write(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	newMain := r.remoteHead("main")
	if err := r.repo.Fetch(&git.FetchOptions{RemoteName: "origin", RefSpecs: []gitconfig.RefSpec{"+refs/heads/main:refs/remotes/origin/main"}}); err != nil {
		t.Fatal(err)
	}
	// Fast-forward "merge": main's status commit on top of the feature
	// is what a merge produces for status/; emulate it by committing
	// main's status files onto the feature branch.
	mainCommit, err := r.repo.CommitObject(newMain)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	iter, _ := mainCommit.Files()
	iter.ForEach(func(f *object.File) error {
		if len(f.Name) > 7 && f.Name[:7] == "status/" {
			c, _ := f.Contents()
			files[f.Name] = c
		}
		return nil
	})
	r.resetTo(feature)
	tag("merged", r.commit("merge main", files))

	for _, tc := range []struct {
		head string
		want []string
	}{
		{"readme", nil},
		{"edit", []string{"status/servers/r1-n01.yaml"}},
		{"delete", []string{"status/README.md"}},
		{"add", []string{"status/servers/zz.yaml"}},
		{"merged", nil},
	} {
		baseRev := base.String()
		if tc.head == "merged" {
			baseRev = newMain.String()
		}
		err := CheckStatusUntouched(r.work, baseRev, tc.head)
		var se *StatusEditError
		switch {
		case tc.want == nil && err != nil:
			t.Errorf("%s: CheckStatusUntouched = %v, want nil", tc.head, err)
		case tc.want != nil && (!errors.As(err, &se) || !errors.Is(err, ErrStatusEdited)):
			t.Errorf("%s: CheckStatusUntouched = %v, want *StatusEditError", tc.head, err)
		case tc.want != nil:
			if diff := cmp.Diff(tc.want, se.Paths); diff != "" {
				t.Errorf("%s: paths (-want +got):\n%s", tc.head, diff)
			}
		}
	}
	if err := CheckStatusUntouched(r.work, "nope", "HEAD"); err == nil || errors.Is(err, ErrStatusEdited) {
		t.Errorf("unknown base = %v, want a resolve error", err)
	}
	if err := CheckStatusUntouched(t.TempDir(), "HEAD", "HEAD"); err == nil {
		t.Error("non-repository accepted")
	}
}

// TestResolveRevisionRefBeforeHashPrefix: a tag or branch whose name is a
// hex prefix of another commit's hash resolves to the ref, as git does.
// go-git's ResolveRevision took the hash prefix: TestCheckStatusUntouched
// failed once in CI when the controller's status commit hash began with
// "add", the name of one of its tags (checked: this test fails with
// repo.ResolveRevision in ResolveRevision's place).
func TestResolveRevisionRefBeforeHashPrefix(t *testing.T) {
	r := newTestRepo(t)
	first := r.commit("one", map[string]string{"README.md": "one\n"})
	second := r.commit("two", map[string]string{"README.md": "two\n"})
	prefix := second.String()[:6]
	if err := r.repo.Storer.SetReference(plumbing.NewHashReference(plumbing.ReferenceName("refs/tags/"+prefix), first)); err != nil {
		t.Fatal(err)
	}
	if err := r.repo.Storer.SetReference(plumbing.NewHashReference(plumbing.NewBranchReferenceName(first.String()[:6]), second)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rev  string
		want plumbing.Hash
	}{
		{prefix, first},                // the tag, not the commit whose hash starts with it
		{first.String()[:6], second},   // the branch
		{"refs/tags/" + prefix, first}, // a full ref name
		{second.String(), second},      // a full hash
		{"HEAD", second},
		{"HEAD~1", first},
	} {
		h, err := ResolveRevision(r.repo, tc.rev)
		if err != nil {
			t.Errorf("ResolveRevision(%q): %v", tc.rev, err)
			continue
		}
		if *h != tc.want {
			t.Errorf("ResolveRevision(%q) = %s, want %s", tc.rev, h, tc.want)
		}
	}
	if _, err := ResolveRevision(r.repo, "no-such-branch"); err == nil {
		t.Error("unknown name resolved")
	}
}
