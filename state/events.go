package state

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// EventKind classifies an event.
type EventKind string

// Event kinds.
const (
	EventCreated       EventKind = "server.created"      // CreateServer
	EventTransition    EventKind = "lifecycle"           // a lifecycle move (From, To)
	EventPower         EventKind = "power"               // a power state change (Power)
	EventTokenRefused  EventKind = "token.refused"       // a machine token was refused (Message says why)
	EventSecretSet     EventKind = "secret.set"          // PutSecret (Message names the secret, never its value)
	EventSecretDeleted EventKind = "secret.deleted"      // DeleteSecret
	EventUnstalled     EventKind = "server.unstalled"    // UnstallByCredential (a stalled server's credential was set)
	EventHostForgotten EventKind = "host.forgotten"      // ForgetHostsOf (the server under a host was released or retired)
	EventAdminCreated  EventKind = "admin_token.created" // CreateAdminToken (Message names the token)
	EventAdminRevoked  EventKind = "admin_token.revoked" // RevokeAdminToken
	EventNote          EventKind = "note"                // AppendEvent: free-form
	EventHealth        EventKind = "health"              // ObserveBMC: the BMC's health rollup changed (Message: from→to)
	EventBMCRead       EventKind = "bmc.read"            // BMCReadFailed / ObserveBMC: the BMC sweep began or stopped failing to read it
)

// Actors that are not admin tokens.
const (
	ActorController = "controller" // the controller itself (reconciler, boot endpoints)
	ActorLocal      = "local"      // a local command that opened the state file directly
)

// Event is one entry of the append-only log. Seq is global, strictly
// increasing and never reused; At is UTC. Server is empty for events not
// about one server. Messages never hold secrets or token values. Audit
// events (IsAudit) are stored apart from machine and controller events,
// each under its own retention; Events merges both by Seq (the order of
// their appends, so by time).
type Event struct {
	Seq    uint64    `json:"seq"`
	At     time.Time `json:"at"`
	Server string    `json:"server,omitempty"`
	Kind   EventKind `json:"kind"`
	Actor  string    `json:"actor,omitempty"` // admin token name, ActorController or ActorLocal
	// Role is the actor's role when the actor is an admin token: the
	// store fills it in from the token's record as the event is
	// appended (an audit event names who did it and with what right).
	Role    Role      `json:"role,omitempty"`
	From    Lifecycle `json:"from,omitempty"`
	To      Lifecycle `json:"to,omitempty"`
	Power   Power     `json:"power,omitempty"`
	Message string    `json:"message,omitempty"`
}

// IsAudit reports whether e records what a person or an admin token did
// (its Actor is an admin token's name or ActorLocal): a secret set, a
// token created, a fence, a move through the API. Machine-reported and
// controller events (Actor "" or ActorController) are not.
func (e Event) IsAudit() bool {
	return e.Actor != "" && e.Actor != ActorController
}

// EventQuery selects events in ascending Seq order.
type EventQuery struct {
	Server string // only this server's events; empty means all
	After  uint64 // only events with Seq > After
	Limit  int    // zero means 100, at most MaxPageSize
}

// AppendEvent writes e (Seq and At are assigned; Kind defaults to
// EventNote) and returns it as stored.
func (s *Store) AppendEvent(e Event) (Event, error) {
	if e.Kind == "" {
		e.Kind = EventNote
	}
	if e.Server != "" {
		if err := checkName("server", e.Server); err != nil {
			return Event{}, fmt.Errorf("state: append event: %w", err)
		}
	}
	err := s.update(func(tx kvTx) error { return s.appendEvent(tx, &e) })
	if err != nil {
		return Event{}, fmt.Errorf("state: append event: %w", err)
	}
	return e, nil
}

// Events returns events matching q in ascending Seq order.
func (s *Store) Events(q EventQuery) ([]Event, error) {
	if q.Limit <= 0 {
		q.Limit = 100
	}
	if q.Limit > MaxPageSize {
		q.Limit = MaxPageSize
	}
	var out []Event
	if q.After == math.MaxUint64 {
		return nil, nil
	}
	err := s.view(func(tx kvTx) error {
		// Two logs, one order: merge the machine log and the audit log
		// (each ascending by Seq) by Seq.
		var logs [2]eventCursor
		for i, b := range [][2][]byte{{bucketEvents, bucketServerEvents}, {bucketAuditEvents, bucketServerAudit}} {
			logs[i] = openEventCursor(tx, b[0], b[1], q.Server, q.After)
		}
		for len(out) < q.Limit {
			i := -1
			for j := range logs {
				if logs[j].k != nil && (i < 0 || bytes.Compare(logs[j].k, logs[i].k) < 0) {
					i = j
				}
			}
			if i < 0 {
				break
			}
			if v := logs[i].value(); v != nil {
				var e Event
				if err := json.Unmarshal(v, &e); err != nil {
					return fmt.Errorf("decode event %d: %w", btoi(logs[i].k), err)
				}
				out = append(out, e)
			}
			logs[i].next()
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("state: events: %w", err)
	}
	return out, nil
}

// eventCursor walks one log (all of it, or one server's index of it) in
// Seq order; k is nil at the end.
type eventCursor struct {
	c      kvCursor
	events kvBucket // the log; values are looked up here for an index
	index  bool
	k, v   []byte
}

// openEventCursor positions a cursor of log (or of server's index under
// perServer) at the first Seq after after. A log or index that does not
// exist is an ended cursor.
func openEventCursor(tx kvTx, log, perServer []byte, server string, after uint64) eventCursor {
	ec := eventCursor{events: tx.Bucket(log)}
	if ec.events == nil {
		return ec
	}
	if server == "" {
		ec.c = ec.events.Cursor()
	} else {
		idx := tx.Bucket(perServer)
		if idx == nil {
			return ec
		}
		sb := idx.Bucket([]byte(server))
		if sb == nil {
			return ec
		}
		ec.c, ec.index = sb.Cursor(), true
	}
	ec.k, ec.v = ec.c.Seek(u64(after + 1))
	return ec
}

func (ec *eventCursor) next() { ec.k, ec.v = ec.c.Next() }

// value is the event JSON at the cursor (nil for an index entry whose
// event is gone: cannot happen within one transaction; defensive).
func (ec *eventCursor) value() []byte {
	if ec.index {
		return ec.events.Get(ec.k)
	}
	return ec.v
}

// LastEventSeq returns the highest Seq ever assigned (0 for an empty log).
func (s *Store) LastEventSeq() (uint64, error) {
	var seq uint64
	err := s.view(func(tx kvTx) error {
		seq = tx.Bucket(bucketEvents).Sequence()
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("state: last event seq: %w", err)
	}
	return seq, nil
}

// appendFill is the page fill of append-only buckets (bbolt Bucket.FillPercent,
// whose documentation recommends a high value for appends).
const appendFill = 0.95

// appendEvent assigns e.Seq and e.At, stores e and its per-server index
// entry, and prunes by count and age, all inside tx.
func (s *Store) appendEvent(tx kvTx, e *Event) error {
	events := tx.Bucket(bucketEvents)
	// Keys are increasing sequence numbers, so every insert is an append:
	// bbolt's default split (FillPercent 0.5) would leave each full page
	// half empty, doubling the file and the pages a scan maps in.
	events.SetFillPercent(appendFill)
	seq, err := events.NextSequence()
	if err != nil {
		return err
	}
	e.Seq = seq
	e.At = s.nowUTC()
	if e.Role == "" && e.IsAudit() && e.Actor != ActorLocal {
		e.Role = adminRoleTx(tx, e.Actor)
	}
	data, err := json.Marshal(e)
	if err != nil {
		return err
	}
	key := u64(seq)
	if e.IsAudit() {
		return s.appendAudit(tx, e, key, data)
	}
	if err := events.Put(key, data); err != nil {
		return err
	}
	meta := tx.Bucket(bucketMeta)
	total := btoi(meta.Get(keyEventsN)) + 1
	if err := meta.Put(keyEventsN, u64(total)); err != nil {
		return err
	}
	if e.Server != "" {
		sb, err := tx.Bucket(bucketServerEvents).CreateBucketIfNotExists([]byte(e.Server))
		if err != nil {
			return err
		}
		sb.SetFillPercent(appendFill) // per-server index: appends too
		if err := sb.Put(key, nil); err != nil {
			return err
		}
		counts := tx.Bucket(bucketEventCounts)
		n := btoi(counts.Get([]byte(e.Server))) + 1
		if err := counts.Put([]byte(e.Server), u64(n)); err != nil {
			return err
		}
		for ; n > uint64(s.retention.MaxPerServer); n-- {
			k, _ := sb.Cursor().First()
			if err := s.deleteEvent(tx, k); err != nil {
				return err
			}
		}
	}
	total = btoi(meta.Get(keyEventsN))
	for ; total > uint64(s.retention.MaxEvents); total-- {
		k, _ := events.Cursor().First()
		if err := s.deleteEvent(tx, k); err != nil {
			return err
		}
	}
	// Age: a bounded sweep per append keeps each write small; Prune sweeps
	// everything.
	if !s.ageSweepDue() {
		return nil
	}
	_, err = s.pruneOld(tx, s.sweep)
	return err
}

// ageSweepDue reports whether the oldest event may be past MaxAge: false
// when a sweep that deleted nothing last saw an oldest event still young.
// The oldest event only gets younger (events are appended with the time
// of their append, deleted oldest first), so the remembered time is a
// lower bound and skipping the sweep until it ages loses nothing; it saves
// the look at the oldest event on most appends (two etcd reads).
func (s *Store) ageSweepDue() bool {
	o := s.oldestEvent.Load()
	return o == 0 || time.Unix(0, o).Before(s.nowUTC().Add(-s.retention.MaxAge))
}

// eventLog describes one of the store's two event logs: the machine log
// (events of machines and of the controller, bounded by count, per-server
// count and age) and the audit log (what admin tokens and local commands
// did, bounded by its own count and age). Both keep a per-server index of
// their keys; the machine log also counts each server's events.
type eventLog struct {
	what      string // "event" or "audit event", in errors
	bucket    []byte // seq → event JSON
	countKey  []byte // meta key: the log's length
	index     []byte // server name → nested bucket of the server's seqs
	perServer []byte // server name → its count; nil: no count (the index's emptiness decides)
	maxAge    func(Retention) time.Duration
}

var (
	machineLog = eventLog{what: "event", bucket: bucketEvents, countKey: keyEventsN, index: bucketServerEvents,
		perServer: bucketEventCounts, maxAge: func(r Retention) time.Duration { return r.MaxAge }}
	auditLog = eventLog{what: "audit event", bucket: bucketAuditEvents, countKey: keyAuditN, index: bucketServerAudit,
		maxAge: func(r Retention) time.Duration { return r.MaxAuditAge }}
)

// pruneOld deletes up to max (≤0: unbounded) events older than MaxAge, and
// remembers the oldest event kept when it deleted none (ageSweepDue).
func (s *Store) pruneOld(tx kvTx, max int) (int, error) {
	n, kept, err := s.pruneLog(tx, &machineLog, max)
	if err == nil && n == 0 && !kept.IsZero() {
		s.oldestEvent.Store(kept.UnixNano())
	}
	return n, err
}

// pruneOldAudit deletes up to max (≤0: unbounded) audit events older than
// MaxAuditAge.
func (s *Store) pruneOldAudit(tx kvTx, max int) (int, error) {
	n, _, err := s.pruneLog(tx, &auditLog, max)
	return n, err
}

// pruneLog deletes up to max (≤0: unbounded) of l's events older than its
// maximum age, oldest first, and returns how many it deleted and the time
// of the oldest event it kept (zero when it kept none or stopped at max).
func (s *Store) pruneLog(tx kvTx, l *eventLog, max int) (int, time.Time, error) {
	b := tx.Bucket(l.bucket)
	if b == nil {
		return 0, time.Time{}, nil
	}
	cutoff := s.nowUTC().Add(-l.maxAge(s.retention))
	c := b.Cursor()
	n := 0
	for k, v := c.First(); k != nil && (max <= 0 || n < max); k, v = c.First() {
		var e struct {
			At time.Time `json:"at"`
		}
		if err := json.Unmarshal(v, &e); err != nil {
			return n, time.Time{}, fmt.Errorf("decode %s %d: %w", l.what, btoi(k), err)
		}
		if !e.At.Before(cutoff) {
			return n, e.At, nil
		}
		if err := s.deleteFrom(tx, l, k); err != nil {
			return n, time.Time{}, err
		}
		n++
	}
	return n, time.Time{}, nil
}

// deleteEvent removes the machine log's event with key k (see deleteFrom).
func (s *Store) deleteEvent(tx kvTx, k []byte) error { return s.deleteFrom(tx, &machineLog, k) }

// deleteFrom removes l's event with key k, one from the log's length, its
// server index entry and, for the machine log, one from the server's count;
// a server's index (and count) go when its last event does. A missing key
// is not an error.
func (s *Store) deleteFrom(tx kvTx, l *eventLog, k []byte) error {
	if k == nil {
		return nil
	}
	k = append([]byte(nil), k...) // cursor keys are invalid after Delete
	b := tx.Bucket(l.bucket)
	v := b.Get(k)
	if v == nil {
		return nil
	}
	var e struct {
		Server string `json:"server"`
	}
	if err := json.Unmarshal(v, &e); err != nil {
		return fmt.Errorf("decode %s %d: %w", l.what, btoi(k), err)
	}
	if err := b.Delete(k); err != nil {
		return err
	}
	meta := tx.Bucket(bucketMeta)
	if n := btoi(meta.Get(l.countKey)); n > 0 {
		if err := meta.Put(l.countKey, u64(n-1)); err != nil {
			return err
		}
	}
	if e.Server == "" {
		return nil
	}
	idx := tx.Bucket(l.index)
	if idx == nil {
		return nil
	}
	name := []byte(e.Server)
	sb := idx.Bucket(name)
	if sb != nil {
		if err := sb.Delete(k); err != nil {
			return err
		}
	}
	if l.perServer == nil {
		if sb != nil {
			if first, _ := sb.Cursor().First(); first == nil {
				return idx.DeleteBucket(name)
			}
		}
		return nil
	}
	counts := tx.Bucket(l.perServer)
	if n := btoi(counts.Get(name)); n > 1 {
		return counts.Put(name, u64(n-1))
	}
	// the server's last event: drop its empty index and counter
	if err := counts.Delete(name); err != nil {
		return err
	}
	if sb != nil {
		return idx.DeleteBucket(name)
	}
	return nil
}

// PruneResult counts what Prune removed.
type PruneResult struct {
	Events int // events older than Retention.MaxAge (audit events: MaxAuditAge)
	Tokens int // machine tokens past their expiry
}

// Prune deletes machine and controller events older than Retention.MaxAge,
// audit events older than Retention.MaxAuditAge, and machine tokens that
// have expired. Safe to call periodically; on bbolt each call is one
// transaction; on etcd (whose transactions hold at most 128 operations by
// default) it is a run of transactions of bounded size, each consistent.
func (s *Store) Prune() (PruneResult, error) {
	if s.pruneBatch > 0 {
		return s.pruneBatched()
	}
	var res PruneResult
	err := s.update(func(tx kvTx) error {
		n, err := s.pruneOld(tx, 0)
		if err != nil {
			return err
		}
		res.Events = n
		if n, err = s.pruneOldAudit(tx, 0); err != nil {
			return err
		}
		res.Events += n
		res.Tokens, err = s.pruneTokens(tx)
		return err
	})
	if err != nil {
		return PruneResult{}, fmt.Errorf("state: prune: %w", err)
	}
	return res, nil
}

// pruneBatched is Prune as transactions of at most s.pruneBatch deletions.
func (s *Store) pruneBatched() (PruneResult, error) {
	var res PruneResult
	for {
		n := 0
		err := s.update(func(tx kvTx) error {
			var err error
			n, err = s.pruneOld(tx, s.pruneBatch)
			return err
		})
		if err != nil {
			return res, fmt.Errorf("state: prune: %w", err)
		}
		res.Events += n
		if n < s.pruneBatch {
			break
		}
	}
	for {
		n := 0
		err := s.update(func(tx kvTx) error {
			var err error
			n, err = s.pruneOldAudit(tx, s.pruneBatch)
			return err
		})
		if err != nil {
			return res, fmt.Errorf("state: prune: %w", err)
		}
		res.Events += n
		if n < s.pruneBatch {
			break
		}
	}
	for {
		n := 0
		err := s.update(func(tx kvTx) error {
			var err error
			n, err = s.pruneTokensMax(tx, s.pruneBatch)
			return err
		})
		if err != nil {
			return res, fmt.Errorf("state: prune: %w", err)
		}
		res.Tokens += n
		if n < s.pruneBatch {
			break
		}
	}
	return res, nil
}

// appendAudit stores the audit event e (key, data: its Seq and JSON) in
// the audit log and its server's audit index, and prunes the audit log by
// its own count and age (Retention.MaxAuditEvents, MaxAuditAge), inside
// tx. Machine events never count against it.
func (s *Store) appendAudit(tx kvTx, e *Event, key, data []byte) error {
	audit := tx.Bucket(bucketAuditEvents)
	if audit == nil {
		var err error
		if audit, err = tx.CreateBucketIfNotExists(bucketAuditEvents); err != nil {
			return err
		}
	}
	audit.SetFillPercent(appendFill)
	if err := audit.Put(key, data); err != nil {
		return err
	}
	if e.Server != "" {
		idx, err := tx.CreateBucketIfNotExists(bucketServerAudit)
		if err != nil {
			return err
		}
		sb, err := idx.CreateBucketIfNotExists([]byte(e.Server))
		if err != nil {
			return err
		}
		sb.SetFillPercent(appendFill)
		if err := sb.Put(key, nil); err != nil {
			return err
		}
	}
	meta := tx.Bucket(bucketMeta)
	total := btoi(meta.Get(keyAuditN)) + 1
	if err := meta.Put(keyAuditN, u64(total)); err != nil {
		return err
	}
	for ; total > uint64(s.retention.MaxAuditEvents); total-- {
		k, _ := audit.Cursor().First()
		if err := s.deleteFrom(tx, &auditLog, k); err != nil {
			return err
		}
	}
	_, err := s.pruneOldAudit(tx, s.sweep)
	return err
}

// auditSplitBatch bounds the events one transaction of splitAuditLog
// moves (each is about 8 etcd operations; etcd allows 128 a txn).
const auditSplitBatch = 12

// splitAuditLog moves the audit events a build before the audit log
// stored in the machine log into the audit log, once (keyAuditSplit marks
// it done): in transactions of at most auditSplitBatch events, each a
// whole move (the event, its server index and both counts), so a crash
// half-way leaves every event in one log or the other and the next open
// carries on. An event another controller moved meanwhile is skipped.
func (s *Store) splitAuditLog() error {
	done := false
	var keys [][]byte
	err := s.view(func(tx kvTx) error {
		if tx.Bucket(bucketMeta).Get(keyAuditSplit) != nil {
			done = true
			return nil
		}
		return tx.Bucket(bucketEvents).ForEach(func(k, v []byte) error {
			var e struct {
				Actor string `json:"actor"`
			}
			if json.Unmarshal(v, &e) == nil && (Event{Actor: e.Actor}).IsAudit() {
				keys = append(keys, append([]byte(nil), k...))
			}
			return nil // an undecodable record stays where it is (Check reports it)
		})
	})
	if err != nil || done {
		return err
	}
	moved := len(keys)
	for {
		n := min(len(keys), auditSplitBatch)
		batch := keys[:n]
		last := n == len(keys)
		err := s.update(func(tx kvTx) error {
			for _, k := range batch {
				if err := s.moveToAudit(tx, k); err != nil {
					return err
				}
			}
			if last {
				return tx.Bucket(bucketMeta).Put(keyAuditSplit, u64(1))
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("state: move audit events to the audit log: %w", err)
		}
		keys = keys[n:]
		if last {
			break
		}
	}
	if moved > 0 {
		s.log.Info("state: audit events moved to their own log", "events", moved)
	}
	return nil
}

// moveToAudit moves the event with key k from the machine log to the
// audit log, inside tx; nil when it is no longer in the machine log.
func (s *Store) moveToAudit(tx kvTx, k []byte) error {
	v := tx.Bucket(bucketEvents).Get(k)
	if v == nil {
		return nil
	}
	v = append([]byte(nil), v...)
	var e Event
	if err := json.Unmarshal(v, &e); err != nil {
		return fmt.Errorf("decode event %d: %w", btoi(k), err)
	}
	if err := s.deleteEvent(tx, k); err != nil {
		return err
	}
	return s.appendAudit(tx, &e, k, v)
}
