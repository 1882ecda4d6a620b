package state

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// SchemaVersion is the layout version this package writes. Open migrates
// older files forward one version at a time and refuses newer ones.
//
// Version history:
//   - 1: servers stored power as a bare string ("powered_on"); no hosts,
//     join-log or admin-token buckets.
//   - 2: power is a PowerStatus {state, source, at}; hosts, join logs,
//     admin tokens; a per-file HKDF salt for sealing secrets.
const SchemaVersion = 2

// Bucket names. Private: callers use Store methods only.
var (
	bucketMeta         = []byte("meta")
	bucketServers      = []byte("servers")
	bucketEvents       = []byte("events")        // seq(8 BE) → Event JSON
	bucketServerEvents = []byte("server_events") // server name → nested bucket seq → ""
	bucketEventCounts  = []byte("event_counts")  // server name → uint64 BE
	// Audit events (a human or admin token acted: IsAudit) live apart,
	// with their own retention, so machine traffic cannot evict them.
	// Their Seq comes from bucketEvents' sequence: one ordering for both.
	bucketAuditEvents = []byte("audit_events") // seq(8 BE) → Event JSON
	bucketServerAudit = []byte("server_audit") // server name → nested bucket seq → ""
	bucketTokens      = []byte("tokens")       // sha256(token) → tokenRecord JSON
	bucketAdminTokens = []byte("admin_tokens") // sha256(token) → adminRecord JSON
	bucketAdminNames  = []byte("admin_names")  // name → sha256(token)
	bucketSecrets     = []byte("secrets")      // name → secretRecord JSON
	bucketHosts       = []byte("hosts")        // name → Host JSON
	bucketJoinLogs    = []byte("join_logs")    // host name → nested bucket seq → JoinLogEntry JSON
	bucketTokenLive   = []byte("token_live")   // server "\x00" purpose → sha256 of its one live token

	keyVersion  = []byte("schema_version")
	keySalt     = []byte("hkdf_salt")
	keyKeyCheck = []byte("key_check")
	keyEventsN  = []byte("events_n")
	keyAuditN   = []byte("audit_events_n")
	// keyAuditSplit marks a store whose audit events are all in the
	// audit log (splitAuditLog ran, or the store began with it).
	keyAuditSplit = []byte("audit_split")
)

var allBuckets = [][]byte{bucketMeta, bucketServers, bucketEvents, bucketServerEvents, bucketEventCounts, bucketAuditEvents, bucketServerAudit,
	bucketTokens, bucketAdminTokens, bucketAdminNames, bucketSecrets, bucketHosts, bucketJoinLogs, bucketTokenLive}

// Options configure Open. Every zero value is usable.
type Options struct {
	// Timeout bounds the wait for the file lock; after it Open returns
	// ErrLocked. Zero means 1s. A second process never waits indefinitely.
	Timeout time.Duration
	// MasterKey is the raw value of MACHINA_API_KEY_MASTER_KEY. Non-empty:
	// secrets are sealed with AES-256-GCM under a key derived with
	// HKDF-SHA256, existing unsealed secrets are sealed at Open, and a key
	// that does not match the file's key-check record fails Open with
	// ErrWrongMasterKey. Empty: secrets are stored unsealed.
	MasterKey []byte
	// Retention bounds the event log; see Retention for zero values.
	Retention Retention
	// NoSync skips fsync after each commit (bbolt DB.NoSync). Only for
	// tests and benchmarks: a crash may lose committed transactions.
	NoSync bool
	// Logger receives Info lines for migrations and sealing; nil discards.
	Logger *slog.Logger
	// Now is the clock for event times, token expiry and retention; nil
	// means time.Now. Times are stored in UTC.
	Now func() time.Time
	// MustExist makes Open fail with ErrNoStateFile instead of creating a
	// new state file: for commands that manage an existing site
	// (`machina token`). False: a missing file is created.
	MustExist bool
	// RefusalSummaryEvery is the interval of the refused-request
	// summaries (RecordRefusal): the first refusal per server and kind is
	// written at once, the rest as one event per interval. Zero means one
	// minute.
	RefusalSummaryEvery time.Duration
}

// Retention bounds the event log. Pruning runs inside every write that
// appends events and in Store.Prune. Audit events (IsAudit: a person or
// an admin token acted) are kept apart under their own bounds, so no
// amount of machine and controller events evicts them.
type Retention struct {
	// MaxEvents caps the log of machine and controller events; zero
	// means 100,000.
	MaxEvents int
	// MaxPerServer caps one server's machine and controller events; zero
	// means 1,000.
	MaxPerServer int
	// MaxAge drops machine and controller events older than this; zero
	// means 30 days.
	MaxAge time.Duration
	// MaxAuditEvents caps the audit log; zero means 100,000.
	MaxAuditEvents int
	// MaxAuditAge drops audit events older than this; zero means 365
	// days.
	MaxAuditAge time.Duration
}

func (r Retention) withDefaults() Retention {
	if r.MaxEvents <= 0 {
		r.MaxEvents = 100_000
	}
	if r.MaxPerServer <= 0 {
		r.MaxPerServer = 1_000
	}
	if r.MaxAge <= 0 {
		r.MaxAge = 30 * 24 * time.Hour
	}
	if r.MaxAuditEvents <= 0 {
		r.MaxAuditEvents = 100_000
	}
	if r.MaxAuditAge <= 0 {
		r.MaxAuditAge = 365 * 24 * time.Hour
	}
	return r
}

// Store is the open state file. Its methods are safe for concurrent use;
// bbolt serialises writers and readers see consistent snapshots.
type Store struct {
	eng       engine
	bdb       *bolt.DB // the bbolt file; nil on etcd
	path      string
	log       *slog.Logger
	now       func() time.Time
	retention Retention
	sealKey   []byte // nil when unsealed
	salt      []byte

	mu      sync.Mutex
	waiters map[chan struct{}]struct{}
	// secretCh is closed by the next PutSecret (SecretsChanged).
	secretCh chan struct{}

	// unknownTokens counts machine tokens refused as unknown: counted,
	// never an event or a write (UnknownTokenRefusals).
	unknownTokens atomic.Int64

	// enrolPrunedAt is when (store clock, Unix ns) an enrolment token
	// issue last pruned expired tokens; 0 before the first.
	enrolPrunedAt atomic.Int64

	servers serverCache
	hosts   hostCache
	// snapServers is how many servers the last Snapshot held: the size
	// the next one's map is made with.
	snapServers atomic.Int64
	// commits shares commits between concurrent writers (update); nil
	// on etcd, whose engine shares its bounded transactions itself.
	commits *committer
	// beats commits heartbeats, apart from every other write (bbolt; nil
	// on etcd, where they use the engine's bounded batch); arrivals holds
	// the heartbeats not yet written (RecordHeartbeat, MarkHostLost).
	beats    *committer
	arrivals beatArrivals

	// refusals paces the events of refused machine requests (refusals.go).
	refusals refusalPacer
	// anomalies paces the events of machine-reported anomalies: a
	// heartbeat's reboot or agent restart (anomalies.go).
	anomalies refusalPacer
	// heard holds LastHeard notes written behind (heard.go).
	heard heardQueue
	// prepared holds token values minted ahead of their request
	// (prepared.go).
	prepared preparedTokens

	// sweep bounds the old events one append deletes (and the events and
	// tokens one Prune transaction deletes on an engine with a bounded
	// transaction size; 0: unbounded).
	sweep      int
	pruneBatch int
	// oldestEvent is a lower bound of the oldest event's time (Unix ns; 0:
	// unknown), see ageSweepDue.
	oldestEvent atomic.Int64
}

// migrations[v] upgrades a version-v file to v+1 inside one transaction.
// Open runs them in order; a failure leaves the file at its old version.
var migrations = map[int]func(tx kvTx) error{
	1: migrate1to2,
}

// Open opens (creating if needed, mode 0600, unless Options.MustExist) the
// state file at path, migrates it to SchemaVersion, and checks the master
// key. It never creates the file's folder. Errors: ErrNoStateDir when the
// folder does not exist, ErrNoStateFile (MustExist), ErrLocked when another
// process holds the file, ErrSchemaVersion for a newer file,
// ErrWrongMasterKey for a key that does not match.
func Open(path string, opts Options) (*Store, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if fi, err := os.Stat(filepath.Dir(path)); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("state: open %s: %w: %s (create it with mode 0700, or fix the path)", path, ErrNoStateDir, filepath.Dir(path))
	}
	if opts.MustExist {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("state: open %s: %w", path, ErrNoStateFile)
		}
	}
	// NoFreelistSync: the freelist is rebuilt by scanning at open instead
	// of being written on every commit (as etcd does); commits stay
	// durable, TestCrashSIGKILL covers it.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: opts.Timeout, NoSync: opts.NoSync,
		FreelistType: bolt.FreelistMapType, NoFreelistSync: true})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("state: open %s: %w", path, ErrLocked)
		}
		return nil, fmt.Errorf("state: open %s: %w", path, err)
	}
	s := newStore(&boltEngine{db: db}, path, opts)
	s.bdb = db
	s.commits = &committer{update: func(fn func(kvTx) error) error { return s.eng.update(fn) }}
	s.beats = &committer{update: func(fn func(kvTx) error) error { return s.eng.update(fn) }, max: heartbeatGroup}
	if err := s.init(opts.MasterKey); err != nil {
		db.Close()
		return nil, fmt.Errorf("state: open %s: %w", path, err)
	}
	return s, nil
}

// newStore is the Store of eng before init.
func newStore(eng engine, path string, opts Options) *Store {
	s := &Store{eng: eng, path: path, log: opts.Logger, now: opts.Now, retention: opts.Retention.withDefaults(),
		waiters: map[chan struct{}]struct{}{}, sweep: 64}
	s.refusals.every = opts.RefusalSummaryEvery
	s.anomalies.every = opts.RefusalSummaryEvery
	s.anomalies.summary = anomalySummary
	return s
}

// init creates buckets, runs migrations and sets up sealing.
func (s *Store) init(masterKey []byte) error {
	err := s.eng.update(func(tx kvTx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		v := meta.Get(keyVersion)
		version := SchemaVersion
		if v == nil {
			if tx.Bucket(bucketServers) != nil {
				// Pre-versioning files never existed; treat as corrupt.
				return fmt.Errorf("servers bucket without schema version: %w", ErrSchemaVersion)
			}
		} else {
			if len(v) != 8 {
				return fmt.Errorf("schema version record: %w", ErrSchemaVersion)
			}
			version = int(binary.BigEndian.Uint64(v))
		}
		if version > SchemaVersion {
			return fmt.Errorf("file is version %d, this build reads up to %d: %w", version, SchemaVersion, ErrSchemaVersion)
		}
		for ; version < SchemaVersion; version++ {
			m, ok := migrations[version]
			if !ok {
				return fmt.Errorf("no migration from version %d: %w", version, ErrSchemaVersion)
			}
			if err := m(tx); err != nil {
				return fmt.Errorf("migrate version %d to %d: %w", version, version+1, err)
			}
			s.log.Info("state schema migrated", "from", version, "to", version+1)
		}
		for _, b := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		// Written only when it changes, so opening an existing site writes
		// nothing (a standby controller on etcd opens without writing).
		if btoi(meta.Get(keyVersion)) != SchemaVersion {
			if err := meta.Put(keyVersion, u64(SchemaVersion)); err != nil {
				return err
			}
		}
		// A new store starts split; an older one is split after this
		// transaction (splitAuditLog).
		if meta.Get(keyAuditSplit) == nil && tx.Bucket(bucketEvents).Sequence() == 0 {
			if err := meta.Put(keyAuditSplit, u64(1)); err != nil {
				return err
			}
		}
		if meta.Get(keySalt) == nil {
			salt := make([]byte, 32)
			if _, err := rand.Read(salt); err != nil {
				return err
			}
			if err := meta.Put(keySalt, salt); err != nil {
				return err
			}
		}
		s.salt = append([]byte(nil), meta.Get(keySalt)...)
		return nil
	})
	if err != nil {
		return err
	}
	if err := s.splitAuditLog(); err != nil {
		// Not fatal: the events stay readable where they are, and the
		// next open (of the leader, on etcd) tries again.
		s.log.Warn("state: audit events of an older build not moved to the audit log yet", "err", err)
	}
	if len(masterKey) > 0 {
		return s.initSealing(masterKey)
	}
	return nil
}

// Path returns the file path the store was opened with (for etcd, the
// etcd:// target without credentials).
func (s *Store) Path() string { return s.path }

// Close releases the file and its lock (etcd: closes the client).
func (s *Store) Close() error {
	s.closeHeard()
	s.closeRefusals()
	if err := s.eng.close(); err != nil {
		return fmt.Errorf("state: close: %w", err)
	}
	return nil
}

// Check runs bbolt's consistency check over the whole file and returns
// every problem found, joined. On etcd it checks that every record of the
// buckets decodes as its bucket's type (etcd checks its own storage).
func (s *Store) Check() error {
	if s.bdb == nil {
		return s.checkRecords()
	}
	return s.bdb.View(func(tx *bolt.Tx) error {
		var errs []error
		for err := range tx.Check() {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	})
}

// Notify returns a channel that receives a value (coalesced, capacity 1)
// after every committed write that appended events, and a stop function
// that unregisters it. Readers then fetch with Events(after=last seen), so
// a slow reader misses no event that retention still holds.
func (s *Store) Notify() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	s.waiters[ch] = struct{}{}
	s.mu.Unlock()
	return ch, func() {
		s.mu.Lock()
		delete(s.waiters, ch)
		s.mu.Unlock()
	}
}

// SecretsChanged returns a channel that is closed when a secret is next
// stored (PutSecret); call it again for the change after that. The BMC
// sweep uses it to read, at once, the servers whose BMC it could not
// read, so a fixed credential clears "BMC unreadable" without waiting for
// the next sweep.
func (s *Store) SecretsChanged() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.secretCh == nil {
		s.secretCh = make(chan struct{})
	}
	return s.secretCh
}

func (s *Store) secretsChanged() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.secretCh != nil {
		close(s.secretCh)
		s.secretCh = nil
	}
}

func (s *Store) wake() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.waiters {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// update runs fn in a read-write transaction and wakes Notify listeners
// after a successful commit. On bbolt it goes through the store's group
// committer (groupcommit.go): concurrent writers (the reconciler's
// workers journalling actions and recording power, machines' reports and
// token uses) share one commit and one fsync, each fn whole in one
// transaction, and each caller returns after the commit that holds its
// writes. On etcd the engine shares transactions itself. Either way fn
// may run more than once (see engine) and must be idempotent given the
// same starting state.
func (s *Store) update(fn func(tx kvTx) error) error {
	var err error
	if s.commits != nil {
		err = s.commits.run(fn)
	} else {
		err = s.eng.update(fn)
	}
	if err == nil {
		s.wake()
	}
	return err
}

// batch is update through bolt.DB.Batch: concurrent callers share one
// commit and one fsync. fn may run more than once and must be idempotent
// given the same starting state.
func (s *Store) batch(fn func(tx kvTx) error) error {
	err := s.eng.batch(fn)
	if err == nil {
		s.wake()
	}
	return err
}

func (s *Store) view(fn func(tx kvTx) error) error {
	return s.eng.view(fn)
}

func (s *Store) nowUTC() time.Time { return s.now().UTC() }

func u64(v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b
}

func btoi(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

// checkRecords decodes every record of the typed buckets (the etcd
// engine's Check).
func (s *Store) checkRecords() error {
	var errs []error
	err := s.view(func(tx kvTx) error {
		for _, b := range [][]byte{bucketServers, bucketEvents, bucketAuditEvents, bucketTokens, bucketAdminTokens, bucketSecrets, bucketHosts} {
			bk := tx.Bucket(b)
			if bk == nil {
				errs = append(errs, fmt.Errorf("bucket %s missing", b))
				continue
			}
			err := bk.ForEach(func(k, v []byte) error {
				var m map[string]any
				if err := json.Unmarshal(v, &m); err != nil {
					errs = append(errs, fmt.Errorf("bucket %s key %q: %w", b, k, err))
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	return errors.Join(append(errs, err)...)
}
