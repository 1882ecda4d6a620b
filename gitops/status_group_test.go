package gitops

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing/object"
)

// remoteFiles lists the files of the remote tip's tree under dir.
func remoteFiles(t *testing.T, r *testRepo, dir string) map[string]string {
	t.Helper()
	tree, err := r.remoteCommit(r.remoteHead("main")).Tree()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	if err := tree.Files().ForEach(func(f *object.File) error {
		if strings.HasPrefix(f.Name, dir+"/") {
			out[f.Name] = f.Hash.String()
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestStatusGroupWriters: two groups' writers on one branch, racing:
// each writes only status/GROUP/ (README and per-server files), every
// commit of both is on the branch, a group's server leaving its snapshot
// removes only its own file, and neither deletes or rewrites the other's
// files or status/ entries outside the groups (a hand-made status/NOTE.md).
func TestStatusGroupWriters(t *testing.T) {
	r := newTestRepo(t)
	r.commit("a note beside the groups' status", map[string]string{"status/NOTE.md": "kept\n"})
	r.push(false)
	east := newTestWriter(t, r, func(c *StatusConfig) { c.Group, c.Attempts = "east", 20 })
	west := newTestWriter(t, r, func(c *StatusConfig) { c.Group, c.Attempts = "west", 20 })
	errs := make(chan error, 2)
	for i, w := range []*StatusWriter{east, west} {
		go func() {
			for n := range 4 {
				s := sampleSnapshot()
				s.Servers[0].LastError = fmt.Sprintf("writer %d round %d", i, n)
				if _, err := w.Write(t.Context(), s); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	all := remoteFiles(t, r, "status")
	for _, g := range []string{"east", "west"} {
		for _, f := range []string{"README.md", "inventory.yaml", serverStatusRel("r1-n01"), serverStatusRel("r2-n01")} {
			if _, ok := all["status/"+g+"/"+f]; !ok {
				t.Errorf("status/%s/%s missing", g, f)
			}
		}
	}
	for p := range all {
		if !strings.HasPrefix(p, "status/east/") && !strings.HasPrefix(p, "status/west/") && p != "status/NOTE.md" {
			t.Errorf("unexpected %s", p)
		}
	}
	if _, ok := all["status/NOTE.md"]; !ok {
		t.Fatal("status/NOTE.md deleted by a group's writer")
	}
	westBefore := remoteFiles(t, r, "status/west")
	s := sampleSnapshot()
	s.Servers = s.Servers[:2]
	res, err := east.Write(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Message, "r2-n01 removed") {
		t.Errorf("message %q, want r2-n01 removed", res.Message)
	}
	for _, p := range changedPaths(t, r.remoteCommit(r.remoteHead("main"))) {
		if !strings.HasPrefix(p, "status/east/") {
			t.Errorf("east's commit changes %s", p)
		}
	}
	after := remoteFiles(t, r, "status")
	if _, ok := after["status/east/"+serverStatusRel("r2-n01")]; ok {
		t.Error("east's removed server file kept")
	}
	for p, h := range westBefore {
		if after[p] != h {
			t.Errorf("west's %s changed by east's write", p)
		}
	}
}

// TestOnlyGroupChanged: the guard refuses a group commit that drops or
// rewrites another entry of status/.
func TestOnlyGroupChanged(t *testing.T) {
	r := newTestRepo(t)
	w := newTestWriter(t, r, func(c *StatusConfig) { c.Group = "east" })
	if _, err := w.Write(t.Context(), sampleSnapshot()); err != nil {
		t.Fatal(err)
	}
	wWest := newTestWriter(t, r, func(c *StatusConfig) { c.Group = "west" })
	if _, err := wWest.Write(t.Context(), sampleSnapshot()); err != nil {
		t.Fatal(err)
	}
	tip := r.remoteCommit(r.remoteHead("main"))
	withBoth, err := tip.Tree()
	if err != nil {
		t.Fatal(err)
	}
	parent, err := tip.Parent(0)
	if err != nil {
		t.Fatal(err)
	}
	eastOnly, err := parent.Tree()
	if err != nil {
		t.Fatal(err)
	}
	st := wWest.repo.Storer
	if err := onlyGroupChanged(withBoth, eastOnly, st, st, "west"); err != nil {
		t.Errorf("west dropping its own folder refused: %v", err)
	}
	if err := onlyGroupChanged(withBoth, eastOnly, st, st, "north"); !errors.Is(err, ErrOutsideStatus) || !strings.Contains(err.Error(), "status/west") {
		t.Errorf("north dropping west's folder = %v, want ErrOutsideStatus naming status/west", err)
	}
	if _, err := NewStatusWriter(StatusConfig{Remote: Remote{URL: r.url()}, StateDir: t.TempDir(), Group: "../x"}); !errors.Is(err, ErrRemoteConfig) {
		t.Errorf("group ../x = %v, want ErrRemoteConfig", err)
	}
}
