package gitops

import (
	"bufio"
	"bytes"
	"cmp"
	"compress/zlib"
	"context"
	"crypto/sha1"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/format/idxfile"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/capability"
	"github.com/go-git/go-git/v5/plumbing/storer"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/go-git/go-git/v5/plumbing/transport/client"
	"github.com/go-git/go-git/v5/storage/memory"

	"github.com/machina-metal/machina/namerule"
	"github.com/machina-metal/machina/redact"
)

// Errors of the status writer. Compare with errors.Is.
var (
	// ErrNonFastForward means the status branch moved while a status
	// commit was being written, on every attempt of one write.
	ErrNonFastForward = errors.New("status branch moved during write")
	// ErrOutsideStatus means a status commit would have changed a path
	// outside status/; it is never pushed (a bug guard).
	ErrOutsideStatus = errors.New("status commit touches files outside status/")
	// ErrStatusEdited is returned by CheckStatusUntouched when a change
	// edits status/, which belongs to the controller.
	ErrStatusEdited = errors.New("change edits status/ by hand")
)

// Bot identity of status commits.
const (
	BotName  = "Machina"
	BotEmail = "machina@localhost"
	// TrailerRevision and TrailerDigest name the inventory revision a
	// status commit was rendered for (git interpret-trailers format).
	TrailerRevision = "Machina-Inventory-Revision"
	TrailerDigest   = "Machina-Inventory-Digest"
)

// StatusConfig configures a [StatusWriter]. Zero values are usable except
// Remote.URL and StateDir.
type StatusConfig struct {
	// Remote is the inventory repository; status goes to Remote.Branch
	// unless StatusBranch is set.
	Remote Remote
	// StatusBranch, if set, receives status commits instead of the
	// inventory branch, for sites whose branch protection forbids bot
	// pushes. The writer creates it as an orphan branch holding only
	// status/ when it does not exist.
	StatusBranch string
	// StateDir is where the writer keeps its own bare clone
	// (StateDir/status.git). Required; it may be the Source's StateDir.
	StateDir string
	// Interval is the least time between two status commits made by Run;
	// zero means 30s. Update with urgent set skips the wait.
	Interval time.Duration
	// MaxEvents is how many recent events each server file lists; zero
	// means 10, negative none.
	MaxEvents int
	// Attempts is how many times one write fetches, re-renders and pushes
	// when the branch moved or the push failed; zero means 5.
	Attempts int
	// RetryDelay is the first wait between attempts, doubled each time,
	// jittered ±50%, capped at 30s; zero means 500ms.
	RetryDelay time.Duration
	// FailingAfter is how many consecutive failed writes make
	// Health().Failing true ("status write-back failing"); zero means 3.
	FailingAfter int
	// Timeout bounds one write including its retries, except that a push
	// gets Timeout plus its pack's size at MinPushRate from its start, so a
	// large status (a big fleet's first commit) can finish on a slow link;
	// zero means 5m.
	Timeout time.Duration
	// MinPushRate is the slowest upload, in bytes per second, a push is
	// given time for; zero means 64 KiB/s (a 512 kbit/s WAN link). A 4 MiB
	// pack then gets Timeout + 64s.
	MinPushRate int64
	// Group, if set, is the controller group (machina serve --group,
	// docs/ha.md "Sharding") whose status this writer owns: it writes
	// status/GROUP/ (README.md, servers/, images/, hosts/, inventory.yaml)
	// and keeps every other entry of status/ (other groups' folders) as the
	// base commit has it, never deleting or rewriting them; a push that
	// would change them is refused (ErrOutsideStatus). An RFC 1123 label.
	// "": the writer owns all of status/, as a single controller.
	Group string
	// Logger; nil discards.
	Logger *slog.Logger
}

// WriteResult is the outcome of one status write.
type WriteResult struct {
	// Commit is the pushed commit id, "" when nothing changed.
	Commit string
	// Message is the commit message, "" when nothing changed.
	Message string
	// Attempts is how many push attempts were made (0 if unchanged on
	// the first render).
	Attempts int
	// PackBytes is the size in bytes of the packfile the successful push
	// sent (the objects the remote lacked: changed server files, their
	// fan-out folders' trees, status/'s and the root's trees, README.md,
	// the commit); 0 when nothing changed.
	PackBytes int
}

// StatusHealth is the writer's condition for metrics and the API.
type StatusHealth struct {
	// Failing is true after FailingAfter consecutive failed writes:
	// "status write-back failing". Hardware work is unaffected.
	Failing bool
	// ConsecutiveFailures counts failed writes since the last success.
	ConsecutiveFailures int
	// LastError is the last write error, redacted ("" after a success).
	LastError string
	// LastCommit is the last status commit pushed by this writer.
	LastCommit string
	// LastSuccess is when a write last succeeded (pushed or found nothing
	// to change); zero if never.
	LastSuccess time.Time
	// LastPackBytes is the size of the packfile the last pushed status
	// commit sent (WriteResult.PackBytes); 0 before one.
	LastPackBytes int
}

// StatusWriter renders fleet snapshots to status/ and pushes them as one
// commit per change. Update and Health are safe for concurrent use; Write
// and Run must not run concurrently with each other.
type StatusWriter struct {
	cfg     StatusConfig
	log     *slog.Logger
	repo    *git.Repository
	wake    chan struct{}
	running atomic.Bool
	writeFn func(context.Context, Snapshot) (WriteResult, error) // Write; replaced in tests
	// beforePush, if set (tests only), runs between commit and push.
	beforePush func(attempt int)
	// maxPacks is how many packfiles the clone may hold before it is
	// rebuilt by a shallow fetch (each status commit adds one).
	maxPacks int

	mu      sync.Mutex
	pending func() (Snapshot, error) // builds the newest snapshot; nil when none
	urgent  bool
	health  StatusHealth
	pacer   failurePacer     // paces "still failing" lines (gitsource_health.go)
	now     func() time.Time // tests; nil: time.Now

	// cache of the last pushed status tree and its lifecycles, used for
	// the transition summary when the base is our own last commit.
	lastTree   plumbing.Hash
	lifecycles map[string]string

	// renderMu guards rendered, each server's last status file.
	renderMu sync.Mutex
	rendered renderCache
}

// NewStatusWriter opens or creates the writer's clone. It does no network
// I/O.
func NewStatusWriter(cfg StatusConfig) (*StatusWriter, error) {
	if cfg.StateDir == "" {
		return nil, fmt.Errorf("status writer: %w: empty StateDir", ErrRemoteConfig)
	}
	if cfg.StatusBranch != "" && !validBranch(cfg.StatusBranch) {
		return nil, fmt.Errorf("status writer: %w: bad StatusBranch %q", ErrRemoteConfig, cfg.StatusBranch)
	}
	if !validBranch(cfg.Remote.branch()) {
		return nil, fmt.Errorf("status writer: %w: bad Branch %q", ErrRemoteConfig, cfg.Remote.Branch)
	}
	if cfg.Group != "" && !namerule.Label.Valid(cfg.Group) {
		return nil, fmt.Errorf("status writer: %w: group %q: want %s", ErrRemoteConfig, cfg.Group, namerule.Label.What)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 30 * time.Second
	}
	if cfg.MaxEvents == 0 {
		cfg.MaxEvents = 10
	}
	if cfg.Attempts <= 0 {
		cfg.Attempts = 5
	}
	if cfg.RetryDelay <= 0 {
		cfg.RetryDelay = 500 * time.Millisecond
	}
	if cfg.FailingAfter <= 0 {
		cfg.FailingAfter = 3
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Minute
	}
	if cfg.MinPushRate <= 0 {
		cfg.MinPushRate = 64 << 10
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := cfg.Remote
	r.Branch = cfg.target()
	repo, err := openBare(filepath.Join(cfg.StateDir, "status.git"), r)
	if err != nil {
		return nil, fmt.Errorf("status writer: %w", err)
	}
	w := &StatusWriter{cfg: cfg, log: log.With("component", "statuswriter", "branch", cfg.target()), repo: repo,
		wake: make(chan struct{}, 1)}
	w.writeFn = w.Write
	w.maxPacks = 64
	return w, nil
}

// clock is time.Now unless a test set w.now.
func (w *StatusWriter) clock() time.Time {
	if w.now != nil {
		return w.now()
	}
	return time.Now()
}

// ownDir is the folder of the repository this writer owns: status, or
// status/GROUP.
func (c StatusConfig) ownDir() string {
	if c.Group == "" {
		return statusDir
	}
	return statusDir + "/" + c.Group
}

func (c StatusConfig) target() string {
	if c.StatusBranch != "" {
		return c.StatusBranch
	}
	return c.Remote.branch()
}

// validBranch accepts simple branch names: [A-Za-z0-9._/-], no "..",
// no leading '-' or '/', no trailing '/' or ".lock".
func validBranch(b string) bool {
	if b == "" || len(b) > 200 || b[0] == '-' || b[0] == '/' || strings.HasSuffix(b, "/") ||
		strings.HasSuffix(b, ".lock") || strings.Contains(b, "..") || strings.Contains(b, "//") {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '/') {
			return false
		}
	}
	return true
}

// Update hands the writer the newest snapshot; Run commits it within
// Interval of the previous commit, or at once when urgent (the inventory
// turned invalid, a server stalled). Only the newest snapshot is kept. The
// snapshot is not copied: do not modify it afterwards.
func (w *StatusWriter) Update(s Snapshot, urgent bool) {
	w.UpdateFrom(func() (Snapshot, error) { return s, nil }, urgent)
}

// UpdateFrom is Update with the snapshot built by build when Run is about
// to write it (in Run's goroutine), not before: only the newest build
// function is kept, so a fleet's snapshot exists once, while it is
// written, however often passes hand in new ones. After a failed write
// (or a failed build, logged) the same function is called again at the
// retry, which then writes the state of that moment. build must be safe to
// call more than once.
func (w *StatusWriter) UpdateFrom(build func() (Snapshot, error), urgent bool) {
	w.mu.Lock()
	w.pending = build
	w.urgent = w.urgent || urgent
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Health returns the writer's condition. Safe for concurrent use.
func (w *StatusWriter) Health() StatusHealth {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.health
}

// Run commits snapshots given to Update until ctx is done, then returns
// nil: at most one commit per Interval unless urgent; after a failed write
// the snapshot is retried after a capped, jittered backoff, unless a newer
// one replaced it. A second concurrent Run returns ErrAlreadyRunning.
func (w *StatusWriter) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return fmt.Errorf("status writer: run: %w", ErrAlreadyRunning)
	}
	defer w.running.Store(false)
	var next time.Time // earliest time of the next non-urgent write
	failures := 0
	for {
		w.mu.Lock()
		build, urgent := w.pending, w.urgent
		w.mu.Unlock()
		var wait <-chan time.Time
		var timer *time.Timer
		if build != nil {
			d := time.Until(next)
			if urgent || d <= 0 {
				w.mu.Lock()
				if w.pending != nil {
					build = w.pending // a newer one may have come in
				}
				w.pending = nil
				w.urgent = false
				w.mu.Unlock()
				snap, err := build()
				if err != nil {
					w.log.Error("build status snapshot", "err", redact.String(err.Error()))
				} else {
					_, err = w.writeFn(ctx, snap)
				}
				if ctx.Err() != nil {
					return nil
				}
				if err != nil {
					failures++
					w.mu.Lock()
					if w.pending == nil {
						w.pending = build
					}
					w.mu.Unlock()
					next = time.Now().Add(backoffDelay(w.cfg.Interval, 10*time.Minute, failures, rand.Float64()))
				} else {
					failures = 0
					next = time.Now().Add(w.cfg.Interval)
				}
				continue
			}
			timer = time.NewTimer(d)
			wait = timer.C
		}
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return nil
		case <-w.wake:
		case <-wait:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// Write renders s and, if the rendered status/ differs from the branch
// tip's, commits it on top of the tip and pushes without force. When the
// branch moved (another push won) it fetches the new tip, re-renders over
// it and retries with jittered backoff, up to Attempts times. The commit
// is checked to change nothing outside status/ before each push. Errors:
// ErrNonFastForward when every attempt lost a race, ErrOutsideStatus,
// or a wrapped transport error. Health is updated either way.
//
// Write keeps s's server statuses (and what their slices, maps and
// pointers reach) until the next Write, to render again only the servers
// whose status changed: the caller MUST NOT change them in place after
// the call (replacing a ServerStatus, or one of its fields, is fine), as
// StatusBuilder.Build, which builds each one afresh, does not.
func (w *StatusWriter) Write(ctx context.Context, s Snapshot) (WriteResult, error) {
	res, err := w.write(ctx, s)
	if err != nil && ctx.Err() != nil {
		return res, err // shutting down: not a write-back failure
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.health.ConsecutiveFailures++
		w.health.LastError = redact.String(err.Error())
		if w.health.ConsecutiveFailures >= w.cfg.FailingAfter {
			// The first line of the outage at once, then one per
			// failureLogEvery with the count: a write-back that stays
			// broken keeps saying so, without a line per pass.
			if !w.health.Failing {
				w.pacer.reset()
			}
			if w.pacer.due(w.clock(), w.health.ConsecutiveFailures-w.cfg.FailingAfter+1) {
				msg := "status write-back failing"
				if w.health.Failing {
					msg = "status write-back still failing"
				}
				w.log.Error(msg, "failures", w.health.ConsecutiveFailures, "err", w.health.LastError)
			}
			w.health.Failing = true
		} else {
			w.log.Warn("status write failed", "err", w.health.LastError)
		}
		return res, err
	}
	if w.health.Failing {
		w.log.Info("status write-back recovered")
	}
	w.health = StatusHealth{LastCommit: cmp.Or(res.Commit, w.health.LastCommit), LastSuccess: w.clock(), LastPackBytes: cmp.Or(res.PackBytes, w.health.LastPackBytes)}
	return res, nil
}

// write is Write's body; parent is the caller's context, which bounds the
// push (see pushTimeout), ctx the write's (Timeout).
func (w *StatusWriter) write(parent context.Context, s Snapshot) (WriteResult, error) {
	ctx, cancel := context.WithTimeout(parent, w.cfg.Timeout)
	defer cancel()
	if err := w.compact(); err != nil {
		return WriteResult{}, fmt.Errorf("status write: %w", err)
	}
	blobs, lifecycles := w.render(s)
	branch := w.cfg.target()
	var res WriteResult
	var lastErr error
	var lastBase plumbing.Hash // base of the last commit attempted
	delay := w.cfg.RetryDelay
	for attempt := 1; attempt <= w.cfg.Attempts; attempt++ {
		if attempt > 1 {
			d := time.Duration(float64(delay) * (0.5 + rand.Float64()))
			delay = min(delay*2, 30*time.Second)
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return res, fmt.Errorf("status write: %w (last: %w)", ctx.Err(), lastErr)
			case <-t.C:
			}
		}
		o, err := w.cfg.Remote.options()
		if err != nil {
			return res, fmt.Errorf("status write: %w", err)
		}
		o = o.withLogger(w.log)
		base, exists, err := w.base(ctx, o, branch)
		if needsPerson(err) {
			return res, fmt.Errorf("status write: %w", err)
		}
		if err != nil {
			lastErr = err
			continue
		}
		bc, err := w.commit(base, exists, blobs, lifecycles, s.Inventory)
		if err != nil {
			return res, fmt.Errorf("status write: %w", err)
		}
		if bc.hash.IsZero() {
			w.noteSuccess(base, lifecycles)
			return res, nil
		}
		res.Attempts = attempt
		lastBase = base
		if w.beforePush != nil {
			w.beforePush(attempt)
		}
		pctx, pcancel := context.WithTimeout(parent, w.pushTimeout(len(bc.pack.data)))
		err = w.push(pctx, o, branch, base, exists, bc)
		pcancel()
		if err != nil {
			if needsPerson(err) {
				return res, fmt.Errorf("status write: %w", err)
			}
			lastErr = err
			w.log.Debug("status push rejected or failed, retrying over the new tip", "attempt", attempt, "err", redact.String(err.Error()))
			continue
		}
		res.Commit, res.Message, res.PackBytes = bc.hash.String(), bc.msg, len(bc.pack.data)
		w.log.Info("status committed", "commit", res.Commit, "subject", firstLine(bc.msg), "packBytes", len(bc.pack.data))
		if err := w.storePack(bc.pack); err != nil {
			// Pushed: the next write fetches what is missing.
			w.log.Warn("status commit pushed but not kept locally", "err", err)
		}
		w.noteSuccess(bc.hash, lifecycles)
		return res, nil
	}
	return res, w.failed(ctx, branch, res.Attempts, lastBase, lastErr)
}

// pushTimeout is a push's deadline for a pack of n bytes: Timeout plus n
// at MinPushRate.
func (w *StatusWriter) pushTimeout(n int) time.Duration {
	return w.cfg.Timeout + time.Duration(int64(n)*int64(time.Second)/w.cfg.MinPushRate)
}

// render renders s into status/'s blobs, and the servers' lifecycles (for
// the commit message). A server whose status equals the one of the last
// render keeps its file (renderCache).
func (w *StatusWriter) render(s Snapshot) ([]statusFile, map[string]string) {
	w.renderMu.Lock()
	files, rerrs := renderStatus(s, w.cfg.MaxEvents, &w.rendered)
	w.renderMu.Unlock()
	for _, e := range rerrs {
		w.log.Warn("status entry skipped", "err", e)
	}
	for i := range files {
		if files[i].hash.IsZero() {
			files[i].hash = plumbing.ComputeHash(plumbing.BlobObject, files[i].data)
		}
	}
	lifecycles := make(map[string]string, len(s.Servers))
	for _, sv := range s.Servers {
		lifecycles[sv.Name] = orUnknown(sv.Lifecycle)
	}
	return files, lifecycles
}

// base is the remote tip of branch the status commit goes on, fetched
// when the clone lacks it; exists is false for a status branch that does
// not exist yet.
func (w *StatusWriter) base(ctx context.Context, o transportOptions, branch string) (base plumbing.Hash, exists bool, err error) {
	base, err = remoteTip(ctx, w.repo, o, branch)
	if errors.Is(err, ErrBranchNotFound) && w.cfg.StatusBranch != "" {
		return base, false, nil
	}
	if err != nil {
		return base, false, err
	}
	if _, err := w.repo.CommitObject(base); err != nil {
		// Build on what the fetch brought, even if the branch moved
		// again since the list.
		if base, err = fetchBranch(ctx, w.repo, o, branch, 1); err != nil {
			return base, true, err
		}
	}
	return base, true, nil
}

// failed is the error of a write whose attempts all failed, telling a
// lost race (the tip moved past the last base: ErrNonFastForward) apart
// from a broken remote.
func (w *StatusWriter) failed(ctx context.Context, branch string, attempts int, lastBase plumbing.Hash, lastErr error) error {
	if lastErr != nil {
		if o, err := w.cfg.Remote.options(); err == nil {
			if tip, err := remoteTip(ctx, w.repo, o.withLogger(w.log), branch); err == nil && attempts > 0 && tip != lastBase {
				return fmt.Errorf("status write: %d attempts, tip now %s: %w (last: %w)", attempts, short(tip), ErrNonFastForward, lastErr)
			}
		}
	}
	return fmt.Errorf("status write: %d attempts: %w", w.cfg.Attempts, lastErr)
}

// compact rebuilds the writer's clone when it holds more than maxPacks
// packfiles: the writer needs only the branch tip, which the next write
// fetches shallowly, so disk use and object lookups stay bounded.
func (w *StatusWriter) compact() error {
	pos, ok := w.repo.Storer.(storer.PackedObjectStorer)
	if !ok {
		return nil
	}
	packs, err := pos.ObjectPacks()
	if err != nil || len(packs) <= w.maxPacks {
		return nil
	}
	dir := filepath.Join(w.cfg.StateDir, "status.git")
	w.log.Debug("rebuilding status clone", "packs", len(packs))
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("compact clone: %w", err)
	}
	r := w.cfg.Remote
	r.Branch = w.cfg.target()
	repo, err := openBare(dir, r)
	if err != nil {
		return fmt.Errorf("compact clone: %w", err)
	}
	w.repo = repo
	return nil
}

// noteSuccess caches the status tree of commit c and its lifecycles.
func (w *StatusWriter) noteSuccess(c plumbing.Hash, lifecycles map[string]string) {
	w.lastTree = plumbing.ZeroHash
	w.lifecycles = nil
	if commit, err := w.repo.CommitObject(c); err == nil {
		if t, err := commit.Tree(); err == nil {
			if e, err := t.FindEntry(w.cfg.ownDir()); err == nil {
				w.lastTree, w.lifecycles = e.Hash, lifecycles
			}
		}
	}
}

// blobObject is a rendered file as a go-git blob without copying its
// bytes (plumbing.MemoryObject would copy every file of the fleet once
// more while the commit is built). Read-only: Writer fails.
type blobObject struct {
	data []byte
	hash plumbing.Hash // plumbing.ComputeHash(BlobObject, data)
}

func (o *blobObject) Hash() plumbing.Hash         { return o.hash }
func (o *blobObject) Type() plumbing.ObjectType   { return plumbing.BlobObject }
func (o *blobObject) SetType(plumbing.ObjectType) {}
func (o *blobObject) Size() int64                 { return int64(len(o.data)) }
func (o *blobObject) SetSize(int64)               {}
func (o *blobObject) Reader() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(o.data)), nil
}
func (o *blobObject) Writer() (io.WriteCloser, error) {
	return nil, errors.New("status blob is read-only")
}

// builtCommit is a status commit ready to push: its id, message and a
// packfile of exactly the objects the base lacks.
type builtCommit struct {
	hash plumbing.Hash
	msg  string
	pack builtPack
}

// commit builds a commit of blobs as status/ over base (or an orphan when
// !exists) in memory and packs the new objects. It returns a zero hash
// when status/ would not change. Nothing is stored locally until the push
// succeeded (see storePack), so a lost race leaves no garbage.
func (w *StatusWriter) commit(base plumbing.Hash, exists bool, blobs []statusFile, lifecycles map[string]string, inv InventoryStatus) (builtCommit, error) {
	var none builtCommit
	baseTree, parents, err := w.baseTree(base, exists)
	if err != nil {
		return none, err
	}
	oldFiles, have, oldStatusHash := w.oldStatus(baseTree)
	pb := &packBuilder{mem: memory.NewStorage(), have: have}
	statusObj, err := pb.statusTree(blobs)
	if err != nil {
		return none, err
	}
	// Hashed without adding it to the pack yet: unchanged means done.
	if statusObj.Hash() == oldStatusHash {
		return none, nil
	}
	statusHash, err := pb.put(statusObj)
	if err != nil {
		return none, err
	}
	if w.cfg.Group != "" {
		if statusHash, err = pb.groupStatusTree(w.repo.Storer, baseTree, w.cfg.Group, statusHash); err != nil {
			return none, err
		}
	}
	for _, b := range blobs {
		if have[b.hash] {
			continue
		}
		if _, err := pb.put(&blobObject{data: b.bytes(), hash: b.hash}); err != nil {
			return none, err
		}
	}
	rootHash, err := pb.rootTree(baseTree, statusHash, w.cfg.Group, w.repo.Storer)
	if err != nil {
		return none, err
	}
	msg := w.message(oldFiles, oldStatusHash, blobs, lifecycles, inv)
	sig := object.Signature{Name: BotName, Email: BotEmail, When: time.Now().UTC().Truncate(time.Second)}
	c := &object.Commit{Author: sig, Committer: sig, Message: msg, TreeHash: rootHash, ParentHashes: parents}
	cobj := pb.mem.NewEncodedObject()
	if err := c.Encode(cobj); err != nil {
		return none, fmt.Errorf("encode commit: %w", err)
	}
	ch, err := pb.put(cobj)
	if err != nil {
		return none, err
	}
	pack, err := encodePack(pb.mem, pb.send)
	if err != nil {
		return none, err
	}
	return builtCommit{hash: ch, msg: msg, pack: pack}, nil
}

// baseTree is the tree of the commit the status commit goes on (base) and
// its parents; an empty tree and none when the branch does not exist yet.
func (w *StatusWriter) baseTree(base plumbing.Hash, exists bool) (*object.Tree, []plumbing.Hash, error) {
	if !exists {
		return &object.Tree{}, nil, nil
	}
	c, err := w.repo.CommitObject(base)
	if err != nil {
		return nil, nil, fmt.Errorf("read base commit %s: %w", base, err)
	}
	t, err := c.Tree()
	if err != nil {
		return nil, nil, fmt.Errorf("read base tree: %w", err)
	}
	return t, []plumbing.Hash{base}, nil
}

// oldStatus reads the base tree's status/: its files (for the summary),
// every object id in it (the remote has those; they are not sent again)
// and its tree's hash (zero when there is none).
func (w *StatusWriter) oldStatus(baseTree *object.Tree) (oldFiles map[string]plumbing.Hash, have map[plumbing.Hash]bool, hash plumbing.Hash) {
	oldFiles, have = map[string]plumbing.Hash{}, map[plumbing.Hash]bool{}
	e, err := baseTree.FindEntry(w.cfg.ownDir())
	if err != nil || e.Mode != filemode.Dir {
		return oldFiles, have, hash
	}
	hash = e.Hash
	have[e.Hash] = true
	old, err := object.GetTree(w.repo.Storer, e.Hash)
	if err != nil {
		return oldFiles, have, hash
	}
	walker := object.NewTreeWalker(old, true, nil)
	defer walker.Close()
	for {
		name, te, err := walker.Next()
		if err != nil {
			// io.EOF, or an unreadable old tree: its files then count as
			// added and are sent again.
			return oldFiles, have, hash
		}
		have[te.Hash] = true
		if te.Mode.IsFile() {
			oldFiles[statusDir+"/"+name] = te.Hash
		}
	}
}

// packBuilder collects the objects of a status commit in memory; send
// lists, in order, those the remote does not have (have) for the pack.
type packBuilder struct {
	mem  *memory.Storage
	have map[plumbing.Hash]bool
	send []plumbing.Hash
}

func (pb *packBuilder) put(obj plumbing.EncodedObject) (plumbing.Hash, error) {
	h, err := pb.mem.SetEncodedObject(obj)
	if err != nil {
		return h, fmt.Errorf("build status commit: %w", err)
	}
	if !pb.have[h] {
		pb.have[h] = true
		pb.send = append(pb.send, h)
	}
	return h, nil
}

func (pb *packBuilder) encodeTree(entries []object.TreeEntry) (plumbing.Hash, error) {
	sortTreeEntries(entries)
	obj := pb.mem.NewEncodedObject()
	if err := (&object.Tree{Entries: entries}).Encode(obj); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("encode tree: %w", err)
	}
	return pb.put(obj)
}

// treeNode is one folder of status/ while its tree is built: its files
// and its sub-folders.
type treeNode struct {
	files []object.TreeEntry
	dirs  map[string]*treeNode
}

// statusTree builds status/'s folders at any depth (servers/XX/, images/,
// hosts/) into the pack and returns status/'s own tree object, encoded but
// not put. A folder whose tree the remote already has (an unchanged
// fan-out folder) is not sent again (packBuilder.put skips it).
func (pb *packBuilder) statusTree(blobs []statusFile) (plumbing.EncodedObject, error) {
	root := &treeNode{}
	for _, b := range blobs {
		rel := strings.TrimPrefix(b.path, statusDir+"/")
		n := root
		for {
			dir, rest, nested := strings.Cut(rel, "/")
			if !nested {
				break
			}
			if n.dirs == nil {
				n.dirs = map[string]*treeNode{}
			}
			c := n.dirs[dir]
			if c == nil {
				c = &treeNode{}
				n.dirs[dir] = c
			}
			n, rel = c, rest
		}
		n.files = append(n.files, object.TreeEntry{Name: rel, Mode: filemode.Regular, Hash: b.hash})
	}
	top, err := pb.folderEntries(root)
	if err != nil {
		return nil, err
	}
	sortTreeEntries(top)
	obj := pb.mem.NewEncodedObject()
	if err := (&object.Tree{Entries: top}).Encode(obj); err != nil {
		return nil, fmt.Errorf("encode status tree: %w", err)
	}
	return obj, nil
}

// folderEntries puts n's sub-folders' trees (deepest first) and returns
// n's entries: its files and a tree entry per sub-folder.
func (pb *packBuilder) folderEntries(n *treeNode) ([]object.TreeEntry, error) {
	entries := slices.Clone(n.files)
	for name, c := range n.dirs {
		ce, err := pb.folderEntries(c)
		if err != nil {
			return nil, err
		}
		h, err := pb.encodeTree(ce)
		if err != nil {
			return nil, err
		}
		entries = append(entries, object.TreeEntry{Name: name, Mode: filemode.Dir, Hash: h})
	}
	return entries, nil
}

// rootTree puts the new root tree (the base's entries with status/
// replaced) and checks that only status/ changed.
func (pb *packBuilder) rootTree(baseTree *object.Tree, statusHash plumbing.Hash, group string, baseSt storer.EncodedObjectStorer) (plumbing.Hash, error) {
	rootEntries := make([]object.TreeEntry, 0, len(baseTree.Entries)+1)
	for _, e := range baseTree.Entries {
		if e.Name != statusDir {
			rootEntries = append(rootEntries, e)
		}
	}
	rootEntries = append(rootEntries, object.TreeEntry{Name: statusDir, Mode: filemode.Dir, Hash: statusHash})
	rootHash, err := pb.encodeTree(rootEntries)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	newTree, err := object.GetTree(pb.mem, rootHash)
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("read back root tree: %w", err)
	}
	if err := onlyStatusChanged(baseTree, newTree); err != nil {
		return plumbing.ZeroHash, err
	}
	if group != "" {
		if err := onlyGroupChanged(baseTree, newTree, baseSt, pb.mem, group); err != nil {
			return plumbing.ZeroHash, err
		}
	}
	return rootHash, nil
}

// groupStatusTree puts status/'s tree for a group's writer: the base's
// status/ entries (other groups' folders, anything else there) as they
// are, with the group's folder replaced by groupHash, and returns its
// hash. base objects are read from st.
func (pb *packBuilder) groupStatusTree(st storer.EncodedObjectStorer, baseTree *object.Tree, group string, groupHash plumbing.Hash) (plumbing.Hash, error) {
	var entries []object.TreeEntry
	if e, err := baseTree.FindEntry(statusDir); err == nil && e.Mode == filemode.Dir {
		old, err := object.GetTree(st, e.Hash)
		if err != nil {
			return plumbing.ZeroHash, fmt.Errorf("read base status tree: %w", err)
		}
		for _, oe := range old.Entries {
			if oe.Name != group {
				entries = append(entries, oe)
			}
		}
	}
	entries = append(entries, object.TreeEntry{Name: group, Mode: filemode.Dir, Hash: groupHash})
	return pb.encodeTree(entries)
}

// onlyGroupChanged returns ErrOutsideStatus unless status/ of next equals
// status/ of base in every entry but the group's folder (a group's writer
// never deletes or rewrites another group's status).
func onlyGroupChanged(base, next *object.Tree, baseSt, mem storer.EncodedObjectStorer, group string) error {
	entries := func(t *object.Tree, st storer.EncodedObjectStorer) map[string]object.TreeEntry {
		m := map[string]object.TreeEntry{}
		e, err := t.FindEntry(statusDir)
		if err != nil || e.Mode != filemode.Dir {
			return m
		}
		st2, err := object.GetTree(st, e.Hash)
		if err != nil {
			return m
		}
		for _, oe := range st2.Entries {
			if oe.Name != group {
				m[oe.Name] = oe
			}
		}
		return m
	}
	a, b := entries(base, baseSt), entries(next, mem)
	var changed []string
	for n, e := range a {
		if f, ok := b[n]; !ok || f != e {
			changed = append(changed, statusDir+"/"+n)
		}
	}
	for n := range b {
		if _, ok := a[n]; !ok {
			changed = append(changed, statusDir+"/"+n)
		}
	}
	if len(changed) > 0 {
		slices.Sort(changed)
		return fmt.Errorf("%w: group %s's commit changes %s", ErrOutsideStatus, group, strings.Join(changed, ", "))
	}
	return nil
}

// packedObject locates one object in a pack built by encodePack.
type packedObject struct {
	hash   plumbing.Hash
	offset uint64
	crc    uint32
}

// builtPack is a version 2 packfile (gitformat-pack) of whole objects, no
// deltas, with what its index needs.
type builtPack struct {
	data    []byte
	objects []packedObject
	hash    plumbing.Hash // the trailing SHA-1
}

// encodePack writes the objects hs of st as a packfile, compressed with
// zlib.BestSpeed: status blobs are small and many, and speed matters
// more than a few percent of size. It records each object's offset and
// CRC-32 so the index is built without re-reading the pack.
func encodePack(st storer.EncodedObjectStorer, hs []plumbing.Hash) (builtPack, error) {
	var p builtPack
	var buf bytes.Buffer
	buf.WriteString("PACK")
	buf.Write(binary.BigEndian.AppendUint32(nil, 2))
	buf.Write(binary.BigEndian.AppendUint32(nil, uint32(len(hs))))
	zw, _ := zlib.NewWriterLevel(io.Discard, zlib.BestSpeed)
	p.objects = make([]packedObject, 0, len(hs))
	for _, h := range hs {
		obj, err := st.EncodedObject(plumbing.AnyObject, h)
		if err != nil {
			return p, fmt.Errorf("encode pack: %w", err)
		}
		start := buf.Len()
		// Object header: type in bits 4-6 of the first byte, size in
		// 4 bits then 7 bits per continuation byte.
		size := uint64(obj.Size())
		c := byte(obj.Type())<<4 | byte(size&0x0f)
		size >>= 4
		for size > 0 {
			buf.WriteByte(c | 0x80)
			c = byte(size & 0x7f)
			size >>= 7
		}
		buf.WriteByte(c)
		r, err := obj.Reader()
		if err != nil {
			return p, fmt.Errorf("encode pack: %w", err)
		}
		zw.Reset(&buf)
		_, err = io.Copy(zw, r)
		r.Close()
		if err == nil {
			err = zw.Close()
		}
		if err != nil {
			return p, fmt.Errorf("encode pack: %w", err)
		}
		p.objects = append(p.objects, packedObject{hash: h, offset: uint64(start), crc: crc32.ChecksumIEEE(buf.Bytes()[start:])})
	}
	sum := sha1.Sum(buf.Bytes())
	buf.Write(sum[:])
	p.hash = plumbing.Hash(sum)
	p.data = buf.Bytes()
	return p, nil
}

// storePack adds a pushed pack and its index to the local clone
// (objects/pack/pack-HASH.{pack,idx}, index written last) and makes the
// storage see it.
func (w *StatusWriter) storePack(p builtPack) error {
	iw := new(idxfile.Writer)
	if err := iw.OnHeader(uint32(len(p.objects))); err != nil {
		return fmt.Errorf("store pack: %w", err)
	}
	for _, o := range p.objects {
		iw.Add(o.hash, o.offset, o.crc)
	}
	if err := iw.OnFooter(p.hash); err != nil {
		return fmt.Errorf("store pack: %w", err)
	}
	idx, err := iw.Index()
	if err != nil {
		return fmt.Errorf("store pack: index: %w", err)
	}
	var ib bytes.Buffer
	if _, err := idxfile.NewEncoder(&ib).Encode(idx); err != nil {
		return fmt.Errorf("store pack: encode index: %w", err)
	}
	dir := filepath.Join(w.cfg.StateDir, "status.git", "objects", "pack")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("store pack: %w", err)
	}
	base := filepath.Join(dir, "pack-"+p.hash.String())
	for _, f := range []struct {
		ext  string
		data []byte
	}{{".pack", p.data}, {".idx", ib.Bytes()}} {
		tmp := base + f.ext + ".tmp"
		if err := os.WriteFile(tmp, f.data, 0o600); err != nil {
			return fmt.Errorf("store pack: %w", err)
		}
		if err := os.Rename(tmp, base+f.ext); err != nil {
			return fmt.Errorf("store pack: %w", err)
		}
	}
	if ri, ok := w.repo.Storer.(interface{ Reindex() }); ok {
		ri.Reindex()
	}
	return nil
}

// sortTreeEntries orders entries as Git requires: by name, a directory
// compared as if its name ended in '/'.
func sortTreeEntries(es []object.TreeEntry) {
	key := func(e object.TreeEntry) string {
		if e.Mode == filemode.Dir {
			return e.Name + "/"
		}
		return e.Name
	}
	slices.SortFunc(es, func(a, b object.TreeEntry) int { return strings.Compare(key(a), key(b)) })
}

// onlyStatusChanged returns ErrOutsideStatus unless the two root trees
// are identical outside the status entry.
func onlyStatusChanged(base, next *object.Tree) error {
	outside := func(t *object.Tree) map[string]object.TreeEntry {
		m := map[string]object.TreeEntry{}
		for _, e := range t.Entries {
			if e.Name != statusDir {
				m[e.Name] = e
			}
		}
		return m
	}
	a, b := outside(base), outside(next)
	var changed []string
	for n, e := range a {
		if f, ok := b[n]; !ok || f != e {
			changed = append(changed, n)
		}
	}
	for n := range b {
		if _, ok := a[n]; !ok {
			changed = append(changed, n)
		}
	}
	if len(changed) > 0 {
		slices.Sort(changed)
		return fmt.Errorf("%w: %s", ErrOutsideStatus, strings.Join(changed, ", "))
	}
	if e, err := next.FindEntry(statusDir); err != nil || e.Mode != filemode.Dir {
		return fmt.Errorf("%w: status is not a directory", ErrOutsideStatus)
	}
	return nil
}

// errRemoteMoved is a push refused because the branch is no longer at the
// base the commit was built on.
var errRemoteMoved = fmt.Errorf("remote branch moved: %w", ErrNonFastForward)

// push sends the pack and updates branch from base to the new commit in one
// receive-pack request, never forcing: the command names base as the old
// value (zero when the branch must not exist yet), and git-receive-pack
// applies it only if the ref still holds that value under its ref lock.
// The advertised value is checked first to fail fast.
func (w *StatusWriter) push(ctx context.Context, o transportOptions, branch string, base plumbing.Hash, exists bool, bc builtCommit) error {
	old := plumbing.ZeroHash
	if exists {
		old = base
	}
	return pushPack(ctx, o, branch, old, bc.hash, bc.pack.data)
}

// pushPack sends pack and updates branch from old (zero: the branch must
// not exist yet) to commit in one receive-pack request, never forcing.
// A branch not at old fails with an error wrapping errRemoteMoved.
func pushPack(ctx context.Context, o transportOptions, branch string, old, commit plumbing.Hash, pack []byte) error {
	ctx, cancel := localPushContext(ctx, o.url)
	defer cancel()
	op, o := startOp(ctx, o, "push")
	return op.done(sendPack(op.ctx, o, branch, old, commit, pack))
}

// localPushContext is the context a push to url runs under: ctx, but for
// a local (file://) remote ctx without its cancellation and with its
// deadline (ctx without a deadline stays as it is), so the push ends only
// by finishing or by timing out. go-git runs a local push as our own
// git-receive-pack child and SIGKILLs it when the context ends; killed
// while updating the branch, git leaves the ref's lock file
// (refs/heads/BRANCH.lock) behind, and every later push to the repository
// fails with "failed to update ref" until it is removed by hand. A
// network remote's receive-pack runs on the server, which cleans up after
// a dropped connection, so its push keeps ctx's cancellation.
func localPushContext(ctx context.Context, url string) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok || !strings.HasPrefix(url, "file:") {
		return ctx, func() {}
	}
	return context.WithDeadline(context.WithoutCancel(ctx), dl)
}

func sendPack(ctx context.Context, o transportOptions, branch string, old, commit plumbing.Hash, pack []byte) error {
	ep, err := transport.NewEndpoint(o.url)
	if err != nil {
		return fmt.Errorf("push: parse url: %w", err)
	}
	ep.CaBundle = o.caBundle
	ep.Proxy = o.proxy
	cl, err := client.NewClient(ep)
	if err != nil {
		return fmt.Errorf("push: %w", err)
	}
	sess, err := cl.NewReceivePackSession(ep, o.auth)
	if err != nil {
		return fmt.Errorf("push to %s: %w", redact.String(o.url), err)
	}
	defer sess.Close()
	ar, err := sess.AdvertisedReferencesContext(ctx)
	if err != nil {
		return fmt.Errorf("push to %s: advertised refs: %w", redact.String(o.url), err)
	}
	dst := plumbing.NewBranchReferenceName(branch)
	refs, err := ar.AllReferences()
	if err != nil {
		return fmt.Errorf("push: advertised refs: %w", err)
	}
	cur := plumbing.ZeroHash
	if ref, err := refs.Reference(dst); err == nil {
		cur = ref.Hash()
	}
	if cur != old {
		return fmt.Errorf("push %s: %s is at %s, not %s: %w", short(commit), branch, cur, old, errRemoteMoved)
	}
	req := packp.NewReferenceUpdateRequestFromCapabilities(ar.Capabilities)
	req.Commands = []*packp.Command{{Name: dst, Old: old, New: commit}}
	req.Packfile = io.NopCloser(bytes.NewReader(pack))
	remote := &sidebandLines{}
	if ar.Capabilities.Supports(capability.Sideband64k) {
		_ = req.Capabilities.Set(capability.Sideband64k)
		req.Progress = remote
	}
	rs, err := sess.ReceivePack(ctx, req)
	if rs != nil && err == nil {
		err = rs.Error()
	}
	if err != nil {
		err = classify(err)
		if msg := remote.String(); msg != "" {
			err = fmt.Errorf("%w (%s)", err, msg)
		}
		if rs != nil && rs.Error() != nil && strings.Contains(rs.Error().Error(), "hook declined") {
			// A pre-receive hook or a forge's branch protection: a
			// policy, not a race.
			return fmt.Errorf("push %s to %s: refused: %w: %w", short(commit), redact.String(o.url), ErrGitPermission, err)
		}
		if rs != nil && rs.Error() != nil {
			return fmt.Errorf("push %s to %s: refused: %w (%w)", short(commit), redact.String(o.url), err, errRemoteMoved)
		}
		return fmt.Errorf("push %s to %s: %w", short(commit), redact.String(o.url), err)
	}
	return nil
}

// message summarises the change: lifecycle transitions of changed
// servers, then trailers.
func (w *StatusWriter) message(oldBlobs map[string]plumbing.Hash, oldHash plumbing.Hash, blobs []statusFile, lifecycles map[string]string, inv InventoryStatus) string {
	ch := w.changes(oldBlobs, oldHash, blobs, lifecycles)
	items := append(append(ch.transitions, ch.added...), ch.removed...)
	var b strings.Builder
	b.WriteString(ch.subject(items, inv))
	b.WriteString("\n\n")
	const maxBody = 50
	for i, it := range items {
		if i == maxBody {
			fmt.Fprintf(&b, "… and %d more\n", len(items)-maxBody)
			break
		}
		b.WriteString(it)
		b.WriteByte('\n')
	}
	if ch.moved > 0 {
		fmt.Fprintf(&b, "%s moved to the fan-out layout status/servers/XX/NAME.yaml (XX: first two hex digits of the name's SHA-1)\n", count(ch.moved, "server file", "server files"))
	}
	if ch.updated > 0 && len(items) > 0 {
		fmt.Fprintf(&b, "%s updated\n", count(ch.updated, "other entry", "other entries"))
	}
	if ch.invChanged && inv.Invalid != nil {
		fmt.Fprintf(&b, "inventory invalid at %s: %s\n", shortID(inv.Invalid.Commit), errorsCount(len(inv.Invalid.Errors)))
	}
	if b.String()[len(b.String())-2:] != "\n\n" {
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "%s: %s\n%s: %s\n", TrailerRevision, cmp.Or(inv.Good.Commit, "none"), TrailerDigest, cmp.Or(inv.Good.Digest, "none"))
	return b.String()
}

// statusChanges is what a status commit changes: server lifecycle moves,
// servers added and removed, other entries updated, and whether
// inventory.yaml changed.
type statusChanges struct {
	transitions, added, removed []string
	updated                     int
	// moved counts server files found at another path in the base (the
	// flat layout of older controllers).
	moved      int
	invChanged bool
}

// changes compares the new blobs with the base's status/ files. Server
// files are matched by server name, not path, so a move between layouts
// (flat status/servers/NAME.yaml to the fan-out folders) is counted as
// moved, not as a server removed and added. A server's lifecycle before
// comes from the writer's cache when the base is the tree it last wrote,
// else from the old file.
func (w *StatusWriter) changes(oldBlobs map[string]plumbing.Hash, oldHash plumbing.Hash, blobs []statusFile, lifecycles map[string]string) statusChanges {
	useCache := !oldHash.IsZero() && oldHash == w.lastTree && w.lifecycles != nil
	var ch statusChanges
	seen := map[string]bool{}
	oldServers := map[string]string{} // name → old path
	for p := range oldBlobs {
		if name, ok := serverNameOf(p); ok {
			oldServers[name] = p
		}
	}
	seenServers := map[string]bool{}
	for _, b := range blobs {
		seen[b.path] = true
		name, isServer := serverNameOf(b.path)
		oldPath := b.path
		if isServer {
			seenServers[name] = true
			if p, ok := oldServers[name]; ok {
				oldPath = p
			}
		}
		old, had := oldBlobs[oldPath]
		if isServer && had && oldPath != b.path {
			ch.moved++
		}
		if had && old == b.hash {
			continue
		}
		if b.path == statusDir+"/inventory.yaml" {
			ch.invChanged = true
			continue
		}
		if !isServer {
			if !strings.HasSuffix(b.path, "README.md") {
				ch.updated++
			}
			continue
		}
		now := lifecycles[name]
		if !had {
			ch.added = append(ch.added, name+" "+now)
			continue
		}
		var before string
		if useCache {
			before = w.lifecycles[name]
		} else {
			before = w.blobLifecycle(old)
		}
		if before != now && before != "" {
			ch.transitions = append(ch.transitions, name+" "+before+"→"+now)
		} else {
			ch.updated++
		}
	}
	for p := range oldBlobs {
		if seen[p] {
			continue
		}
		if name, ok := serverNameOf(p); ok {
			if !seenServers[name] {
				ch.removed = append(ch.removed, name+" removed")
			}
		} else if p != statusDir+"/README.md" {
			ch.updated++
		}
	}
	// By name: blobs come in path order, which the fan-out folders shuffle.
	slices.Sort(ch.transitions)
	slices.Sort(ch.added)
	slices.Sort(ch.removed)
	return ch
}

// subject is the commit's first line: the changed servers, else the
// inventory's news, else how many entries were updated.
func (ch statusChanges) subject(items []string, inv InventoryStatus) string {
	switch {
	case len(items) > 0:
		return summarise("status: ", items, 80)
	case ch.moved > 0:
		return "status: move " + count(ch.moved, "server file", "server files") + " to status/servers/XX/NAME.yaml"
	case ch.invChanged && inv.Invalid != nil:
		return "status: inventory invalid at " + shortID(inv.Invalid.Commit)
	case ch.invChanged && inv.Good.Commit != "":
		return "status: inventory revision " + shortID(inv.Good.Commit)
	case ch.invChanged:
		return "status: no inventory revision yet"
	case ch.updated > 0:
		return "status: update " + count(ch.updated, "entry", "entries")
	}
	return "status: update the summary" // only README.md changed
}

// summarise joins items after prefix while the line stays within limit
// characters, then adds " (+N more)".
func summarise(prefix string, items []string, limit int) string {
	s := prefix
	for i, it := range items {
		sep := ""
		if i > 0 {
			sep = ", "
		}
		rest := len(items) - i - 1
		tail := ""
		if rest > 0 {
			tail = fmt.Sprintf(" (+%d more)", rest)
		}
		if i > 0 && utf8.RuneCountInString(s+sep+it+tail) > limit {
			return s + fmt.Sprintf(" (+%d more)", len(items)-i)
		}
		s += sep + it
	}
	return s
}

// blobLifecycle reads the lifecycle line of an old server status file.
func (w *StatusWriter) blobLifecycle(h plumbing.Hash) string {
	blob, err := w.repo.BlobObject(h)
	if err != nil {
		return ""
	}
	r, err := blob.Reader()
	if err != nil {
		return ""
	}
	defer r.Close()
	sc := bufio.NewScanner(io.LimitReader(r, 64<<10))
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("lifecycle: ")); ok {
			s := string(v)
			if u, err := strconv.Unquote(s); err == nil {
				return u
			}
			return s
		}
	}
	return ""
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
