package gitops

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
)

// StatusEditError lists the status/ paths a change edits by hand. It
// wraps ErrStatusEdited.
type StatusEditError struct {
	// Paths are repository paths under status/, sorted.
	Paths []string
}

func (e *StatusEditError) Error() string {
	const show = 10
	p := e.Paths
	more := ""
	if len(p) > show {
		more = fmt.Sprintf(" and %d more", len(p)-show)
		p = p[:show]
	}
	return fmt.Sprintf("%s: %s%s (status/ is written by the controller)", ErrStatusEdited, strings.Join(p, ", "), more)
}

// Unwrap returns ErrStatusEdited.
func (e *StatusEditError) Unwrap() error { return ErrStatusEdited }

// ResolveRevision resolves rev in repo as git does for a name that is both
// a ref and a hex prefix of an object: the ref wins (gitrevisions(7),
// <refname>: refs/<rev>, refs/tags/<rev>, refs/heads/<rev>,
// refs/remotes/<rev>, refs/remotes/<rev>/HEAD, in that order), where
// go-git's Repository.ResolveRevision takes the hash prefix first, so a
// branch or tag named "add" or "cafe" would resolve to whichever commit's
// hash starts with it. Anything else (a full or short hash, HEAD,
// "main~2", "origin/main^") goes to go-git's ResolveRevision. Errors are
// go-git's (plumbing.ErrReferenceNotFound for an unknown name).
func ResolveRevision(repo *git.Repository, rev string) (*plumbing.Hash, error) {
	if rev != "" && !strings.ContainsAny(rev, "~^@:{} ") && rev != "HEAD" {
		for _, name := range []string{"refs/" + rev, "refs/tags/" + rev, "refs/heads/" + rev, "refs/remotes/" + rev, "refs/remotes/" + rev + "/HEAD"} {
			ref, err := repo.Reference(plumbing.ReferenceName(name), true)
			if err != nil {
				continue
			}
			h := ref.Hash()
			if tag, err := repo.TagObject(h); err == nil {
				c, err := tag.Commit()
				if err != nil {
					return nil, err
				}
				h = c.Hash
			}
			return &h, nil
		}
	}
	return repo.ResolveRevision(plumbing.Revision(rev))
}

// CheckStatusUntouched opens the Git repository at or above repoDir and
// checks that merging headRev into baseRev (any revision go-git resolves:
// branch, tag, "HEAD", "origin/main", a hash) would not edit status/ by
// hand. A path under status/ counts as edited when headRev's version
// differs both from the merge base's (the change touched it) and from
// baseRev's (the controller did not write that version meanwhile), so a
// branch that merely merged in the controller's status commits passes.
// Uncommitted work-tree changes are not considered. It returns nil, a
// *StatusEditError (errors.Is ErrStatusEdited), or an error opening the
// repository or resolving a revision. For `machinactl validate --base`.
func CheckStatusUntouched(repoDir, baseRev, headRev string) error {
	repo, err := git.PlainOpenWithOptions(repoDir, &git.PlainOpenOptions{DetectDotGit: true})
	if err != nil {
		return fmt.Errorf("check status: open %s: %w", repoDir, err)
	}
	commitOf := func(rev string) (*object.Commit, error) {
		h, err := ResolveRevision(repo, rev)
		if err != nil {
			return nil, fmt.Errorf("check status: resolve %q: %w", rev, err)
		}
		c, err := repo.CommitObject(*h)
		if err != nil {
			return nil, fmt.Errorf("check status: read commit %s: %w", h, err)
		}
		return c, nil
	}
	base, err := commitOf(baseRev)
	if err != nil {
		return err
	}
	head, err := commitOf(headRev)
	if err != nil {
		return err
	}
	var mbFiles map[string]plumbing.Hash
	bases, err := head.MergeBase(base)
	if err != nil {
		return fmt.Errorf("check status: merge base: %w", err)
	}
	if len(bases) > 0 {
		if mbFiles, err = statusFiles(bases[0]); err != nil {
			return err
		}
	}
	baseFiles, err := statusFiles(base)
	if err != nil {
		return err
	}
	headFiles, err := statusFiles(head)
	if err != nil {
		return err
	}
	var edited []string
	consider := func(p string) {
		h := headFiles[p]
		if h != mbFiles[p] && h != baseFiles[p] && !slices.Contains(edited, p) {
			edited = append(edited, p)
		}
	}
	for p := range headFiles {
		consider(p)
	}
	for p := range mbFiles {
		consider(p) // deleted by the change
	}
	if len(edited) == 0 {
		return nil
	}
	slices.Sort(edited)
	return &StatusEditError{Paths: edited}
}

// statusFiles maps every file under status/ of c to its blob (a submodule
// or symlink counts as a file).
func statusFiles(c *object.Commit) (map[string]plumbing.Hash, error) {
	out := map[string]plumbing.Hash{}
	tree, err := c.Tree()
	if err != nil {
		return nil, fmt.Errorf("check status: read tree of %s: %w", c.Hash, err)
	}
	e, err := tree.FindEntry(statusDir)
	if errors.Is(err, object.ErrEntryNotFound) || errors.Is(err, object.ErrDirectoryNotFound) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("check status: find status/: %w", err)
	}
	if e.Mode != filemode.Dir {
		out[statusDir] = e.Hash
		return out, nil
	}
	st, err := tree.Tree(statusDir)
	if err != nil {
		return nil, fmt.Errorf("check status: read status/: %w", err)
	}
	w := object.NewTreeWalker(st, true, nil)
	defer w.Close()
	for {
		name, ent, err := w.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("check status: walk status/: %w", err)
		}
		if ent.Mode != filemode.Dir {
			out[statusDir+"/"+name] = ent.Hash
		}
	}
	return out, nil
}
