package gitops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/machina-metal/machina/discover"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/redact"
)

// ErrNothingToPropose: the edit left servers.yaml as it was (every entry
// is in the inventory branch already); nothing was committed.
var ErrNothingToPropose = errors.New("nothing to propose")

// ProposerConfig configures a [Proposer]. Every zero value is usable
// except Remote.URL and StateDir.
type ProposerConfig struct {
	// Remote is the inventory repository (its Branch is the base).
	Remote Remote
	// StateDir holds the Proposer's own clone (StateDir/proposals.git),
	// next to the Git source's and the status writer's.
	StateDir string
	// CommitTo, when set, commits straight onto this branch, which must be
	// the inventory branch (as `machinactl scan --register --commit-to
	// main`); "" pushes each proposal to a new review branch
	// "discovered/YYYY-MM-DD" ("-2", "-3"... when taken).
	CommitTo string
	// BranchPrefix names the review branches, PREFIX/YYYY-MM-DD[-N]; ""
	// means "discovered" (auto-enrol's).
	BranchPrefix string
	// Timeout bounds one proposal (fetch, commit, push, retries); zero
	// means 2 minutes.
	Timeout time.Duration
	// Now is the clock of commit times and branch dates; nil means time.Now.
	Now func() time.Time
	// Logger: nil discards.
	Logger *slog.Logger
}

// Proposal is a pushed commit proposing servers.yaml entries.
type Proposal struct {
	Branch string `json:"branch"`
	Commit string `json:"commit"`
}

// Proposer pushes proposed changes of servers.yaml to the inventory
// repository for review: it fetches the inventory branch into a private
// bare clone, lets the caller edit servers.yaml, validates the result
// against the branch's profiles.yaml and images.yaml (discover.Commit),
// and pushes the commit to a new branch without force. Safe for concurrent
// use (proposals run one at a time).
type Proposer struct {
	cfg ProposerConfig
	dir string
	log *slog.Logger
	mu  sync.Mutex
}

// NewProposer checks cfg and prepares the clone.
func NewProposer(cfg ProposerConfig) (*Proposer, error) {
	if cfg.StateDir == "" {
		return nil, errors.New("reconciler: ProposerConfig.StateDir is required")
	}
	if cfg.CommitTo != "" && cfg.CommitTo != cfg.Remote.branch() {
		return nil, fmt.Errorf("reconciler: proposals: only the inventory branch %s can be committed to directly, not %q", cfg.Remote.branch(), cfg.CommitTo)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Proposer{cfg: cfg, dir: filepath.Join(cfg.StateDir, "proposals.git"), log: cfg.Logger}
	if _, err := openBare(p.dir, cfg.Remote); err != nil {
		return nil, fmt.Errorf("reconciler: proposals: %w", err)
	}
	return p, nil
}

// Propose fetches the inventory branch, calls edit with its servers.yaml
// and validated inventory, and commits what edit returns as servers.yaml
// with message, then pushes it (a new review branch, or the inventory
// branch with CommitTo). edit returning nil bytes means there is nothing
// to propose (ErrNothingToPropose). A push that loses a race (the branch
// name was taken, or the inventory branch moved) is redone from a fresh
// fetch, up to five times. The commit is validated before it is pushed:
// an edit that would make the inventory invalid returns the
// *inventory.ValidationError and pushes nothing.
func (p *Proposer) Propose(ctx context.Context, message string, edit func(servers []byte, inv *inventory.Inventory) ([]byte, error)) (Proposal, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	o, err := p.cfg.Remote.options()
	if err != nil {
		return Proposal{}, fmt.Errorf("propose: %w", err)
	}
	o = o.withLogger(p.log)
	for attempt := 1; ; attempt++ {
		prop, err := p.once(ctx, o, message, edit)
		if err == nil || !errors.Is(err, errRemoteMoved) || attempt == 5 {
			if err != nil {
				return Proposal{}, fmt.Errorf("propose: %w", err)
			}
			p.log.Info("proposal pushed", "branch", prop.Branch, "commit", prop.Commit[:12])
			return prop, nil
		}
		p.log.Debug("proposal push lost a race; retrying", "attempt", attempt, "err", err)
	}
}

func (p *Proposer) once(ctx context.Context, o transportOptions, message string, edit func([]byte, *inventory.Inventory) ([]byte, error)) (Proposal, error) {
	base := p.cfg.Remote.branch()
	repo, err := openBare(p.dir, p.cfg.Remote)
	if err != nil {
		return Proposal{}, err
	}
	// Depth 1: a proposal needs only the tip's tree (the push sends just
	// the new commit, tree and servers.yaml), not the branch's history of
	// status commits.
	tip, err := fetchBranch(ctx, repo, o, base, 1)
	if err != nil {
		return Proposal{}, err
	}
	// The clone is private: its local base branch is the remote's tip, the
	// start of every proposal.
	baseRef := plumbing.NewBranchReferenceName(base)
	if err := repo.Storer.SetReference(plumbing.NewHashReference(baseRef, tip)); err != nil {
		return Proposal{}, fmt.Errorf("set %s: %w", base, err)
	}
	raw, inv, err := discover.ReadInventory(p.dir, base)
	if err != nil {
		return Proposal{}, err
	}
	servers, err := edit(raw, inv)
	if err != nil {
		return Proposal{}, err
	}
	if servers == nil || string(servers) == string(raw) {
		return Proposal{}, ErrNothingToPropose
	}
	target, old := base, tip
	if p.cfg.CommitTo == "" {
		if target, err = p.freeBranch(ctx, repo, o); err != nil {
			return Proposal{}, err
		}
		old = plumbing.ZeroHash
		defer func() { _ = repo.Storer.RemoveReference(plumbing.NewBranchReferenceName(target)) }()
	}
	now := p.cfg.Now()
	sig := object.Signature{Name: "Machina auto-enrol", Email: "auto-enrol@machina.invalid", When: now}
	h, err := discover.Commit(discover.Change{Repo: p.dir, Base: base, Branch: target, Message: message, Author: sig}, servers)
	if err != nil {
		return Proposal{}, err
	}
	// A fresh handle sees the loose objects discover.Commit wrote.
	fresh, err := git.PlainOpen(p.dir)
	if err != nil {
		return Proposal{}, fmt.Errorf("reopen clone: %w", err)
	}
	c, err := fresh.CommitObject(h)
	if err != nil {
		return Proposal{}, fmt.Errorf("read commit: %w", err)
	}
	tree, err := c.Tree()
	if err != nil {
		return Proposal{}, fmt.Errorf("read tree: %w", err)
	}
	f, err := tree.File(inventory.ServersFile)
	if err != nil {
		return Proposal{}, fmt.Errorf("read %s: %w", inventory.ServersFile, err)
	}
	// The remote has the base commit and everything below it: the new
	// commit, its root tree and the new servers.yaml blob are all it lacks.
	pack, err := encodePack(fresh.Storer, []plumbing.Hash{h, c.TreeHash, f.Hash})
	if err != nil {
		return Proposal{}, err
	}
	if err := pushPack(ctx, o, target, old, h, pack.data); err != nil {
		return Proposal{}, err
	}
	return Proposal{Branch: target, Commit: h.String()}, nil
}

// freeBranch returns the first "discovered/YYYY-MM-DD[-N]" (or
// BranchPrefix's) the remote
// does not have. A name taken between this check and the push fails the
// push (its old value is zero) and the proposal is redone.
func (p *Proposer) freeBranch(ctx context.Context, repo *git.Repository, o transportOptions) (string, error) {
	rem, err := repo.Remote(remoteName)
	if err != nil {
		return "", err
	}
	op, o := startOp(ctx, o, "ls-remote")
	refs, err := rem.ListContext(op.ctx, &git.ListOptions{Auth: o.auth, CABundle: o.caBundle, ProxyOptions: o.proxy})
	if err = op.done(err); err != nil {
		return "", fmt.Errorf("list remote %s: %w", redact.String(o.url), err)
	}
	taken := map[string]bool{}
	for _, r := range refs {
		if r.Name().IsBranch() {
			taken[r.Name().Short()] = true
		}
	}
	prefix := p.cfg.BranchPrefix
	if prefix == "" {
		prefix = "discovered"
	}
	day := prefix + "/" + p.cfg.Now().UTC().Format("2006-01-02")
	for i := 1; i <= 1000; i++ {
		name := day
		if i > 1 {
			name = fmt.Sprintf("%s-%d", day, i)
		}
		if !taken[name] {
			_ = repo.Storer.RemoveReference(plumbing.NewBranchReferenceName(name)) // a stale local one
			return name, nil
		}
	}
	return "", fmt.Errorf("no free branch name for %s", day)
}
