package state

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// # The etcd engine
//
// Layout. Under the prefix P (EtcdConfig.Prefix, e.g. "/machina/"), a bucket
// with path b1[/b2] (a nested bucket: per-server event index, per-host join
// log) is
//
//	P k/<b1>[/<b2>]=<key>  one key per record, the value as bbolt holds it
//	P m/<b1>[/<b2>]        the bucket's existence and sequence (uint64 BE)
//	P g/<b1>[/<b2>]        the bucket's generation: re-put by every
//	                       transaction that writes the bucket
//
// with bucket names escaped (%XX for bytes outside [A-Za-z0-9._-]), so no
// bucket's record range holds another's. Record keys stay raw bytes: etcd
// orders keys bytewise, as bbolt does, so cursors see the same order.
//
// Transactions. A transaction reads at one etcd revision (the revision of
// its first read: a consistent snapshot, like a bbolt read transaction),
// buffers its writes (reads see them, cursors merge them in order) and
// commits them in one etcd Txn guarded by compares on what it read:
//
//   - a record read by key: ModRevision(record) = the one seen;
//   - a bucket read by range (cursor, ForEach), or more than
//     maxPointReads records of one bucket read by key from etcd:
//     ModRevision(the bucket's generation key) = the one seen. (A record
//     read from the write cache is always compared by its own key: it may
//     be older than the snapshot the generation was read at.) Every writing transaction
//     re-puts the generation key of each bucket it writes, so any write to
//     the bucket since the snapshot, insert and delete included (phantoms),
//     fails the compare. This is why concurrency.STM was not used: STM has
//     no range reads, and a range read at the snapshot revision with
//     ModRevision compares on the keys found cannot see a key deleted or
//     inserted since; the generation key can, at the price of one more
//     key per written bucket;
//   - a bucket's existence: CreateRevision(existence key) = the one seen;
//     its sequence: ModRevision(existence key) = the one seen;
//   - the fence (EtcdConfig.Fence, Store.SetFence), when set.
//
// Write cache. An update reads single records (not ranges) from a cache of
// what this process last read or wrote in its committed updates, with
// their revisions, and guards them by the same compares; so a controller
// that is the only writer of its site (the fenced leader) moves a server
// with one round trip, the Txn. A record another process changed fails its
// compare: the cache is dropped and the transaction rerun from etcd. A
// transaction function that fails (or rolls back: errRollback, nothing to
// write) after reading from the cache has its error believed only once a
// write-free etcd transaction of the same compares (validate) shows every
// record it read current; otherwise it is rerun from a snapshot. A
// rollback that shares a transaction with other calls (runBatch) needs no
// transaction of its own: the shared commit's compares hold its reads.
// Views never use the cache.
//
// A failed compare reruns the transaction function from a new snapshot (up
// to maxAttempts times, then ErrConflict), unless the fence compare failed:
// then the write returns ErrNotLeader and is not retried. Writers of one
// process are serialised (as bbolt serialises them), so retries only come
// from other processes writing the same buckets. Reads fail closed: an
// etcd error during a transaction fails it, nothing is committed.
//
// Size. etcd bounds a transaction to --max-txn-ops operations (128 by
// default) and a request to --max-request-bytes (1.5 MiB): the store keeps
// each transaction small (event retention deletes at most etcdSweep old
// events per write, Prune runs in batches). A transaction that still
// exceeds it fails with etcd's "too many operations in txn request" and
// writes nothing; the ones that can, on large sites only, are sealing more
// than about 60 secrets stored unsealed at the first Open with a master
// key, and revoking or forgetting more than about 60 tokens or hosts of one
// server at once (raise etcd's --max-txn-ops for those).
//
// Compaction. etcd keeps every revision until compacted; the event log is
// bounded by Retention (count site-wide, count per server, age), but the
// revisions its deletions leave behind are not: compacting old revisions
// (etcd --auto-compaction-mode=periodic --auto-compaction-retention=1h, or
// `etcdctl compact`) and defragmenting are the operator's task, as for any
// etcd (docs/ha.md). A transaction whose snapshot revision was compacted
// away meanwhile is rerun from a new snapshot.

const (
	// maxPointReads: past this many records of one bucket read by key, a
	// transaction guards the bucket's generation instead of each record
	// (keeps the compares under etcd's --max-txn-ops).
	maxPointReads = 8
	// maxCachedReads bounds the point reads one transaction takes from
	// the write cache (each is compared by key).
	maxCachedReads = 64
	// maxAttempts bounds the reruns of a conflicting transaction.
	maxAttempts = 32
	// etcdPage is the most records one cursor read fetches; the first read
	// of a bucket in a transaction fetches etcdFirstPage, each further one
	// twice the last (a look at the oldest event costs a few records, a
	// walk of 10,000 servers about 25 reads).
	etcdPage      = 512
	etcdFirstPage = 8
	// maxCached bounds the write cache (records); past it it starts over.
	maxCached = 200_000
	// maxBatch is the most update or batch calls one writer's turn takes
	// from the queue (32 measured no different at 1,000 servers: about
	// 4.3 calls queue during one commit); a transaction stops taking
	// them once its operations or compares pass half of maxBatchOps
	// (tx.full: a lifecycle move adds about 6 operations), and the rest
	// run in the next.
	maxBatch = 8
	// maxBatchOps: a shared transaction with more operations or compares
	// than this (etcd's default --max-txn-ops) is not sent; its calls run
	// one by one instead.
	maxBatchOps = 128
	// etcdSweep is the age-retention sweep of one event append on etcd
	// (bbolt: 64); each deletion costs about 3 operations of a txn.
	etcdSweep = 16
)

// ErrNotLeader: a write transaction on etcd was refused because the fence
// (Store.SetFence) no longer holds: the election key is gone or was created
// again by another campaign, so this controller is not the leader any more.
// Nothing of the transaction was written. Never retried by the store.
var ErrNotLeader = errors.New("not the leader: the election key no longer matches (leadership lost)")

// ErrCommitUncertain: the etcd commit of a write was sent but its answer
// was lost (a timeout, a cut connection, a member that failed meanwhile):
// the write may or may not have been applied. Read the state back before
// doing it again (a repeated lifecycle move answers ErrStaleTransition
// when the first one landed).
var ErrCommitUncertain = errors.New("the etcd commit's outcome is unknown: it may have been applied")

// ErrConflict: an etcd transaction kept conflicting with other writers'
// commits and was given up after its reruns; nothing was written.
var ErrConflict = errors.New("transaction conflicted with concurrent writers too often")

// ErrFenceUnsupported: SetFence on a bbolt store (one process, no election).
var ErrFenceUnsupported = errors.New("fencing needs the etcd engine")

// Fence conditions every write transaction on etcd on the writer still
// holding leadership: the transaction commits only while Key exists with
// CreateRevision equal to Revision, and, when Value is non-empty, with that
// value. For an etcd concurrency.Election campaign won by this process,
// Key is Election.Key() and Revision is Election.Rev() (the leader key's
// create revision, as Election.Proclaim compares it); a new campaign, of
// this process or another, creates a new key and so a new revision.
type Fence struct {
	Key      string
	Revision int64
	Value    string
}

// EtcdConfig says how OpenEtcd reaches etcd. Every zero value is usable
// except Endpoints.
type EtcdConfig struct {
	// Endpoints are the client URLs (http:// or https://host:port).
	Endpoints []string
	// Prefix is the key prefix of this site's records; "" means
	// "/machina/". A trailing "/" is added when missing.
	Prefix string
	// TLS is the client TLS configuration (CA, client certificate); nil
	// means plain connections.
	TLS *tls.Config
	// DialTimeout bounds the first connection; zero means 5 s.
	DialTimeout time.Duration
	// RequestTimeout bounds each etcd request; zero means 10 s.
	RequestTimeout time.Duration
	// Fence, when set, fences every write transaction from the start (see
	// Fence; Store.SetFence changes it later).
	Fence *Fence
	// Client, when set, is used instead of dialling Endpoints; Close does
	// not close it.
	Client *clientv3.Client
}

// OpenEtcd opens the site stored in etcd under cfg.Prefix (creating its
// buckets when the prefix is empty, unless opts.MustExist), migrates it to
// SchemaVersion and checks the master key, as Open does for a file.
// Options.Timeout, NoSync do not apply. Errors: ErrNoStateFile
// (MustExist and no site under the prefix), ErrSchemaVersion,
// ErrWrongMasterKey, and etcd's connection errors.
func OpenEtcd(cfg EtcdConfig, opts Options) (*Store, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	e, err := newEtcdEngine(cfg)
	if err != nil {
		return nil, fmt.Errorf("state: open etcd: %w", err)
	}
	target := e.describe()
	if opts.MustExist {
		var found bool
		err := e.view(func(tx kvTx) error {
			if meta := tx.Bucket(bucketMeta); meta != nil {
				found = meta.Get(keyVersion) != nil
			}
			return nil
		})
		if err == nil && !found {
			err = ErrNoStateFile
		}
		if err != nil {
			e.close()
			return nil, fmt.Errorf("state: open %s: %w", target, err)
		}
	}
	s := newStore(e, target, opts)
	s.sweep, s.pruneBatch = etcdSweep, etcdSweep
	if err := s.init(opts.MasterKey); err != nil {
		e.close()
		return nil, fmt.Errorf("state: open %s: %w", target, err)
	}
	e.watchOthers(s)
	e.startReplica()
	return s, nil
}

// watchOthers makes Notify and SecretsChanged see other controllers'
// commits too: a watch on the events bucket's sequence key (every append
// bumps it) wakes Notify listeners, one on the secrets bucket's generation
// key closes the SecretsChanged channel. The watches end at Close; a
// broken watch (compaction, a lost member) is opened again after a second.
func (e *etcdEngine) watchOthers(s *Store) {
	ctx, cancel := context.WithCancel(context.Background())
	e.stopWatch = cancel
	events := e.prefix + "m/" + escapeBucket(bucketEvents)
	secrets := e.prefix + "g/" + escapeBucket(bucketSecrets)
	go func() {
		for ctx.Err() == nil {
			wch := e.cli.Watch(clientv3.WithRequireLeader(ctx), events, clientv3.WithFilterDelete())
			for resp := range wch {
				if resp.Err() != nil {
					break
				}
				s.wake()
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	go func() {
		for ctx.Err() == nil {
			wch := e.cli.Watch(clientv3.WithRequireLeader(ctx), secrets, clientv3.WithFilterDelete())
			for resp := range wch {
				if resp.Err() != nil {
					break
				}
				s.secretsChanged()
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
}

// SetFence fences every later write transaction (f nil: no fence). Only
// the etcd engine supports it (ErrFenceUnsupported otherwise). A write
// refused by the fence returns an error wrapping ErrNotLeader.
func (s *Store) SetFence(f *Fence) error {
	e, ok := s.eng.(*etcdEngine)
	if !ok {
		return ErrFenceUnsupported
	}
	if f != nil {
		c := *f
		f = &c
	}
	e.fence.Store(f)
	return nil
}

// Engine names the engine of the store: "bbolt" or "etcd".
func (s *Store) Engine() string {
	if _, ok := s.eng.(*etcdEngine); ok {
		return "etcd"
	}
	return "bbolt"
}

type etcdEngine struct {
	cli     *clientv3.Client
	owns    bool
	prefix  string
	timeout time.Duration
	target  string

	closed    atomic.Bool
	reads     atomic.Int64       // etcd reads made by transactions (tests count round trips)
	txns      atomic.Int64       // commits sent (tests count shared transactions)
	stats     etcdCounters       // EtcdStats
	stopWatch context.CancelFunc // ends watchOthers
	stopRep   context.CancelFunc // ends the replica's feed
	rep       *replica           // views' read replica; nil: views read etcd
	lastRev   atomic.Int64       // revision of this process's last commit
	mu        sync.Mutex         // serialises this process's write transactions
	qmu       sync.Mutex         // guards queue
	queue     []*batchCall
	// cache holds records as this process last read or wrote them in
	// update transactions (guarded by mu): a controller that is the only
	// writer of its site reads them without a round trip, and the commit's
	// compares catch a record another process changed (the cache is then
	// dropped and the transaction rerun from etcd). Views never use it.
	cache map[string]cachedKV
	fence atomic.Pointer[Fence]
	known sync.Map // top-level bucket name → struct{}: exists (they are never deleted)
}

func newEtcdEngine(cfg EtcdConfig) (*etcdEngine, error) {
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = "/machina/"
	}
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	e := &etcdEngine{cli: cfg.Client, prefix: prefix, timeout: cfg.RequestTimeout}
	if e.timeout <= 0 {
		e.timeout = 10 * time.Second
	}
	if e.cli == nil {
		if len(cfg.Endpoints) == 0 {
			return nil, fmt.Errorf("no etcd endpoints: %w", ErrInvalid)
		}
		dial := cfg.DialTimeout
		if dial <= 0 {
			dial = 5 * time.Second
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, TLS: cfg.TLS, DialTimeout: dial,
			Logger: zap.NewNop()})
		if err != nil {
			return nil, err
		}
		e.cli, e.owns = cli, true
		// clientv3.New does not wait for a connection: check one now so a
		// wrong address fails Open, not the first write.
		ctx, cancel := context.WithTimeout(context.Background(), dial)
		_, err = cli.Get(ctx, prefix+"m/meta")
		cancel()
		if err != nil {
			cli.Close()
			return nil, fmt.Errorf("reach %s: %w", strings.Join(cfg.Endpoints, ","), err)
		}
	}
	e.target = "etcd://" + strings.Join(hostsOf(e.cli.Endpoints()), ",") + strings.TrimSuffix(prefix, "/")
	if cfg.Fence != nil {
		f := *cfg.Fence
		e.fence.Store(&f)
	}
	return e, nil
}

// hostsOf strips the scheme of each endpoint URL.
func hostsOf(eps []string) []string {
	out := make([]string, len(eps))
	for i, ep := range eps {
		if j := strings.Index(ep, "://"); j >= 0 {
			ep = ep[j+3:]
		}
		out[i] = ep
	}
	return out
}

func (e *etcdEngine) describe() string { return e.target }

func (e *etcdEngine) close() error {
	if e.closed.Swap(true) {
		return nil
	}
	if e.stopWatch != nil {
		e.stopWatch()
	}
	if e.stopRep != nil {
		e.stopRep()
	}
	if e.owns {
		return e.cli.Close()
	}
	return nil
}

func (e *etcdEngine) view(fn func(tx kvTx) error) error {
	if e.closed.Load() {
		return ErrClosed
	}
	e.stats.views.Add(1)
	if e.rep != nil {
		if ok, err := e.rep.view(fn); ok {
			return err
		}
	}
	e.stats.viewsDirect.Add(1)
	for attempt := 0; ; attempt++ {
		tx := e.newTx(false)
		err := fn(tx)
		if tx.err != nil {
			if errors.Is(tx.err, rpctypes.ErrCompacted) && attempt < maxAttempts {
				continue
			}
			return fmt.Errorf("etcd read: %w", tx.err)
		}
		return err
	}
}

// batch runs fn in one etcd transaction with the other batch calls
// waiting for the writer lock (at most maxBatch), as bbolt's DB.Batch
// shares a commit: each call that finds the lock free takes the queue's
// head. A call that fails is taken out and run alone (so its error is its
// own), and the rest run again without it.
func (e *etcdEngine) batch(fn func(tx kvTx) error) error {
	if e.closed.Load() {
		return ErrClosed
	}
	c := &batchCall{fn: fn, done: make(chan error, 1)}
	e.qmu.Lock()
	e.queue = append(e.queue, c)
	e.qmu.Unlock()
	// Every queued call's caller takes one turn at the lock and runs up to
	// maxBatch calls from the head, so the calls still queued never
	// outnumber the callers yet to take their turn: every call runs.
	t0 := time.Now()
	e.mu.Lock()
	e.stats.lockWaitNanos.Add(int64(time.Since(t0)))
	e.qmu.Lock()
	n := min(len(e.queue), maxBatch)
	calls := append([]*batchCall(nil), e.queue[:n]...)
	e.queue = e.queue[n:]
	e.qmu.Unlock()
	e.runBatch(calls)
	e.mu.Unlock()
	err := <-c.done
	var p panicked
	switch {
	case errors.As(err, &p):
		panic(p.v) // in its own caller, as bbolt's Batch does
	case err != errTrySolo:
		return err
	}
	return e.solo(fn)
}

// panicked is a batch call's panic, carried to its own caller.
type panicked struct{ v any }

func (p panicked) Error() string { return fmt.Sprintf("panic: %v", p.v) }

// safeCall runs fn, turning a panic into a panicked error: a call run in
// another caller's shared transaction must not panic there (that caller
// would hold the writer lock and the others would wait for ever).
func safeCall(fn func(tx kvTx) error, tx kvTx) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = panicked{v}
		}
	}()
	return fn(tx)
}

// solo runs fn in a transaction of its own.
func (e *etcdEngine) solo(fn func(tx kvTx) error) error {
	if e.closed.Load() {
		return ErrClosed
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	err := e.updateLocked(fn, false)
	if err == nil {
		e.stats.updates.Add(1)
		e.stats.calls.Add(1)
	}
	return err
}

type batchCall struct {
	fn   func(tx kvTx) error
	done chan error
}

var errTrySolo = errors.New("batch call failed: run it alone")

// errBatchTooBig: a shared transaction past maxBatchOps, not sent.
var errBatchTooBig = errors.New("shared transaction too large: run its calls alone")

// refusedError is a commit etcd refused outright (nothing applied).
type refusedError struct{ error }

func (r refusedError) Unwrap() error { return r.error }

// runBatch runs calls in one transaction; e.mu is held.
//
// A call that ends with errRollback having written nothing (a token check,
// a refusal, a replayed answer) stays in the shared transaction: it
// decided on what it read, and those reads are in the commit's compares
// like everyone's, so the commit that lands the others' writes also
// proves its answer current. It then costs no turn of its own at the
// writer lock and no rerun of the others.
//
// A transaction takes calls while its operations and compares stay under
// half of maxBatchOps; the calls it leaves run in the next one.
func (e *etcdEngine) runBatch(calls []*batchCall) {
	for len(calls) > 0 {
		failed, taken := -1, len(calls)
		shared := len(calls) > 1
		rolled := make([]bool, len(calls))
		err := e.updateLocked(func(t kvTx) error {
			failed, taken = -1, len(calls)
			tx := t.(*etcdTx)
			for i, c := range calls {
				if i > 0 && tx.full() {
					taken = i
					break
				}
				before := tx.wrote
				err := safeCall(c.fn, tx)
				rolled[i] = shared && err == errRollback && tx.wrote == before
				if err != nil && !rolled[i] {
					failed = i
					return err
				}
			}
			return nil
		}, shared)
		var refusal refusedError
		if shared && failed < 0 && (errors.Is(err, errBatchTooBig) || errors.As(err, &refusal)) {
			// Too large together (or refused together): each alone.
			for _, c := range calls[:taken] {
				c.done <- errTrySolo
			}
			calls = calls[taken:]
			continue
		}
		if failed >= 0 && len(calls) > 1 {
			calls[failed].done <- errTrySolo
			calls = append(calls[:failed:failed], calls[failed+1:]...)
			continue
		}
		if err == nil {
			e.stats.updates.Add(1)
			e.stats.calls.Add(int64(taken))
		}
		for i, c := range calls[:taken] {
			switch {
			case rolled[i] && err == nil:
				c.done <- errRollback
			case rolled[i] && errors.Is(err, ErrNotLeader):
				// Its answer wrote nothing: give it as it would have
				// been given alone, not the others' refusal.
				c.done <- errTrySolo
			default:
				c.done <- err
			}
		}
		calls = calls[taken:]
	}
}

// full reports whether a shared transaction should take no more calls:
// its writes (plus a generation and a sequence key per bucket) or its
// compares are past half of maxBatchOps, so one more call (a lifecycle
// move is about 6 operations) is unlikely to push it past etcd's
// --max-txn-ops.
func (tx *etcdTx) full() bool {
	cmps := len(tx.keyReads) + len(tx.genReads) + len(tx.createReads)
	return tx.wrote+2*len(tx.buckets) > maxBatchOps/2 || cmps > maxBatchOps/2
}

// update shares transactions as batch does: writers of one process are
// serialised anyway (e.mu), so the updates that wait for the lock while
// one commits go to etcd together in the next transaction, one round trip
// for up to maxBatch of them instead of one each. The engine contract
// already lets update rerun fn (a conflict does); a call that fails is
// rerun alone, so its error is its own.
func (e *etcdEngine) update(fn func(tx kvTx) error) error { return e.batch(fn) }

// updateLocked is one transaction with e.mu held; shared: it carries
// several calls (not sent past maxBatchOps).
func (e *etcdEngine) updateLocked(fn func(tx kvTx) error, shared bool) error {
	noCache := false
	for attempt := 0; attempt < maxAttempts; attempt++ {
		tx := e.newTx(true)
		tx.shared = shared
		tx.useCache = !noCache
		err := fn(tx)
		if tx.err != nil {
			e.cache = nil
			if errors.Is(tx.err, rpctypes.ErrCompacted) {
				continue
			}
			return fmt.Errorf("etcd read: %w", tx.err)
		}
		if err != nil {
			if tx.usedCache {
				// fn decided on cached records, which only the commit's
				// compares would have checked: check them alone (one
				// compare-only etcd transaction, a linearizable read
				// without a raft write); when one changed, decide again
				// on a snapshot.
				if ok, verr := tx.validate(); ok && verr == nil {
					return err
				}
				e.cache = nil
				e.stats.cacheReruns.Add(1)
				noCache = true
				continue
			}
			return err
		}
		ok, err := tx.commit()
		if errors.Is(err, errBatchTooBig) {
			return err // not sent: the cache still holds
		}
		if err != nil {
			e.cache = nil
			return err
		}
		if ok {
			tx.remember()
			return nil
		}
		e.cache = nil
		// Lost a race with another process: back off a little (jittered
		// by the attempt number) and rerun from a new snapshot.
		time.Sleep(time.Duration(attempt+1) * time.Millisecond)
	}
	return ErrConflict
}

func (e *etcdEngine) newTx(writable bool) *etcdTx {
	return &etcdTx{e: e, writable: writable, buckets: map[string]*etcdBucket{},
		keyReads: map[string]int64{}, genReads: map[string]int64{}, createReads: map[string]int64{}}
}

// etcdTx is one transaction (see the package comment above).
type etcdTx struct {
	e        *etcdEngine
	writable bool
	rev      int64 // snapshot revision; 0 until the first read
	err      error // first read error: the transaction fails

	buckets map[string]*etcdBucket // by escaped path

	keyReads    map[string]int64 // etcd key → ModRevision seen (0: absent)
	genReads    map[string]int64 // generation key → ModRevision seen
	createReads map[string]int64 // existence key → CreateRevision seen

	rep   *replica // a view on the read replica (its read lock held)
	wrote int      // writes buffered so far (puts, deletes, buckets, sequences)
	// cachedReads: point reads served by the write cache, each its own
	// compare; past maxCachedReads the rest read etcd at the snapshot
	// (guarded by bucket past maxPointReads), keeping the compares under
	// etcd's --max-txn-ops.
	cachedReads int
	shared      bool                // carries several batch calls: bounded by maxBatchOps
	useCache    bool                // point reads may come from e.cache
	usedCache   bool                // some did
	fetched     map[string]cachedKV // point reads made from etcd
}

// cachedKV is a record as this process last read or wrote it.
type cachedKV struct {
	v       []byte // nil when absent
	present bool
	mod     int64 // ModRevision (0: absent)
	create  int64 // CreateRevision (0: absent)
}

// point reads one key: from the write cache in an update (the compares of
// the commit check it is still current) or from etcd at the snapshot.
func (tx *etcdTx) point(key string) (cachedKV, bool) {
	c, ok, _ := tx.pointFrom(key)
	return c, ok
}

// pointFrom is point; cached: the record came from the write cache (so
// from some earlier revision than the snapshot's, and only a compare on
// this very key can show it current).
func (tx *etcdTx) pointFrom(key string) (c cachedKV, ok, cached bool) {
	if tx.rep != nil {
		return tx.rep.get(key), true, false
	}
	if tx.useCache && tx.cachedReads < maxCachedReads {
		if c, ok := tx.e.cache[key]; ok {
			tx.usedCache = true
			tx.cachedReads++
			tx.e.stats.cacheHits.Add(1)
			return c, true, true
		}
	}
	if tx.writable {
		tx.e.stats.cacheMisses.Add(1)
	}
	resp := tx.get(key)
	if resp == nil {
		return cachedKV{}, false, false
	}
	if len(resp.Kvs) > 0 {
		kv := resp.Kvs[0]
		c = cachedKV{v: kv.Value, present: true, mod: kv.ModRevision, create: kv.CreateRevision}
		if c.v == nil {
			c.v = []byte{}
		}
	}
	if tx.writable {
		if tx.fetched == nil {
			tx.fetched = map[string]cachedKV{}
		}
		tx.fetched[key] = c
	}
	return c, true, false
}

// learn updates the write cache after a commit at revision rev: what the
// transaction read from etcd is current, what it wrote is as written. A
// record put without being known first (a token minted, an event
// appended) is kept with its mod revision, all its compares use; a
// bucket's existence key put so is dropped: its create revision, which
// the existence compare uses, is unknown.
func (tx *etcdTx) learn(rev int64, o *txOps) {
	e := tx.e
	if e.cache == nil || len(e.cache) > maxCached {
		e.cache = map[string]cachedKV{}
	}
	for k, c := range tx.fetched {
		e.cache[k] = c
	}
	for k := range o.dels {
		e.cache[k] = cachedKV{}
	}
	records := e.prefix + "k/"
	for k, v := range o.puts {
		old, known := e.cache[k]
		switch {
		case !known && strings.HasPrefix(k, records) && !o.appends[k]:
			e.cache[k] = cachedKV{v: v, present: true, mod: rev}
		case !known:
			delete(e.cache, k)
		case old.present:
			e.cache[k] = cachedKV{v: v, present: true, mod: rev, create: old.create}
		default:
			e.cache[k] = cachedKV{v: v, present: true, mod: rev, create: rev}
		}
	}
}

func (tx *etcdTx) fail(err error) {
	if tx.err == nil {
		tx.err = err
	}
}

// get reads at the snapshot revision (fixing it on the first read).
func (tx *etcdTx) get(key string, opts ...clientv3.OpOption) *clientv3.GetResponse {
	if tx.err != nil {
		return nil
	}
	if tx.rev > 0 {
		opts = append(opts, clientv3.WithRev(tx.rev))
	}
	ctx, cancel := context.WithTimeout(context.Background(), tx.e.timeout)
	defer cancel()
	tx.e.reads.Add(1)
	t0 := time.Now()
	resp, err := tx.e.cli.Get(ctx, key, opts...)
	if tx.writable {
		tx.e.stats.updateReads.Add(1)
		tx.e.stats.updateReadNanos.Add(int64(time.Since(t0)))
	} else {
		tx.e.stats.viewReads.Add(1)
		tx.e.stats.viewReadNanos.Add(int64(time.Since(t0)))
	}
	if err != nil {
		tx.fail(err)
		return nil
	}
	if tx.rev == 0 {
		tx.rev = resp.Header.Revision
	}
	return resp
}

func (tx *etcdTx) Bucket(name []byte) kvBucket {
	b := tx.bucket(nil, name)
	if b == nil {
		return nil
	}
	return b
}

func (tx *etcdTx) CreateBucketIfNotExists(name []byte) (kvBucket, error) {
	return tx.createBucket(nil, name)
}

// bucket returns the bucket handle for parent/name, or nil when it does
// not exist (or a read failed).
func (tx *etcdTx) bucket(parent *etcdBucket, name []byte) *etcdBucket {
	b := tx.handle(parent, name)
	if b.exists {
		return b
	}
	return nil
}

// handle returns the cached handle of parent/name, loading its existence.
func (tx *etcdTx) handle(parent *etcdBucket, name []byte) *etcdBucket {
	id := escapeBucket(name)
	if parent != nil {
		id = parent.id + "/" + id
	}
	if b, ok := tx.buckets[id]; ok {
		return b
	}
	p := tx.e.prefix
	b := &etcdBucket{tx: tx, id: id, top: parent == nil, name: string(name),
		dataPfx: p + "k/" + id + "=", metaKey: p + "m/" + id, genKey: p + "g/" + id,
		writes: map[string]etcdWrite{}, base: map[string][]byte{}, points: map[string][]byte{}}
	tx.buckets[id] = b
	if b.top {
		if _, ok := tx.e.known.Load(b.name); ok {
			b.exists = true
			return b
		}
	}
	c, ok := tx.point(b.metaKey)
	if !ok {
		return b
	}
	if !c.present {
		tx.createReads[b.metaKey] = 0
		return b
	}
	tx.createReads[b.metaKey] = c.create
	b.exists, b.seq, b.seqLoaded, b.metaRev = true, btoi(c.v), true, c.mod
	return b
}

func (tx *etcdTx) createBucket(parent *etcdBucket, name []byte) (kvBucket, error) {
	if !tx.writable {
		return nil, errTxNotWritable
	}
	if len(name) == 0 {
		return nil, fmt.Errorf("empty bucket name: %w", ErrInvalid)
	}
	b := tx.handle(parent, name)
	if tx.err != nil {
		return nil, tx.err
	}
	if !b.exists {
		b.exists, b.created, b.seq, b.seqLoaded = true, true, 0, true
		b.dirty = true
		tx.wrote++
	}
	return b, nil
}

var errTxNotWritable = errors.New("tx not writable")

// remember records the top-level buckets a committed transaction saw or
// made, so later transactions skip their existence read.
func (tx *etcdTx) remember() {
	for _, b := range tx.buckets {
		if b.top && b.exists {
			tx.e.known.Store(b.name, struct{}{})
		}
	}
}

// txOps is a transaction's etcd operations and what they will leave in
// the write cache once committed (puts: key to value; dels: deleted keys).
type txOps struct {
	ops  []clientv3.Op
	puts map[string][]byte
	dels map[string]bool
	// appends: records put in append-only buckets (SetFillPercent: the
	// event logs), not kept in the write cache unless already there
	appends map[string]bool
}

func (o *txOps) put(k string, v []byte) {
	o.ops = append(o.ops, clientv3.OpPut(k, string(v)))
	o.puts[k] = v
}

func (o *txOps) del(k string) {
	o.ops = append(o.ops, clientv3.OpDelete(k))
	o.dels[k] = true
}

// buildOps turns the buffered writes of every bucket, in bucket order,
// into etcd operations.
func (tx *etcdTx) buildOps() (*txOps, error) {
	o := &txOps{puts: map[string][]byte{}, dels: map[string]bool{}, appends: map[string]bool{}}
	ids := make([]string, 0, len(tx.buckets))
	for id := range tx.buckets {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if err := tx.bucketOps(o, tx.buckets[id]); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// bucketOps appends b's operations to o: a whole-bucket delete, or its
// record writes, its sequence and its generation key.
func (tx *etcdTx) bucketOps(o *txOps, b *etcdBucket) error {
	if b.deleted && !b.exists {
		o.ops = append(o.ops, clientv3.OpDelete(b.dataPfx, clientv3.WithPrefix()),
			clientv3.OpDelete(b.metaKey), clientv3.OpDelete(b.genKey))
		o.dels[b.metaKey], o.dels[b.genKey] = true, true
		for k := range tx.e.cache {
			if strings.HasPrefix(k, b.dataPfx) {
				delete(tx.e.cache, k)
			}
		}
		return nil
	}
	if b.deleted {
		// Deleted and made again in this transaction: etcd refuses a
		// range delete and a put of one key in one txn, so delete the
		// old records one by one.
		old := tx.get(b.dataPfx, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if tx.err != nil {
			return fmt.Errorf("etcd read: %w", tx.err)
		}
		for _, kv := range old.Kvs {
			if _, ok := b.writes[strings.TrimPrefix(string(kv.Key), b.dataPfx)]; !ok {
				o.del(string(kv.Key))
			}
		}
	}
	for _, k := range b.wkeys {
		if w := b.writes[k]; w.del {
			o.del(b.dataPfx + k)
		} else {
			o.put(b.dataPfx+k, w.v)
			if b.appendOnly {
				o.appends[b.dataPfx+k] = true
			}
		}
	}
	if b.created || b.seqDirty {
		o.put(b.metaKey, u64(b.seq))
	}
	if b.dirty || b.deleted {
		o.ops = append(o.ops, clientv3.OpPut(b.genKey, ""))
	}
	return nil
}

// compares is the read set as etcd compares (records' and generation
// keys' mod revisions, created buckets' create revisions) plus the
// fence's, with the read of the fence key to run when they fail.
func (tx *etcdTx) compares(fence *Fence) (cmps []clientv3.Cmp, orElse []clientv3.Op) {
	for k, r := range tx.keyReads {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", r))
	}
	for k, r := range tx.genReads {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", r))
	}
	for k, r := range tx.createReads {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k), "=", r))
	}
	if fence != nil {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(fence.Key), "=", fence.Revision))
		if fence.Value != "" {
			cmps = append(cmps, clientv3.Compare(clientv3.Value(fence.Key), "=", fence.Value))
		}
		orElse = append(orElse, clientv3.OpGet(fence.Key))
	}
	return cmps, orElse
}

// commit sends the buffered writes guarded by the read set. ok false: a
// compare failed (rerun); err ErrNotLeader: the fence failed.
func (tx *etcdTx) commit() (bool, error) {
	o, err := tx.buildOps()
	if err != nil {
		return false, err
	}
	ops := o.ops
	if len(ops) == 0 && !tx.usedCache {
		return true, nil
	}
	fence := tx.e.fence.Load()
	cmps, orElse := tx.compares(fence)
	if tx.shared && (len(ops) > maxBatchOps || len(cmps) > maxBatchOps) {
		return false, errBatchTooBig
	}
	then := ops
	if len(ops) == 0 {
		// Only reads to confirm (fn read the write cache and wrote
		// nothing): make etcd answer them linearizably.
		then = []clientv3.Op{tx.e.linearizer()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), tx.e.timeout)
	defer cancel()
	tx.e.txns.Add(1)
	t0 := time.Now()
	resp, err := tx.e.cli.Txn(ctx).If(cmps...).Then(then...).Else(orElse...).Commit()
	tx.e.stats.txnNanos.Add(int64(time.Since(t0)))
	tx.e.stats.txnOps.Add(int64(len(ops)))
	tx.e.stats.txnCmps.Add(int64(len(cmps)))
	if err != nil {
		if refused(err) {
			return false, fmt.Errorf("etcd commit (%d operations, %d compares): %w", len(ops), len(cmps), refusedError{err})
		}
		return false, fmt.Errorf("etcd commit (%d operations, %d compares): %w: %w", len(ops), len(cmps), ErrCommitUncertain, err)
	}
	if !resp.Succeeded {
		tx.e.stats.conflicts.Add(1)
	}
	if resp.Succeeded {
		tx.learn(resp.Header.Revision, o)
		tx.e.noteCommit(resp.Header.Revision, ops)
		return true, nil
	}
	if fence != nil && len(ops) > 0 {
		got := resp.Responses[0].GetResponseRange()
		if got == nil || len(got.Kvs) == 0 || got.Kvs[0].CreateRevision != fence.Revision ||
			(fence.Value != "" && string(got.Kvs[0].Value) != fence.Value) {
			return false, fmt.Errorf("write refused by the fence on %s: %w", fence.Key, ErrNotLeader)
		}
	}
	return false, nil
}

// validate reports whether every record the transaction read is still as
// it read it, by an etcd transaction of its compares and no write (etcd
// answers it as a read, without a raft entry; the linearizer op makes it
// a linearizable one). The fence is not compared: the caller writes
// nothing on the answer.
func (tx *etcdTx) validate() (bool, error) {
	cmps, _ := tx.compares(nil)
	if len(cmps) > maxBatchOps {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), tx.e.timeout)
	defer cancel()
	tx.e.txns.Add(1)
	t0 := time.Now()
	resp, err := tx.e.cli.Txn(ctx).If(cmps...).Then(tx.e.linearizer()).Commit()
	tx.e.stats.txnNanos.Add(int64(time.Since(t0)))
	tx.e.stats.txnCmps.Add(int64(len(cmps)))
	tx.e.stats.validations.Add(1)
	if err != nil {
		return false, err
	}
	if !resp.Succeeded {
		tx.e.stats.conflicts.Add(1)
	}
	return resp.Succeeded, nil
}

// linearizer is a count-only linearizable range read of one key, for a
// transaction without writes: etcd serves a read-only transaction whose
// every operation is a serializable range (none at all included) from
// the member's local state, which may lag the cluster, so compares alone
// could pass on records another process has changed since; one
// linearizable range makes the member confirm it is current first (etcd
// server's isTxnSerializable, linearizableReadNotify).
func (e *etcdEngine) linearizer() clientv3.Op {
	return clientv3.OpGet(e.prefix+"m/"+escapeBucket(bucketMeta), clientv3.WithCountOnly())
}

// refused reports whether etcd refused a request outright (bad request,
// too many operations, too large, no permission), so it was not applied.
func refused(err error) bool {
	var code codes.Code
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		code = ee.Code()
	} else if st, ok := status.FromError(err); ok {
		code = st.Code()
	} else {
		return false
	}
	switch code {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied, codes.Unauthenticated, codes.OutOfRange:
		return true
	}
	return false
}

// etcdWrite is a buffered write: a value, or a deletion.
type etcdWrite struct {
	v   []byte
	del bool
}

// etcdBucket is one bucket within one transaction.
type etcdBucket struct {
	tx      *etcdTx
	id      string // escaped path
	name    string // raw name (top-level buckets)
	top     bool
	dataPfx string
	metaKey string
	genKey  string

	exists     bool
	created    bool // made in this transaction
	deleted    bool // deleted in this transaction: stored records are hidden
	seq        uint64
	seqLoaded  bool
	seqRead    bool // the sequence was read: guard it
	seqDirty   bool
	metaRev    int64
	dirty      bool // written in this transaction: bump the generation
	appendOnly bool // SetFillPercent was called: an append-only log

	writes map[string]etcdWrite
	wkeys  []string // sorted keys of writes

	// Records read from etcd: base by range (within cov), points by key
	// (nil value: absent).
	base       map[string][]byte
	bkeys      []string // sorted keys of base
	cov        []interval
	points     map[string][]byte
	pointReads int
	guarded    bool  // the generation is in the read set
	page       int64 // the next cursor read's size
}

// interval is a covered key range [lo, hi) of a bucket; inf: to its end.
type interval struct {
	lo, hi string
	inf    bool
}

func (b *etcdBucket) guard() {
	if b.guarded || b.created && !b.deleted || !b.tx.writable {
		// (a view never commits: nothing to guard)
		return
	}
	b.guarded = true
	resp := b.tx.get(b.genKey)
	if resp == nil {
		return
	}
	var r int64
	if len(resp.Kvs) > 0 {
		r = resp.Kvs[0].ModRevision
	}
	b.tx.genReads[b.genKey] = r
}

func (b *etcdBucket) Get(key []byte) []byte {
	k := string(key)
	if w, ok := b.writes[k]; ok {
		if w.del {
			return nil
		}
		return w.v
	}
	if b.deleted || b.created {
		return nil
	}
	if b.covered(k) {
		return b.base[k]
	}
	if v, ok := b.points[k]; ok {
		return v
	}
	c, ok, cached := b.tx.pointFrom(b.dataPfx + k)
	if !ok {
		return nil
	}
	var v []byte
	if c.present {
		v = append([]byte{}, c.v...)
	}
	r := c.mod
	b.points[k] = v
	if cached {
		// Only this key's compare shows a cached record current: the
		// bucket's generation (the guard) is read at the snapshot, and
		// a write another process made between the record's caching
		// and the snapshot leaves it unchanged since.
		b.tx.keyReads[b.dataPfx+k] = r
		return v
	}
	b.pointReads++
	switch {
	case b.guarded:
	case b.pointReads > maxPointReads:
		b.guard()
	default:
		b.tx.keyReads[b.dataPfx+k] = r
	}
	return v
}

func (b *etcdBucket) write(key []byte, w etcdWrite) error {
	if !b.tx.writable {
		return errTxNotWritable
	}
	if len(key) == 0 {
		return fmt.Errorf("empty key: %w", ErrInvalid)
	}
	k := string(key)
	if _, ok := b.writes[k]; !ok {
		i := sort.SearchStrings(b.wkeys, k)
		b.wkeys = append(b.wkeys, "")
		copy(b.wkeys[i+1:], b.wkeys[i:])
		b.wkeys[i] = k
	}
	b.writes[k] = w
	b.dirty = true
	b.tx.wrote++
	return nil
}

func (b *etcdBucket) Put(key, value []byte) error {
	return b.write(key, etcdWrite{v: append([]byte{}, value...)})
}

func (b *etcdBucket) Delete(key []byte) error { return b.write(key, etcdWrite{del: true}) }

func (b *etcdBucket) ForEach(fn func(k, v []byte) error) error {
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if err := fn(k, v); err != nil {
			return err
		}
	}
	return b.tx.err
}

func (b *etcdBucket) Cursor() kvCursor { return &etcdCursor{b: b} }

func (b *etcdBucket) Sequence() uint64 {
	if !b.seqLoaded {
		c, ok := b.tx.point(b.metaKey)
		if !ok {
			return 0
		}
		if c.present {
			b.seq, b.metaRev = btoi(c.v), c.mod
		}
		b.seqLoaded = true
	}
	if !b.seqRead && !b.created {
		b.seqRead = true
		b.tx.keyReads[b.metaKey] = b.metaRev
	}
	return b.seq
}

func (b *etcdBucket) NextSequence() (uint64, error) {
	if !b.tx.writable {
		return 0, errTxNotWritable
	}
	seq := b.Sequence()
	if b.tx.err != nil {
		return 0, b.tx.err
	}
	b.seq = seq + 1
	b.seqDirty, b.dirty = true, true
	b.tx.wrote++
	return b.seq, nil
}

func (b *etcdBucket) Bucket(name []byte) kvBucket {
	nb := b.tx.bucket(b, name)
	if nb == nil {
		return nil
	}
	return nb
}

func (b *etcdBucket) CreateBucketIfNotExists(name []byte) (kvBucket, error) {
	return b.tx.createBucket(b, name)
}

func (b *etcdBucket) DeleteBucket(name []byte) error {
	if !b.tx.writable {
		return errTxNotWritable
	}
	nb := b.tx.bucket(b, name)
	if b.tx.err != nil {
		return b.tx.err
	}
	if nb == nil {
		return fmt.Errorf("delete bucket %s: %w", name, ErrNotFound)
	}
	b.tx.wrote++
	if nb.created && !nb.deleted {
		// Made in this transaction only: forget it.
		delete(b.tx.buckets, nb.id)
		nb2 := b.tx.handle(b, name)
		nb2.exists = false
		return nil
	}
	nb.deleted, nb.exists, nb.created = true, false, false
	nb.writes, nb.wkeys = map[string]etcdWrite{}, nil
	nb.seq, nb.seqLoaded, nb.seqDirty = 0, true, false
	return nil
}

// SetFillPercent marks the bucket append-only (the store calls it on its
// event logs): its new records are not kept in the write cache.
func (b *etcdBucket) SetFillPercent(float64) { b.appendOnly = true }

func (b *etcdBucket) KeyN() int {
	if b.deleted || b.created {
		return len(b.wkeys)
	}
	if b.tx.rep != nil {
		return b.tx.rep.count(b.dataPfx)
	}
	resp := b.tx.get(b.dataPfx, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if resp == nil {
		return 0
	}
	return int(resp.Count) + len(b.wkeys)
}

// covered reports whether k lies in a range read from etcd.
func (b *etcdBucket) covered(k string) bool {
	_, _, ok := b.coverOf(k)
	return ok
}

func (b *etcdBucket) coverOf(k string) (string, bool, bool) {
	for _, iv := range b.cov {
		if k >= iv.lo && (iv.inf || k < iv.hi) {
			return iv.hi, iv.inf, true
		}
	}
	return "", false, false
}

// ensure makes sure the range from k on is read, one page at least, and
// returns the end of the covered range holding k.
func (b *etcdBucket) ensure(k string) (hi string, inf bool) {
	if hi, inf, ok := b.coverOf(k); ok {
		return hi, inf
	}
	b.guard()
	switch {
	case b.page == 0:
		b.page = etcdFirstPage
	case b.page < etcdPage:
		b.page *= 2
	}
	resp := b.tx.get(b.dataPfx+k, clientv3.WithRange(clientv3.GetPrefixRangeEnd(b.dataPfx)),
		clientv3.WithLimit(b.page))
	if resp == nil {
		return "", true // the read failed: tx.err ends the transaction
	}
	iv := interval{lo: k, inf: !resp.More}
	for _, kv := range resp.Kvs {
		rk := strings.TrimPrefix(string(kv.Key), b.dataPfx)
		if _, seen := b.base[rk]; seen {
			continue
		}
		v := kv.Value
		if v == nil {
			v = []byte{}
		}
		b.base[rk] = v
		if n := len(b.bkeys); n == 0 || rk > b.bkeys[n-1] {
			b.bkeys = append(b.bkeys, rk)
		} else {
			i := sort.SearchStrings(b.bkeys, rk)
			b.bkeys = append(b.bkeys, "")
			copy(b.bkeys[i+1:], b.bkeys[i:])
			b.bkeys[i] = rk
		}
		iv.hi = rk + "\x00"
	}
	if iv.inf {
		iv.hi = ""
	}
	b.cov = append(b.cov, iv)
	return iv.hi, iv.inf
}

// baseNext returns the first stored record with key ≥ k.
func (b *etcdBucket) baseNext(k string) (string, []byte, bool) {
	if b.deleted || b.created {
		return "", nil, false
	}
	for b.tx.err == nil {
		hi, inf := b.ensure(k)
		i := sort.SearchStrings(b.bkeys, k)
		if i < len(b.bkeys) && (inf || b.bkeys[i] < hi) {
			return b.bkeys[i], b.base[b.bkeys[i]], true
		}
		if inf {
			return "", nil, false
		}
		k = hi
	}
	return "", nil, false
}

// next returns the first record with key ≥ k as this transaction sees it.
func (b *etcdBucket) next(k string) ([]byte, []byte) {
	if !b.exists {
		return nil, nil
	}
	if b.tx.rep != nil {
		return b.tx.rep.next(b.dataPfx, k)
	}
	for {
		bk, bv, bok := b.baseNext(k)
		i := sort.SearchStrings(b.wkeys, k)
		if i < len(b.wkeys) && (!bok || b.wkeys[i] <= bk) {
			wk := b.wkeys[i]
			w := b.writes[wk]
			if w.del {
				k = wk + "\x00"
				continue
			}
			return []byte(wk), w.v
		}
		if bok {
			return []byte(bk), bv
		}
		return nil, nil
	}
}

type etcdCursor struct {
	b   *etcdBucket
	cur []byte
}

func (c *etcdCursor) set(k, v []byte) ([]byte, []byte) {
	c.cur = k
	return k, v
}

func (c *etcdCursor) First() ([]byte, []byte) { return c.set(c.b.next("")) }

func (c *etcdCursor) Seek(seek []byte) ([]byte, []byte) { return c.set(c.b.next(string(seek))) }

func (c *etcdCursor) Next() ([]byte, []byte) {
	if c.cur == nil {
		return nil, nil
	}
	return c.set(c.b.next(string(c.cur) + "\x00"))
}

// escapeBucket escapes a bucket name for a key path: bytes outside
// [A-Za-z0-9._-] become %XX, so "/" and "=" never appear raw.
func escapeBucket(name []byte) string {
	var sb strings.Builder
	for _, c := range name {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
			sb.WriteByte(c)
		default:
			fmt.Fprintf(&sb, "%%%02X", c)
		}
	}
	return sb.String()
}

// etcdCounters are the engine's request counters (EtcdStats).
type etcdCounters struct {
	updateReads, viewReads, revReads     atomic.Int64
	updateReadNanos, viewReadNanos       atomic.Int64
	revReadNanos                         atomic.Int64
	txnNanos, txnOps, txnCmps, conflicts atomic.Int64
	updates, calls                       atomic.Int64
	cacheHits, cacheMisses, cacheReruns  atomic.Int64
	validations                          atomic.Int64
	views, viewsDirect                   atomic.Int64
	lockWaitNanos, viewWaitNanos         atomic.Int64
}

// EtcdStats counts the etcd engine's requests and where its callers wait,
// since Open (all counters only grow). Durations are summed over
// concurrent callers, so they can exceed the wall time.
type EtcdStats struct {
	// Commits is the Txn requests sent (one round trip each);
	// Conflicts the ones whose compares failed (the transaction reran
	// from a new snapshot, or the fence refused it). CommitTime is their
	// summed round-trip time; Ops and Compares their summed operations
	// and compares.
	Commits, Conflicts, Ops, Compares int64
	CommitTime                        time.Duration
	// Updates is the write transactions committed, Calls the update and
	// batch calls they carried (Calls/Updates: calls per shared
	// transaction).
	Updates, Calls int64
	// UpdateReads is the range reads (point, range, count) made by write
	// transactions, one round trip each; UpdateReadTime their summed time.
	UpdateReads    int64
	UpdateReadTime time.Duration
	// CacheHits and CacheMisses split the write transactions' point
	// reads between the write cache and etcd; CacheReruns counts
	// transaction functions that failed after reading the cache and were
	// rerun from a snapshot.
	CacheHits, CacheMisses, CacheReruns int64
	// Views is the read transactions, ViewsDirect the ones that read
	// etcd (the replica was loading, broken or lagging) and ViewReads
	// their range reads; RevisionReads the replica's reads of etcd's
	// current revision (each shared by the views that arrived while the
	// previous one was in flight).
	Views, ViewsDirect, ViewReads, RevisionReads int64
	ViewReadTime, RevisionReadTime               time.Duration
	// WriterWait is the summed time write calls waited for the
	// process's writer lock (writers are serialised, each commit one
	// round trip); ViewWait the summed time views waited for the
	// current revision and the replica to reach it.
	WriterWait, ViewWait time.Duration
}

// EtcdStats returns the etcd engine's counters; false on a bbolt store.
func (s *Store) EtcdStats() (EtcdStats, bool) {
	e, ok := s.eng.(*etcdEngine)
	if !ok {
		return EtcdStats{}, false
	}
	c := &e.stats
	return EtcdStats{
		Commits: e.txns.Load(), Conflicts: c.conflicts.Load(), Ops: c.txnOps.Load(), Compares: c.txnCmps.Load(),
		CommitTime: time.Duration(c.txnNanos.Load()),
		Updates:    c.updates.Load(), Calls: c.calls.Load(),
		UpdateReads: c.updateReads.Load(), UpdateReadTime: time.Duration(c.updateReadNanos.Load()),
		CacheHits: c.cacheHits.Load(), CacheMisses: c.cacheMisses.Load(), CacheReruns: c.cacheReruns.Load(),
		Views: c.views.Load(), ViewsDirect: c.viewsDirect.Load(), ViewReads: c.viewReads.Load(),
		RevisionReads: c.revReads.Load(), ViewReadTime: time.Duration(c.viewReadNanos.Load()),
		RevisionReadTime: time.Duration(c.revReadNanos.Load()),
		WriterWait:       time.Duration(c.lockWaitNanos.Load()), ViewWait: time.Duration(c.viewWaitNanos.Load()),
	}, true
}
