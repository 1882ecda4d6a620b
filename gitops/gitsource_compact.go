package gitops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
)

// The poller's clone is shallow and compacted: its first fetch (and the
// first after a compaction) brings only the newest firstFetchDepth
// commits of the branch, and once fetches have left more than
// sourceMaxPacks packfiles (every fetch that brings a status commit adds
// one) the clone is repacked into one pack of what the poller still
// reads. So a new controller does not fetch the repository's whole
// history, and the clone's size and pack count stay bounded however long
// the controller runs.
const (
	// firstFetchDepth covers introducedBy's walk (maxIntroWalk first
	// parents) and the tip itself.
	firstFetchDepth = maxIntroWalk + 1
	// sourceMaxPacks is how many packfiles the poller's clone may hold
	// before it is compacted.
	sourceMaxPacks = 32
)

// fetchDepth is the depth of the poller's next fetch: firstFetchDepth
// when the clone has no copy of the branch yet (a new controller, or
// after the remote-tracking ref was dropped), else 0: an incremental
// fetch of what the remote has beyond the commits the clone holds (go-git
// sends the clone's shallow boundary, so the server does not send the
// history below it).
func (s *Source) fetchDepth() int {
	local := plumbing.NewRemoteReferenceName(remoteName, s.cfg.Remote.branch())
	if ref, err := s.repo.Reference(local, true); err == nil {
		if _, err := s.repo.CommitObject(ref.Hash()); err == nil {
			return 0
		}
	}
	return firstFetchDepth
}

// ensureFetched returns tip when the clone holds its commit after a
// fetch. When it does not (go-git's fetch into a shallow clone of a
// branch force-pushed back to a commit below the clone's history moves
// the remote-tracking ref but brings no objects, go-git/go-git#1443), it
// drops the ref and fetches the branch again shallowly (firstFetchDepth),
// as a new controller would, and returns the tip that fetch brought.
func (s *Source) ensureFetched(ctx context.Context, o transportOptions, tip plumbing.Hash) (plumbing.Hash, error) {
	if _, err := s.repo.CommitObject(tip); !errors.Is(err, plumbing.ErrObjectNotFound) {
		return tip, nil
	}
	local := plumbing.NewRemoteReferenceName(remoteName, s.cfg.Remote.branch())
	if err := s.repo.Storer.RemoveReference(local); err != nil {
		return tip, fmt.Errorf("refetch %s: %w", short(tip), err)
	}
	s.log.Debug("fetched tip missing from the shallow clone, fetching it again", "commit", tip.String())
	return fetchBranch(ctx, s.repo, o, s.cfg.Remote.branch(), firstFetchDepth)
}

// compactIfNeeded compacts the poller's clone when it holds more than
// maxPacks packfiles (see compactClone), keeping the branch's newest
// firstFetchDepth commits and the last good commit. A failure is logged
// and leaves the clone as it was (the old packs are deleted only after
// the new one is written).
func (s *Source) compactIfNeeded(maxPacks int) {
	pos, ok := s.repo.Storer.(storer.PackedObjectStorer)
	if !ok {
		return
	}
	packs, err := pos.ObjectPacks()
	if err != nil || len(packs) <= maxPacks {
		return
	}
	var keep []plumbing.Hash
	local := plumbing.NewRemoteReferenceName(remoteName, s.cfg.Remote.branch())
	if ref, err := s.repo.Reference(local, true); err == nil {
		keep = append(keep, ref.Hash())
	}
	s.mu.Lock()
	good := s.good.Commit
	s.mu.Unlock()
	if good != "" {
		keep = append(keep, plumbing.NewHash(good))
	}
	n, err := compactClone(s.repo, keep, firstFetchDepth)
	if err != nil {
		s.log.Warn("compact inventory clone", "packs", len(packs), "err", err)
		return
	}
	s.log.Debug("compacted inventory clone", "packs", len(packs), "objects", n)
}

// compactClone rewrites repo's objects as one packfile holding, for each
// commit of keep, that commit and its ancestors up to depth generations
// (fewer where the clone's history is already cut), their trees and
// blobs; it records the commits whose parents it dropped as the clone's
// shallow boundary (.git/shallow), then deletes every other pack and
// loose object. It returns how many objects it kept. go-git's
// Repository.RepackObjects is not used: it keeps the whole history of
// every ref and fails on a shallow clone (it walks into the missing
// parents).
func compactClone(repo *git.Repository, keep []plumbing.Hash, depth int) (int, error) {
	st := repo.Storer
	pos, ok := st.(storer.PackedObjectStorer)
	if !ok {
		return 0, errors.New("compact clone: storage keeps no packs")
	}
	pfw, ok := st.(storer.PackfileWriter)
	if !ok {
		return 0, errors.New("compact clone: storage cannot write packs")
	}
	oldPacks, err := pos.ObjectPacks()
	if err != nil {
		return 0, fmt.Errorf("compact clone: list packs: %w", err)
	}
	objs, shallow, err := recentObjects(st, keep, depth)
	if err != nil {
		return 0, fmt.Errorf("compact clone: %w", err)
	}
	w, err := pfw.PackfileWriter()
	if err != nil {
		return 0, fmt.Errorf("compact clone: %w", err)
	}
	newPack, err := packfile.NewEncoder(w, st, false).Encode(objs, 10)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("compact clone: write pack: %w", err)
	}
	if err := st.SetShallow(shallow); err != nil {
		return 0, fmt.Errorf("compact clone: write shallow list: %w", err)
	}
	for _, h := range oldPacks {
		if h == newPack {
			continue
		}
		if err := pos.DeleteOldObjectPackAndIndex(h, time.Time{}); err != nil {
			return 0, fmt.Errorf("compact clone: delete pack %s: %w", h, err)
		}
	}
	if err := dropLoose(st); err != nil {
		return 0, fmt.Errorf("compact clone: %w", err)
	}
	if ri, ok := st.(interface{ Reindex() }); ok {
		ri.Reindex()
	}
	return len(objs), nil
}

// recentObjects lists the objects compactClone keeps: each commit of keep
// and its ancestors up to depth generations (fewer where the history is
// already cut), with their trees and blobs; shallow are the kept commits
// whose parents are not.
func recentObjects(st storer.EncodedObjectStorer, keep []plumbing.Hash, depth int) (objs, shallow []plumbing.Hash, err error) {
	seen := map[plumbing.Hash]bool{}
	add := func(h plumbing.Hash) bool {
		if seen[h] {
			return false
		}
		seen[h] = true
		objs = append(objs, h)
		return true
	}
	var walkTree func(h plumbing.Hash) error
	walkTree = func(h plumbing.Hash) error {
		if !add(h) {
			return nil
		}
		t, err := object.GetTree(st, h)
		if err != nil {
			return fmt.Errorf("read tree %s: %w", h, err)
		}
		for _, e := range t.Entries {
			switch e.Mode {
			case filemode.Dir:
				if err := walkTree(e.Hash); err != nil {
					return err
				}
			case filemode.Submodule:
			default:
				add(e.Hash)
			}
		}
		return nil
	}
	has := func(h plumbing.Hash) bool { _, err := object.GetCommit(st, h); return err == nil }
	level := map[plumbing.Hash]bool{}
	for _, h := range keep {
		if has(h) {
			level[h] = true
		}
	}
	for d := 1; len(level) > 0; d++ {
		next := map[plumbing.Hash]bool{}
		for h := range level {
			if !add(h) {
				continue
			}
			c, err := object.GetCommit(st, h)
			if err != nil {
				return nil, nil, fmt.Errorf("read commit %s: %w", h, err)
			}
			if err := walkTree(c.TreeHash); err != nil {
				return nil, nil, err
			}
			cut := d >= depth
			for _, p := range c.ParentHashes {
				cut = cut || !has(p) // beyond the clone's history already
			}
			if cut {
				if len(c.ParentHashes) > 0 {
					shallow = append(shallow, h)
				}
				continue
			}
			for _, p := range c.ParentHashes {
				if !seen[p] {
					next[p] = true
				}
			}
		}
		level = next
	}
	return objs, shallow, nil
}

// dropLoose deletes every loose object of st (after compactClone packed
// the ones it keeps).
func dropLoose(st storer.EncodedObjectStorer) error {
	los, ok := st.(storer.LooseObjectStorer)
	if !ok {
		return nil
	}
	var loose []plumbing.Hash
	err := los.ForEachObjectHash(func(h plumbing.Hash) error {
		loose = append(loose, h)
		return nil
	})
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("list loose objects: %w", err)
	}
	for _, h := range loose {
		if err := los.DeleteLooseObject(h); err != nil {
			return fmt.Errorf("delete loose object %s: %w", h, err)
		}
	}
	return nil
}

// deepenPastStatus fetches the branch again, each time four times deeper
// (up to maxStatusWalk commits), while the clone's history below tip holds
// only status commits down to its shallow boundary. A new controller's
// shallow first fetch (firstFetchDepth) of a branch with more status
// commits on top of the operator's commit than that would otherwise name
// the revision after a status commit (introducedBy and humanCommit stop
// at a parent they cannot read). It returns the tip the last fetch
// brought; nothing is fetched when a non-status commit is within reach.
func (s *Source) deepenPastStatus(ctx context.Context, o transportOptions, tip plumbing.Hash) (plumbing.Hash, error) {
	for depth := firstFetchDepth * 4; depth <= maxStatusWalk && s.statusToBoundary(tip); depth *= 4 {
		local := plumbing.NewRemoteReferenceName(remoteName, s.cfg.Remote.branch())
		if err := s.repo.Storer.RemoveReference(local); err != nil {
			return tip, fmt.Errorf("deepen %s: %w", short(tip), err)
		}
		s.log.Debug("only status commits down to the shallow boundary, fetching deeper", "commit", tip.String(), "depth", depth)
		var err error
		if tip, err = fetchBranch(ctx, s.repo, o, s.cfg.Remote.branch(), depth); err != nil {
			return tip, err
		}
	}
	return tip, nil
}

// statusToBoundary reports whether every commit from tip down its first
// parents is a status commit until one whose parent the clone does not
// hold (the shallow boundary).
func (s *Source) statusToBoundary(tip plumbing.Hash) bool {
	c, err := s.repo.CommitObject(tip)
	if err != nil {
		return false
	}
	for range maxStatusWalk {
		if !isStatusCommit(c) || c.NumParents() == 0 {
			return false
		}
		p, err := c.Parent(0)
		if err != nil {
			return true
		}
		c = p
	}
	return false
}
