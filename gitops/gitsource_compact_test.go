package gitops

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"

	"github.com/machina-metal/machina/inventory"
)

// cloneHistory counts the commits the clone holds along first parents
// from h (stopping where the history is cut).
func cloneHistory(t *testing.T, st storer.EncodedObjectStorer, h plumbing.Hash) int {
	t.Helper()
	n := 0
	for {
		c, err := object.GetCommit(st, h)
		if errors.Is(err, plumbing.ErrObjectNotFound) {
			return n
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
		if len(c.ParentHashes) == 0 {
			return n
		}
		h = c.ParentHashes[0]
	}
}

// TestSourceShallowCompacted: a new controller's poller fetches only the
// newest firstFetchDepth commits of a long history (a shallow clone, not
// the whole history), later polls fetch incrementally into it, and once
// fetches have left more than maxPacks packfiles the clone is compacted
// to one pack of the newest commits, keeping the last good revision and
// further incremental fetches working.
func TestSourceShallowCompacted(t *testing.T) {
	r := newTestRepo(t)
	const history = 150
	for i := range history {
		r.commit(fmt.Sprintf("status %d", i), map[string]string{"status/README.md": fmt.Sprintf("# Fleet status %d\n", i)})
	}
	r.push(false)
	state := t.TempDir()
	s, err := NewSource(SourceConfig{Remote: Remote{URL: r.url()}, StateDir: state, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	s.maxPacks = 3
	if err := s.Poll(t.Context()); err != nil {
		t.Fatal(err)
	}
	tip := r.remoteHead("main")
	if got := cloneHistory(t, s.repo.Storer, tip); got != firstFetchDepth {
		t.Errorf("first fetch brought %d commits of %d, want the newest %d", got, history+1, firstFetchDepth)
	}
	if sh, err := s.repo.Storer.Shallow(); err != nil || len(sh) == 0 {
		t.Errorf("clone not shallow after the first fetch: %v, %v", sh, err)
	}
	good, _ := s.Latest()
	for i := range 12 {
		r.commit(fmt.Sprintf("more status %d", i), map[string]string{"status/README.md": fmt.Sprintf("# Fleet status more %d\n", i)})
		r.push(false)
		if err := s.Poll(t.Context()); err != nil {
			t.Fatalf("poll %d after the first: %v", i, err)
		}
		packs, err := filepath.Glob(filepath.Join(state, "inventory.git", "objects", "pack", "*.pack"))
		if err != nil {
			t.Fatal(err)
		}
		if len(packs) > s.maxPacks+1 {
			t.Fatalf("poll %d: %d packs, want at most maxPacks+1 = %d", i, len(packs), s.maxPacks+1)
		}
		tip = r.remoteHead("main")
		if c, err := s.repo.CommitObject(tip); err != nil {
			t.Fatalf("poll %d: tip %s not in the clone: %v", i, tip, err)
		} else if _, err := c.Tree(); err != nil {
			t.Fatalf("poll %d: tip's tree: %v", i, err)
		}
		if got := cloneHistory(t, s.repo.Storer, tip); got > firstFetchDepth+s.maxPacks+1 {
			t.Errorf("poll %d: clone holds %d commits, want at most %d", i, got, firstFetchDepth+s.maxPacks+1)
		}
	}
	if now, _ := s.Latest(); now.Digest != good.Digest || now.Commit != good.Commit {
		t.Errorf("last good revision = %s %s, want %s %s (status commits do not change the inventory)", now.Commit, now.Digest, good.Commit, good.Digest)
	}
	// A restart restores the last good commit from the compacted clone.
	s2, err := NewSource(SourceConfig{Remote: Remote{URL: r.url()}, StateDir: state, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if g, _ := s2.Latest(); g.Commit != good.Commit {
		t.Errorf("after restart last good = %q, want %q", g.Commit, good.Commit)
	}
}

// TestSourceShallowForcePushOlder: the branch is force-pushed back to a
// commit older than the shallow clone's history (go-git's fetch into a
// shallow clone then moves the ref without bringing the commit); the
// poller still reads the new tip.
func TestSourceShallowForcePushOlder(t *testing.T) {
	r := newTestRepo(t)
	old := r.remoteHead("main")
	for i := range firstFetchDepth + 10 {
		r.commit(fmt.Sprintf("status %d", i), map[string]string{"status/README.md": fmt.Sprintf("# Fleet status %d\n", i)})
	}
	r.push(false)
	s, err := NewSource(SourceConfig{Remote: Remote{URL: r.url()}, StateDir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Poll(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.repo.CommitObject(old); err == nil {
		t.Fatalf("seed commit %s in the shallow clone: the test needs it beyond the clone's history", old)
	}
	r.resetTo(old)
	r.push(true)
	if err := s.Poll(t.Context()); err != nil {
		t.Fatalf("poll after a force-push to an older commit: %v", err)
	}
	if s.tip != old {
		t.Errorf("tip = %s, want %s", s.tip, old)
	}
}

// TestProposerShallowFetch: a proposal fetches only the branch tip (depth
// 1), not the history of status commits below it, and still pushes a
// commit on top of the tip.
func TestProposerShallowFetch(t *testing.T) {
	r := newTestRepo(t)
	for i := range 20 {
		r.commit(fmt.Sprintf("status %d", i), map[string]string{"status/README.md": fmt.Sprintf("# %d\n", i)})
	}
	r.push(false)
	tip := r.remoteHead("main")
	state := t.TempDir()
	p, err := NewProposer(ProposerConfig{Remote: Remote{URL: r.url()}, StateDir: state, CommitTo: "main", Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	prop, err := p.Propose(t.Context(), "propose a comment", func(servers []byte, _ *inventory.Inventory) ([]byte, error) {
		return append(servers, []byte("# proposed\n")...), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	c := r.remoteCommit(plumbing.NewHash(prop.Commit))
	if len(c.ParentHashes) != 1 || c.ParentHashes[0] != tip {
		t.Fatalf("proposal %s on %v, want on the tip %s", prop.Commit, c.ParentHashes, tip)
	}
	clone, err := openBare(p.dir, p.cfg.Remote)
	if err != nil {
		t.Fatal(err)
	}
	if got := cloneHistory(t, clone.Storer, tip); got != 1 {
		t.Errorf("the proposer's clone holds %d commits of the branch's 21, want the tip only", got)
	}
}
