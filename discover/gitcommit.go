package discover

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing/fstest"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/machina-metal/machina/inventory"
)

// ErrBranchExists reports a proposal branch that already exists.
var ErrBranchExists = errors.New("discover: branch exists")

// ErrDirty reports a servers.yaml with uncommitted changes in the checked-out
// worktree the commit would land on.
var ErrDirty = errors.New("discover: servers.yaml has uncommitted changes")

// ErrStaged reports other changes staged in the checked-out worktree the
// commit would land on: a worktree commit records the whole index, so they
// would be committed too, unvalidated, under the discovery's message.
var ErrStaged = errors.New("discover: other changes are staged")

// ErrNoChange is returned by Commit when the new servers.yaml is the base
// branch's, byte for byte: there is nothing to commit.
var ErrNoChange = errors.New("discover: servers.yaml unchanged")

// Change is one commit of a new servers.yaml onto an inventory repository.
type Change struct {
	// Repo is the path of a local clone (a working tree or a bare repo).
	Repo string
	// Base is the branch the change starts from; "" means "main".
	Base string
	// Branch is the branch the commit lands on: Base itself (commit
	// straight on it) or a new branch created at Base's head, which must
	// not exist yet (ErrBranchExists).
	Branch string
	// Message is the commit message.
	Message string
	// Author is the commit author; zero means "Machina discovery".
	Author object.Signature
	// Context, when set, is checked after validation and before anything
	// is written: an interrupted command (Ctrl-C while a large import
	// validates) commits nothing and gets its error.
	Context context.Context
}

// openRepo opens the repository at path: a bare repository or a working
// tree's root, else the working tree path is inside (go-git's DetectDotGit
// alone walks up past a bare repository and never finds it).
func openRepo(path string) (*git.Repository, error) {
	repo, err := git.PlainOpen(path)
	if errors.Is(err, git.ErrRepositoryNotExists) {
		repo, err = git.PlainOpenWithOptions(path, &git.PlainOpenOptions{DetectDotGit: true})
	}
	return repo, err
}

// baseFiles reads the inventory files of the head of branch base.
func baseFiles(repo *git.Repository, base string) (*object.Commit, map[string][]byte, error) {
	ref, err := repo.Reference(plumbing.NewBranchReferenceName(base), true)
	if err != nil {
		return nil, nil, fmt.Errorf("discover: branch %s: %w", base, err)
	}
	c, err := repo.CommitObject(ref.Hash())
	if err != nil {
		return nil, nil, fmt.Errorf("discover: commit of %s: %w", base, err)
	}
	files := map[string][]byte{}
	for _, name := range inventory.Files {
		f, err := c.File(name)
		if errors.Is(err, object.ErrFileNotFound) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("discover: read %s at %s: %w", name, base, err)
		}
		r, err := f.Reader()
		if err != nil {
			return nil, nil, fmt.Errorf("discover: read %s at %s: %w", name, base, err)
		}
		b, err := io.ReadAll(io.LimitReader(r, 16<<20))
		r.Close()
		if err != nil {
			return nil, nil, fmt.Errorf("discover: read %s at %s: %w", name, base, err)
		}
		files[name] = b
	}
	return c, files, nil
}

// ReadInventory returns the raw servers.yaml of the head of branch base of
// the clone at repoPath and the validated inventory it belongs to.
func ReadInventory(repoPath, base string) ([]byte, *inventory.Inventory, error) {
	repo, err := openRepo(repoPath)
	if err != nil {
		return nil, nil, fmt.Errorf("discover: open repository %s: %w", repoPath, err)
	}
	if base == "" {
		base = "main"
	}
	_, files, err := baseFiles(repo, base)
	if err != nil {
		return nil, nil, err
	}
	res, err := inventory.Load(mapFS(files), inventory.Limits{})
	if err != nil {
		return nil, nil, fmt.Errorf("discover: inventory at %s: %w", base, err)
	}
	return files[inventory.ServersFile], res.Inventory, nil
}

func mapFS(files map[string][]byte) fstest.MapFS {
	m := fstest.MapFS{}
	for n, b := range files {
		m[n] = &fstest.MapFile{Data: b, Mode: 0o644}
	}
	return m
}

// Validate loads the inventory of base with servers.yaml replaced by
// servers, returning inventory.Load's *inventory.ValidationError when the
// result would be invalid.
func Validate(repoPath, base string, servers []byte) (*inventory.Inventory, error) {
	repo, err := openRepo(repoPath)
	if err != nil {
		return nil, fmt.Errorf("discover: open repository %s: %w", repoPath, err)
	}
	if base == "" {
		base = "main"
	}
	_, files, err := baseFiles(repo, base)
	if err != nil {
		return nil, err
	}
	files[inventory.ServersFile] = servers
	res, err := inventory.Load(mapFS(files), inventory.Limits{})
	if err != nil {
		return nil, fmt.Errorf("discover: proposed inventory: %w", err)
	}
	return res.Inventory, nil
}

// Commit validates servers (the whole new servers.yaml) against Base's
// profiles.yaml and images.yaml with inventory.Load, then commits it. When
// Branch is checked out in a working tree the commit goes through the
// worktree (servers.yaml there must be unmodified, ErrDirty, and nothing
// else staged, ErrStaged); otherwise the
// commit is written as objects and the branch ref set, leaving any checkout
// untouched. It returns the new commit's hash, or ErrNoChange when servers
// is Base's servers.yaml unchanged.
func Commit(ch Change, servers []byte) (plumbing.Hash, error) {
	if ch.Base == "" {
		ch.Base = "main"
	}
	if ch.Branch == "" {
		ch.Branch = ch.Base
	}
	if !plumbing.NewBranchReferenceName(ch.Branch).IsBranch() || ch.Branch != filepath.ToSlash(filepath.Clean(ch.Branch)) {
		return plumbing.ZeroHash, fmt.Errorf("discover: branch name %q", ch.Branch)
	}
	if ch.Author.Name == "" {
		ch.Author = object.Signature{Name: "Machina discovery", Email: "discovery@machina.invalid"}
	}
	if ch.Author.When.IsZero() {
		ch.Author.When = time.Now()
	}
	repo, err := openRepo(ch.Repo)
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("discover: open repository %s: %w", ch.Repo, err)
	}
	baseCommit, files, err := baseFiles(repo, ch.Base)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	if old, ok := files[inventory.ServersFile]; ok && bytes.Equal(old, servers) {
		return plumbing.ZeroHash, fmt.Errorf("%w: %s on %s", ErrNoChange, inventory.ServersFile, ch.Base)
	}
	files[inventory.ServersFile] = servers
	if _, err := inventory.Load(mapFS(files), inventory.Limits{}); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("discover: proposed inventory: %w", err)
	}
	if ch.Context != nil {
		if err := ch.Context.Err(); err != nil {
			return plumbing.ZeroHash, fmt.Errorf("discover: interrupted, nothing committed: %w", err)
		}
	}
	target := plumbing.NewBranchReferenceName(ch.Branch)
	if ch.Branch != ch.Base {
		if _, err := repo.Reference(target, false); err == nil {
			return plumbing.ZeroHash, fmt.Errorf("%w: %s", ErrBranchExists, ch.Branch)
		}
	}
	head, herr := repo.Head()
	if wt, err := repo.Worktree(); err == nil && herr == nil && head.Name() == target {
		return commitInWorktree(wt, ch, servers)
	}
	h, err := commitObjects(repo, baseCommit, ch, servers)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	if err := repo.Storer.SetReference(plumbing.NewHashReference(target, h)); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("discover: set %s: %w", ch.Branch, err)
	}
	return h, nil
}

func commitInWorktree(wt *git.Worktree, ch Change, servers []byte) (plumbing.Hash, error) {
	st, err := wt.Status()
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("discover: worktree status: %w", err)
	}
	// Status lists only files that differ from HEAD (File() would invent
	// an Untracked entry for a clean one).
	if fs, ok := st[inventory.ServersFile]; ok && (fs.Worktree != git.Unmodified || fs.Staging != git.Unmodified) {
		return plumbing.ZeroHash, fmt.Errorf("%w (worktree %c, staging %c)", ErrDirty, fs.Worktree, fs.Staging)
	}
	var staged []string
	for path, fs := range st {
		if fs.Staging != git.Unmodified && fs.Staging != git.Untracked {
			staged = append(staged, path)
		}
	}
	if len(staged) > 0 {
		slices.Sort(staged)
		return plumbing.ZeroHash, fmt.Errorf("%w: %s (commit or unstage them first)", ErrStaged, strings.Join(staged, ", "))
	}
	path := filepath.Join(wt.Filesystem.Root(), inventory.ServersFile)
	if err := os.WriteFile(path, servers, 0o644); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("discover: write %s: %w", path, err)
	}
	if _, err := wt.Add(inventory.ServersFile); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("discover: stage %s: %w", inventory.ServersFile, err)
	}
	sig := ch.Author
	h, err := wt.Commit(ch.Message, &git.CommitOptions{Author: &sig, Committer: &sig})
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("discover: commit: %w", err)
	}
	return h, nil
}

// commitObjects writes a blob, a root tree with servers.yaml replaced and
// a commit whose parent is base, without touching any working tree.
func commitObjects(repo *git.Repository, base *object.Commit, ch Change, servers []byte) (plumbing.Hash, error) {
	s := repo.Storer
	blob := s.NewEncodedObject()
	blob.SetType(plumbing.BlobObject)
	w, err := blob.Writer()
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("discover: write blob: %w", err)
	}
	if _, err := w.Write(servers); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("discover: write blob: %w", err)
	}
	w.Close()
	bh, err := s.SetEncodedObject(blob)
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("discover: store blob: %w", err)
	}
	tree, err := base.Tree()
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("discover: base tree: %w", err)
	}
	entries := slices.Clone(tree.Entries)
	found := false
	for i := range entries {
		if entries[i].Name == inventory.ServersFile {
			entries[i].Hash, entries[i].Mode, found = bh, filemode.Regular, true
		}
	}
	if !found {
		entries = append(entries, object.TreeEntry{Name: inventory.ServersFile, Mode: filemode.Regular, Hash: bh})
		slices.SortFunc(entries, func(a, b object.TreeEntry) int { return compareTreeNames(a, b) })
	}
	nt := &object.Tree{Entries: entries}
	to := s.NewEncodedObject()
	if err := nt.Encode(to); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("discover: encode tree: %w", err)
	}
	th, err := s.SetEncodedObject(to)
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("discover: store tree: %w", err)
	}
	c := &object.Commit{Author: ch.Author, Committer: ch.Author, Message: ch.Message, TreeHash: th, ParentHashes: []plumbing.Hash{base.Hash}}
	co := s.NewEncodedObject()
	if err := c.Encode(co); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("discover: encode commit: %w", err)
	}
	ch2, err := s.SetEncodedObject(co)
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("discover: store commit: %w", err)
	}
	return ch2, nil
}

// compareTreeNames orders entries as Git does: directories compare as if
// their name ended in "/".
func compareTreeNames(a, b object.TreeEntry) int {
	an, bn := a.Name, b.Name
	if a.Mode == filemode.Dir {
		an += "/"
	}
	if b.Mode == filemode.Dir {
		bn += "/"
	}
	switch {
	case an < bn:
		return -1
	case an > bn:
		return 1
	}
	return 0
}

func isBranchExists(err error) bool { return errors.Is(err, ErrBranchExists) }
