// Package gitops is Machina's Git side: everything that reads or writes
// the inventory repository, and nothing that talks to a BMC.
//
//   - [Source] polls the inventory branch (auth: [Remote], over HTTPS with a
//     token or SSH with a pinned host key) and yields validated revisions
//     identified by their inventory digest; an invalid newest revision is
//     reported ([InvalidRevision]) while the last good one stays desired.
//   - [StatusWriter] renders a [Snapshot] of the fleet (built by
//     [StatusBuilder] from the store and a plan [plan.Result]) to
//     status/ and commits it; [CheckStatusUntouched] tells CI that a change
//     edits status/ by hand.
//   - [Enroller] enrols machines that PXE-boot with an unknown MAC (a
//     boot.Enroller) and [Proposer] pushes their servers.yaml entries for
//     review.
//
// gitops imports the plan (reconciler/plan) for the types status reports,
// never the executor (reconciler) or a bmc package; the reconciler imports
// no Git package and never gitops: the controller hands it each good
// revision's inventory (SetDesired).
package gitops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing/fstest"
	"time"

	"github.com/go-git/go-billy/v5/osfs"
	git "github.com/go-git/go-git/v5"
	gitconfig "github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/filesystem"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/redact"
)

// Errors of the Git source. Compare with errors.Is.
var (
	// ErrBranchNotFound means the remote has no such branch.
	ErrBranchNotFound = errors.New("branch not found on remote")
	// ErrAlreadyRunning is returned by a second concurrent Run.
	ErrAlreadyRunning = errors.New("already running")
)

// Revision is one valid desired state. Its identity is Digest (see
// inventory.Inventory.Digest); Commit is the first commit seen with that
// digest. The zero Revision means none has been accepted yet.
type Revision struct {
	// Commit is the 40-hex commit id where this digest was first seen.
	Commit string
	// Digest is "sha256:<hex>" of the normalised inventory.
	Digest string
	// Inventory is the parsed revision; shared, treat as read-only.
	Inventory *inventory.Inventory
	// Warnings are the inventory warnings of this revision, sorted.
	Warnings []inventory.FieldError
}

// InvalidRevision is the newest commit whose inventory failed validation.
type InvalidRevision struct {
	// Commit is the 40-hex commit id.
	Commit string `json:"commit"`
	// Errors are every problem found, sorted by file and line (from
	// *inventory.ValidationError); a file that could not be read at all is
	// one entry with Line 0. Messages are redacted.
	Errors []inventory.FieldError `json:"errors"`
}

// SourceEventKind says what a [SourceEvent] reports.
type SourceEventKind string

// Source event kinds, CamelCase like condition reasons.
const (
	// SourceNewRevision: a commit with a new valid digest became the
	// desired state.
	SourceNewRevision SourceEventKind = "NewRevision"
	// SourceInvalidRevision: the newest commit's inventory is invalid; the
	// last good revision stays in force.
	SourceInvalidRevision SourceEventKind = "InvalidRevision"
	// SourceRevisionFixed: the branch tip is valid again after an invalid
	// one (whether or not its digest is new).
	SourceRevisionFixed SourceEventKind = "RevisionFixed"
	// SourceHistoryRewritten: the branch moved to a commit that does not
	// descend from the previous tip (a force-push); the new head is the
	// new desired state.
	SourceHistoryRewritten SourceEventKind = "HistoryRewritten"
	// SourceRemoteUnreachable: polling failed; reported once per outage.
	SourceRemoteUnreachable SourceEventKind = "RemoteUnreachable"
	// SourceRemoteRecovered: polling works again after an outage.
	SourceRemoteRecovered SourceEventKind = "RemoteRecovered"
)

// SourceEvent is one change the source observed.
type SourceEvent struct {
	Kind SourceEventKind
	// Commit is the commit the event is about ("" for remote events).
	Commit string
	// Previous is the branch tip before (HistoryRewritten) or the previous
	// good commit (NewRevision).
	Previous string
	// Digest is the inventory digest for NewRevision and RevisionFixed.
	Digest string
	// Message is a one-line, redacted explanation.
	Message string
}

// SourceConfig configures a [Source]. Zero values are usable except Remote.URL
// and StateDir.
type SourceConfig struct {
	// Remote is the inventory repository and its credentials.
	Remote Remote
	// Dir is the folder inside the repository that holds servers.yaml,
	// profiles.yaml and images.yaml; "" means the root.
	Dir string
	// StateDir is where the source keeps its bare, single-branch clone
	// (StateDir/inventory.git) and the last good commit. Required.
	StateDir string
	// Interval is the time between two polls of the branch tip; zero
	// means 30s. Each wait is jittered by ±10%.
	Interval time.Duration
	// MaxBackoff caps the wait after repeated failures; zero means 1m.
	// The wait doubles from Interval on each consecutive failure. Each
	// poll during an outage begins with ls-remote (one small request), so
	// the cap stays short: a recovered remote, or a fixed credential, is
	// picked up within about a minute. Trigger (a webhook) polls at once.
	MaxBackoff time.Duration
	// Timeout bounds one poll (list, fetch and validation); zero means 2m.
	Timeout time.Duration
	// Limits bound what inventory.Load reads.
	Limits inventory.Limits
	// OnEvent, if non-nil, is called from Run's goroutine for every
	// event. It must not block for long or call Run.
	OnEvent func(SourceEvent)
	// Logger receives Info for new revisions, Warn for invalid ones and
	// outages, Debug for polls; nil discards.
	Logger *slog.Logger
}

// Source polls the inventory branch and keeps the last good [Revision].
// Create it with [NewSource]; Latest, Trigger and Changed are safe for
// concurrent use, Run is called once.
type Source struct {
	cfg     SourceConfig
	log     *slog.Logger
	repo    *git.Repository
	trigger chan struct{}
	changed chan struct{}
	running atomic.Bool
	polled  atomic.Bool

	// owned by Run's goroutine
	tip      plumbing.Hash
	treeKey  string
	failures int
	pollHook func() // tests: called at the start of each Poll
	maxPacks int    // packfiles before the clone is compacted (gitsource_compact.go)

	mu      sync.Mutex
	good    Revision
	invalid *InvalidRevision
	lastErr error
	// health, remoteTip, pacer and now: gitsource_health.go.
	health    SourceHealth
	remoteTip plumbing.Hash
	pacer     failurePacer
	now       func() time.Time
}

// DefaultMaxBackoff is SourceConfig.MaxBackoff's default.
const DefaultMaxBackoff = time.Minute

const (
	remoteName   = "origin"
	lastGoodFile = "last-good"
)

// NewSource opens or creates the clone under cfg.StateDir and restores the
// last good revision recorded there (if its commit is still present and
// valid), so a restart with an invalid branch tip keeps acting on it. It
// does no network I/O.
func NewSource(cfg SourceConfig) (*Source, error) {
	if cfg.StateDir == "" {
		return nil, fmt.Errorf("git source: %w: empty StateDir", ErrRemoteConfig)
	}
	if _, _, err := cfg.Remote.parse(); err != nil {
		return nil, fmt.Errorf("git source: %w", err)
	}
	if cfg.Dir != "" {
		cfg.Dir = path.Clean(strings.Trim(filepath.ToSlash(cfg.Dir), "/"))
		if cfg.Dir == "." {
			cfg.Dir = ""
		}
		if !fs.ValidPath(cfg.Dir) {
			return nil, fmt.Errorf("git source: %w: bad Dir %q", ErrRemoteConfig, cfg.Dir)
		}
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 30 * time.Second
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	repo, err := openBare(filepath.Join(cfg.StateDir, "inventory.git"), cfg.Remote)
	if err != nil {
		return nil, fmt.Errorf("git source: %w", err)
	}
	s := &Source{
		cfg:      cfg,
		log:      log.With("component", "gitsource", "branch", cfg.Remote.branch()),
		repo:     repo,
		trigger:  make(chan struct{}, 1),
		changed:  make(chan struct{}, 1),
		maxPacks: sourceMaxPacks,
	}
	s.restoreLastGood()
	return s, nil
}

// dropTornRefs removes empty remote-tracking ref files from the clone in
// dir. go-git writes a loose ref in place (truncate, then write), so a
// controller killed mid-fetch can leave refs/remotes/origin/BRANCH empty,
// and every later fetch then failed with "ref file is empty": the
// controller stayed on its last good revision for good. Remote-tracking
// refs only mirror the remote; the next fetch writes them again.
func dropTornRefs(dir string) error {
	root := filepath.Join(dir, "refs", "remotes")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.Type().IsRegular() {
			if info, err := d.Info(); err == nil && info.Size() == 0 {
				return os.Remove(path)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("clone %s: drop torn refs: %w", dir, err)
	}
	return nil
}

// openBare opens dir as a bare repository with filesystem storage and a
// bounded object cache, creating it if needed, with remote origin set to
// r's URL.
func openBare(dir string, r Remote) (*git.Repository, error) {
	registerOpDialer()
	_, u, err := r.parse()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create clone dir: %w", err)
	}
	// 4 MiB holds a 10,000-server servers.yaml (about 2 MiB) and the
	// status trees a write reads; every clone has its own cache, and at
	// 16 MiB the caches alone were a tenth of a 10,000-server controller's
	// live heap.
	if err := dropTornRefs(dir); err != nil {
		return nil, err
	}
	st := filesystem.NewStorage(osfs.New(dir), cache.NewObjectLRU(4*cache.MiByte))
	var repo *git.Repository
	if _, err := os.Stat(filepath.Join(dir, "HEAD")); err == nil {
		repo, err = git.Open(st, nil)
		if err != nil {
			return nil, fmt.Errorf("open clone %s: %w", dir, err)
		}
	} else {
		repo, err = git.Init(st, nil)
		if err != nil {
			return nil, fmt.Errorf("init clone %s: %w", dir, err)
		}
	}
	cfg, err := repo.Config()
	if err != nil {
		return nil, fmt.Errorf("read clone config: %w", err)
	}
	want := &gitconfig.RemoteConfig{Name: remoteName, URLs: []string{u}, Fetch: []gitconfig.RefSpec{
		gitconfig.RefSpec("+refs/heads/" + r.branch() + ":refs/remotes/" + remoteName + "/" + r.branch()),
	}}
	cfg.Remotes[remoteName] = want
	if err := repo.SetConfig(cfg); err != nil {
		return nil, fmt.Errorf("write clone config: %w", err)
	}
	return repo, nil
}

// Latest returns the last good revision (zero if none yet) and, if the
// newest commit seen is invalid, that commit and its errors (nil when the
// tip is valid). Safe for concurrent use.
func (s *Source) Latest() (good Revision, invalid *InvalidRevision) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.good, s.invalid
}

// DesiredRevision implements reconciler.Revisions (the interface the
// executor declares; the controller hands a *Source to
// reconciler.Controller.Follow, which checks it at compile time): the
// newest good revision's inventory and digest, and whether the newest
// revision is invalid. Safe for concurrent use.
func (s *Source) DesiredRevision() (inv *inventory.Inventory, digest string, invalid bool) {
	good, bad := s.Latest()
	return good.Inventory, good.Digest, bad != nil
}

// InventoryStatus returns Latest in the form [Snapshot] carries, for the
// status writer. Safe for concurrent use.
func (s *Source) InventoryStatus() InventoryStatus {
	good, invalid := s.Latest()
	return InventoryStatus{Good: RevisionRef{Commit: good.Commit, Digest: good.Digest}, Invalid: invalid}
}

// Polled reports whether a poll has finished (succeeded or failed) since
// NewSource. Until then a new controller knows no revision, and what it
// would write to status would name none. Safe for concurrent use.
func (s *Source) Polled() bool { return s.polled.Load() }

// Err returns the error of the last poll, nil if it succeeded. Safe for
// concurrent use.
func (s *Source) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}

// Trigger asks Run to poll now ("POST /api/v1/reconcile"). It never blocks;
// triggers while a poll is pending coalesce.
func (s *Source) Trigger() {
	select {
	case s.trigger <- struct{}{}:
	default:
	}
}

// Changed receives a value (coalesced) whenever Latest's answer changed:
// a new good revision, a new invalid one, or the invalid one cleared.
func (s *Source) Changed() <-chan struct{} { return s.changed }

// Run polls until ctx is done, then returns nil. Each poll lists the
// remote's branch tip and fetches only when it moved; an unreachable remote
// is retried with capped, jittered exponential backoff while the last good
// revision stays in force. A second concurrent Run returns
// ErrAlreadyRunning.
func (s *Source) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return fmt.Errorf("git source: run: %w", ErrAlreadyRunning)
	}
	defer s.running.Store(false)
	for {
		_ = s.Poll(ctx) // kept for Err and reported as events by Poll
		if ctx.Err() != nil {
			return nil
		}
		t := time.NewTimer(backoffDelay(s.cfg.Interval, s.cfg.MaxBackoff, s.failures, rand.Float64()))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-s.trigger:
			t.Stop()
		case <-t.C:
		}
	}
}

// backoffDelay is the wait before the next poll: Interval after a success,
// Interval·2^(failures-1) capped at maxBackoff after failures, each ±10%
// by r in [0,1).
func backoffDelay(interval, maxBackoff time.Duration, failures int, r float64) time.Duration {
	d := interval
	for i := 1; i < failures && d < maxBackoff; i++ {
		d *= 2
	}
	if failures > 0 && d > maxBackoff {
		d = maxBackoff
	}
	jitter := time.Duration((r*0.2 - 0.1) * float64(d))
	return d + jitter
}

// Poll performs one poll synchronously: list the remote tip, fetch if it
// moved, validate. Run calls it; it is exported for one-shot tools
// (machinactl) and must not run concurrently with Run. The error is also
// kept for Err.
func (s *Source) Poll(ctx context.Context) error {
	if s.pollHook != nil {
		s.pollHook()
	}
	pctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	err := s.poll(pctx)
	if err != nil && ctx.Err() != nil {
		return err // shutting down: not an outage
	}
	s.mu.Lock()
	s.lastErr = err
	s.mu.Unlock()
	s.polled.Store(true)
	if err != nil {
		s.failures++
		s.notePoll(err, s.failures)
		if s.failures == 1 {
			msg := redact.String(err.Error())
			if needsPerson(err) {
				s.log.Error("inventory remote refuses the controller (credentials or permission), keeping last good revision", "err", msg)
			} else {
				s.log.Warn("inventory remote unreachable, keeping last good revision", "err", msg)
			}
			s.emit(SourceEvent{Kind: SourceRemoteUnreachable, Message: msg})
		}
		return err
	}
	if s.failures > 0 {
		s.log.Info("inventory remote reachable again", "failures", s.failures)
		s.emit(SourceEvent{Kind: SourceRemoteRecovered, Message: fmt.Sprintf("reachable after %d failed polls", s.failures)})
	}
	s.failures = 0
	s.notePoll(nil, 0)
	return nil
}

func (s *Source) poll(ctx context.Context) error {
	o, err := s.cfg.Remote.options()
	if err != nil {
		return fmt.Errorf("git source: %w", err)
	}
	o = o.withLogger(s.log)
	tip, err := remoteTip(ctx, s.repo, o, s.cfg.Remote.branch())
	if err != nil {
		return fmt.Errorf("git source: %w", err)
	}
	s.noteRemoteTip(tip)
	if tip == s.tip {
		s.log.Debug("branch tip unchanged", "commit", tip.String())
		return nil
	}
	if _, err := s.repo.CommitObject(tip); err != nil {
		// The branch may move again between list and fetch: go on with
		// what the fetch brought.
		if tip, err = fetchBranch(ctx, s.repo, o, s.cfg.Remote.branch(), s.fetchDepth()); err != nil {
			return fmt.Errorf("git source: %w", err)
		}
		if tip, err = s.ensureFetched(ctx, o, tip); err != nil {
			return fmt.Errorf("git source: %w", err)
		}
		if tip, err = s.deepenPastStatus(ctx, o, tip); err != nil {
			return fmt.Errorf("git source: %w", err)
		}
		s.noteRemoteTip(tip) // the branch may have moved since the list
	}
	commit, err := s.repo.CommitObject(tip)
	if err != nil {
		return fmt.Errorf("git source: read commit %s: %w", tip, err)
	}
	prev := s.tip
	rewritten := false
	if !prev.IsZero() {
		if old, err := s.repo.CommitObject(prev); err == nil {
			if ok, err := old.IsAncestor(commit); err == nil && !ok {
				msg := fmt.Sprintf("branch %s moved from %s to %s, which does not descend from it", s.cfg.Remote.branch(), short(prev), short(tip))
				rewritten = true
				s.log.Warn("inventory history rewritten", "from", prev.String(), "to", tip.String())
				s.emit(SourceEvent{Kind: SourceHistoryRewritten, Commit: tip.String(), Previous: prev.String(), Message: msg})
			}
		}
	}
	if err := s.evaluate(commit, false, rewritten); err != nil {
		return err
	}
	s.tip = tip
	s.compactIfNeeded(s.maxPacks)
	return nil
}

// remoteTip asks the remote for its branch tip (git ls-remote).
func remoteTip(ctx context.Context, repo *git.Repository, o transportOptions, branch string) (plumbing.Hash, error) {
	rem, err := repo.Remote(remoteName)
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("list remote: %w", err)
	}
	op, o := startOp(ctx, o, "ls-remote")
	refs, err := rem.ListContext(op.ctx, &git.ListOptions{Auth: o.auth, CABundle: o.caBundle, ProxyOptions: o.proxy})
	if err = op.done(err); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("list remote %s: %w", redact.String(o.url), err)
	}
	want := plumbing.NewBranchReferenceName(branch)
	for _, r := range refs {
		if r.Name() == want && r.Type() == plumbing.HashReference {
			return r.Hash(), nil
		}
	}
	return plumbing.ZeroHash, fmt.Errorf("list remote %s: %s: %w", redact.String(o.url), branch, ErrBranchNotFound)
}

// fetchBranch fetches the single branch into refs/remotes/origin/BRANCH,
// accepting rewritten history, and returns the commit fetched (the tip at
// the time of the fetch); depth > 0 makes a shallow fetch of that many
// commits.
func fetchBranch(ctx context.Context, repo *git.Repository, o transportOptions, branch string, depth int) (plumbing.Hash, error) {
	rem, err := repo.Remote(remoteName)
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("fetch: %w", err)
	}
	local := plumbing.NewRemoteReferenceName(remoteName, branch)
	op, o := startOp(ctx, o, "fetch")
	err = rem.FetchContext(op.ctx, &git.FetchOptions{
		RefSpecs:     []gitconfig.RefSpec{gitconfig.RefSpec("+refs/heads/" + branch + ":" + string(local))},
		Auth:         o.auth,
		CABundle:     o.caBundle,
		ProxyOptions: o.proxy,
		Tags:         git.NoTags,
		Force:        true,
		Depth:        depth,
	})
	if errors.Is(err, git.NoErrAlreadyUpToDate) {
		err = nil
	}
	if err = op.done(err); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("fetch %s from %s: %w", branch, redact.String(o.url), err)
	}
	ref, err := repo.Reference(local, true)
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("fetch %s from %s: %w", branch, redact.String(o.url), err)
	}
	return ref.Hash(), nil
}

var inventoryFiles = inventory.Files

// maxIntroWalk bounds introducedBy's walk along first parents.
const maxIntroWalk = 64

// introducedBy walks from commit along first parents while the parent's
// inventory files (Dir's servers.yaml, profiles.yaml, images.yaml, networks.yaml blob
// ids, key's form) are the same, and returns the oldest such commit: the
// one that brought this inventory content. It stops at a merge's first
// parent chain end, a parent it cannot read, or after maxIntroWalk steps.
//
// Status commits (the controller's own, told by their
// TrailerRevision trailer) change only status/, so they are stepped over
// without reading their trees and do not count towards maxIntroWalk (up
// to maxStatusWalk of them): a controller writing status every few
// seconds puts hundreds of them above the operator's commit, and the
// revision must still name the operator's commit, not a bot's.
func (s *Source) introducedBy(commit *object.Commit, key string) *object.Commit {
	human, bots := 0, 0
	for human < maxIntroWalk && bots < maxStatusWalk {
		if commit.NumParents() == 0 {
			return s.humanCommit(commit)
		}
		parent, err := commit.Parent(0)
		if err != nil {
			return s.humanCommit(commit)
		}
		// A status commit has its parent's inventory, so only a step
		// down from another commit can change the key.
		if !isStatusCommit(commit) && s.inventoryKey(parent) != key {
			return s.humanCommit(commit)
		}
		if isStatusCommit(parent) {
			bots++
		} else {
			human++
		}
		commit = parent
	}
	return s.humanCommit(commit)
}

// maxStatusWalk bounds the status commits introducedBy steps over.
const maxStatusWalk = 1 << 16

// humanCommit returns c, or when c is a status commit the first
// non-status commit below it along first parents (c itself if none
// within maxStatusWalk).
func (s *Source) humanCommit(c *object.Commit) *object.Commit {
	cur := c
	for range maxStatusWalk {
		if !isStatusCommit(cur) {
			return cur
		}
		p, err := cur.Parent(0)
		if err != nil {
			return c
		}
		cur = p
	}
	return c
}

// isStatusCommit reports whether c is a status commit of a Machina status
// writer: its message carries the TrailerRevision trailer.
func isStatusCommit(c *object.Commit) bool {
	return strings.Contains(c.Message, "\n"+TrailerRevision+": ")
}

// inventoryKey is inventoryEntries' key of commit's tree; "" when the
// tree is unreadable.
func (s *Source) inventoryKey(commit *object.Commit) string {
	tree, err := commit.Tree()
	if err != nil {
		return ""
	}
	_, key := s.inventoryEntries(tree)
	return key
}

// inventoryEntries finds the inventory files (inventoryFiles under
// Config.Dir) in tree: their entries (nil for a missing file) and a key of
// their blob ids ("-" for a missing file), equal for two trees exactly
// when their inventory files are byte for byte the same.
func (s *Source) inventoryEntries(tree *object.Tree) ([]*object.TreeEntry, string) {
	var key strings.Builder
	entries := make([]*object.TreeEntry, len(inventoryFiles))
	for i, name := range inventoryFiles {
		e, err := tree.FindEntry(path.Join(s.cfg.Dir, name))
		if err == nil && e.Mode.IsFile() {
			entries[i] = e
			key.WriteString(e.Hash.String())
		} else {
			key.WriteString("-")
		}
		key.WriteByte(' ')
	}
	return entries, key.String()
}

// evaluate validates commit's inventory and updates good/invalid.
// restoring is true when re-reading the recorded last good commit at start;
// rewritten when the branch no longer descends from the last tip: the
// revision is then named afresh even if its inventory is the same, since
// the commit it was named after may no longer be on the branch.
func (s *Source) evaluate(commit *object.Commit, restoring, rewritten bool) error {
	tree, err := commit.Tree()
	if err != nil {
		return fmt.Errorf("git source: read tree of %s: %w", commit.Hash, err)
	}
	// The key is the blob ids of the inventory files: a commit that
	// leaves them alone (README, status/) is a no-op without parsing.
	entries, key := s.inventoryEntries(tree)
	if !restoring && !rewritten && key == s.treeKey {
		s.log.Debug("commit leaves the inventory unchanged", "commit", commit.Hash.String())
		return nil
	}
	if !restoring {
		// A poll sees only the branch tip: when an operator's commit and
		// a status commit on top of it landed between two polls, the
		// revision is named after the commit that brought its inventory,
		// not the status commit.
		commit = s.introducedBy(commit, key)
	}
	fsys, ferr := s.readFiles(entries)
	var res *inventory.Result
	if ferr == nil {
		res, ferr = inventory.Load(fsys, s.cfg.Limits)
	}
	var ve *inventory.ValidationError
	if ferr != nil && !errors.As(ferr, &ve) {
		// Reading the local clone failed: not the revision's fault;
		// the poll fails and the commit is evaluated again next time.
		return fmt.Errorf("git source: read inventory of %s: %w", short(commit.Hash), ferr)
	}
	s.treeKey = key
	id := commit.Hash.String()
	if ferr != nil {
		inv := &InvalidRevision{Commit: id, Errors: fieldErrors(ferr)}
		if restoring {
			return ferr
		}
		s.mu.Lock()
		s.invalid = inv
		s.mu.Unlock()
		s.log.Warn("inventory revision invalid, keeping last good", "commit", id, "errors", len(inv.Errors))
		s.emit(SourceEvent{Kind: SourceInvalidRevision, Commit: id,
			Message: fmt.Sprintf("%s, first: %s", errorsCount(len(inv.Errors)), redact.String(inv.Errors[0].Error()))})
		s.notify()
		return nil
	}
	digest := res.Inventory.Digest
	s.mu.Lock()
	wasInvalid := s.invalid != nil
	prev := s.good
	s.invalid = nil
	isNew := digest != prev.Digest
	renamed := !isNew && rewritten && prev.Commit != id
	if isNew || renamed {
		s.good = Revision{Commit: id, Digest: digest, Inventory: res.Inventory, Warnings: res.Warnings}
	}
	s.mu.Unlock()
	if renamed {
		s.renamed(prev.Commit, id, digest)
	}
	if isNew {
		if !restoring {
			if err := os.WriteFile(filepath.Join(s.cfg.StateDir, lastGoodFile), []byte(id+"\n"), 0o600); err != nil {
				s.log.Warn("cannot record last good commit", "err", err)
			}
			s.log.Info("new inventory revision", "commit", id, "digest", digest, "servers", len(res.Inventory.Servers))
			s.emit(SourceEvent{Kind: SourceNewRevision, Commit: id, Previous: prev.Commit, Digest: digest,
				Message: fmt.Sprintf("inventory %s at %s: %d servers", shortDigest(digest), short(commit.Hash), len(res.Inventory.Servers))})
		}
	}
	if wasInvalid {
		s.emit(SourceEvent{Kind: SourceRevisionFixed, Commit: id, Digest: digest, Message: "inventory valid again at " + short(commit.Hash)})
	}
	if isNew || wasInvalid {
		s.notify()
	}
	return nil
}

// renamed records that the revision with digest is now named after
// commit id, not from (gone from the branch by a history rewrite).
func (s *Source) renamed(from, id, digest string) {
	if err := os.WriteFile(filepath.Join(s.cfg.StateDir, lastGoodFile), []byte(id+"\n"), 0o600); err != nil {
		s.log.Warn("cannot record last good commit", "err", err)
	}
	s.log.Info("inventory revision re-resolved after a history rewrite", "from", from, "commit", id, "digest", digest)
	s.notify()
}

// readFiles copies the inventory blobs into an in-memory FS, refusing any
// larger than the limit before reading it.
func (s *Source) readFiles(entries []*object.TreeEntry) (fs.FS, error) {
	maxBytes := s.cfg.Limits.MaxFileBytes
	if maxBytes <= 0 {
		maxBytes = 16 << 20
	}
	m := fstest.MapFS{}
	for i, e := range entries {
		if e == nil {
			continue
		}
		name := inventoryFiles[i]
		blob, err := s.repo.BlobObject(e.Hash)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		if blob.Size > maxBytes {
			return nil, &inventory.ValidationError{Errors: []inventory.FieldError{{File: name, Severity: inventory.SeverityError,
				Msg: fmt.Sprintf("file is %d bytes, more than the limit of %d", blob.Size, maxBytes)}}}
		}
		r, err := blob.Reader()
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		b, err := io.ReadAll(io.LimitReader(r, maxBytes+1))
		r.Close()
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		m[name] = &fstest.MapFile{Data: b, Mode: 0o644}
	}
	return m, nil
}

// fieldErrors turns a Load error into the list reported in status.
func fieldErrors(err error) []inventory.FieldError {
	var ve *inventory.ValidationError
	if errors.As(err, &ve) && len(ve.Errors) > 0 {
		out := make([]inventory.FieldError, len(ve.Errors))
		for i, e := range ve.Errors {
			e.Msg = redact.String(e.Msg)
			out[i] = e
		}
		return out
	}
	return []inventory.FieldError{{Msg: redact.String(err.Error()), Severity: inventory.SeverityError}}
}

func (s *Source) restoreLastGood() {
	b, err := os.ReadFile(filepath.Join(s.cfg.StateDir, lastGoodFile))
	if err != nil {
		return
	}
	h := plumbing.NewHash(strings.TrimSpace(string(b)))
	c, err := s.repo.CommitObject(h)
	if err != nil {
		s.log.Warn("recorded last good commit is gone", "commit", h.String())
		return
	}
	if err := s.evaluate(c, true, false); err != nil {
		s.log.Warn("recorded last good commit no longer validates", "commit", h.String(), "err", redact.String(err.Error()))
		s.mu.Lock()
		s.good = Revision{}
		s.mu.Unlock()
	}
	s.treeKey = "" // the tip is evaluated afresh on the first poll
}

func (s *Source) emit(ev SourceEvent) {
	if s.cfg.OnEvent != nil {
		s.cfg.OnEvent(ev)
	}
}

func (s *Source) notify() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

func short(h plumbing.Hash) string { return h.String()[:12] }

func shortDigest(d string) string {
	if len(d) > 19 {
		return d[:19]
	}
	return d
}
