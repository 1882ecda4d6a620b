package state

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// RefusalReason classifies a refused machine request for the refusal
// counters (machina_machine_refusals_total{reason}) and summaries.
type RefusalReason string

// Refusal reasons. The token ones are recorded by the store itself; the
// others by the machine endpoints through RecordRefusal.
const (
	RefusalTokenUnknown  RefusalReason = "token_unknown"  // a known-shaped value whose token vanished (pruned, revoked) mid-request
	RefusalTokenExpired  RefusalReason = "token_expired"  // ErrTokenExpired
	RefusalTokenUsed     RefusalReason = "token_used"     // ErrTokenUsed: another request already used it
	RefusalTokenMismatch RefusalReason = "token_mismatch" // ErrTokenMismatch: other purpose, server or MAC
	RefusalWrongAddress  RefusalReason = "wrong_address"  // not from the address leased to the server's boot MAC
	RefusalBadRequest    RefusalReason = "bad_request"    // a live token with a malformed or lying body (4xx)
	RefusalUnavailable   RefusalReason = "unavailable"    // a live token the controller could not serve (5xx: an installer tree or document missing)
)

// RefusalReasons lists every RefusalReason, for metrics.
func RefusalReasons() []RefusalReason {
	return []RefusalReason{RefusalTokenUnknown, RefusalTokenExpired, RefusalTokenUsed, RefusalTokenMismatch,
		RefusalWrongAddress, RefusalBadRequest, RefusalUnavailable}
}

// defaultRefusalEvery is Options.RefusalSummaryEvery's zero value.
const defaultRefusalEvery = time.Minute

// errRollback ends a write transaction that found nothing to write (a
// refusal, a replayed answer) without a commit: bbolt commits every
// writable transaction with a meta page write and an fsync even when
// nothing changed, and every commit wakes the planner.
var errRollback = errors.New("state: nothing to write")

// rolledBack is err with errRollback (a transaction that wrote nothing)
// read as success.
func rolledBack(err error) error {
	if errors.Is(err, errRollback) {
		return nil
	}
	return err
}

// refusalKey is one summary line: a server's history (or the global log
// for "") and the event kind.
type refusalKey struct {
	server string
	kind   EventKind
}

type refusalWindow struct {
	n      int64
	byWhy  map[RefusalReason]int64
	last   string
	lastAt time.Time
}

// refusalPacer turns refused requests into events at a bounded rate. The
// first refusal for a (server, kind) is written at once (an operator sees
// a lone refusal as before); further ones are counted and written as one
// summary event per key when the interval ends; a key with no refusal in
// an interval goes quiet again. A flood therefore costs one transaction
// (one fsync, one planner wake) per interval, and at most one event per
// key in it, whatever the request rate. Keys are bounded: a server is
// named only when it exists (the callers check), so at most one key per
// registered server and kind plus one per kind for unnamed refusals.
type refusalPacer struct {
	mu      sync.Mutex
	every   time.Duration
	windows map[refusalKey]*refusalWindow
	timer   *time.Timer
	closed  bool
	totals  map[RefusalReason]int64
}

// RecordRefusal counts a refused machine request (RefusalCounts) and
// paces its event: the first refusal for server and kind in a quiet
// interval is appended at once with message, later ones in the same
// Options.RefusalSummaryEvery (one minute) are summarised in one event per
// server and kind at the interval's end ("N requests refused in the last
// 1m0s: token_used N-1, ...; last: message"). server must be a
// registered server or "" (an unregistered name is recorded under "").
// It never fails the request: an event that cannot be written is dropped
// (the counters keep it). It reports whether the event was written at once
// (the first of its interval), so that a caller logs once per interval too.
func (s *Store) RecordRefusal(server string, kind EventKind, why RefusalReason, message string) (first bool) {
	if server != "" && !s.serverExists(server) {
		server = ""
	}
	return s.noteRefusal(server, kind, why, message)
}

// RefusalCounts returns how many machine requests were refused per reason
// since the store was opened (the unknown-token count is separate:
// UnknownTokenRefusals).
func (s *Store) RefusalCounts() map[RefusalReason]int64 {
	p := &s.refusals
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.totals)
}

// FlushRefusals writes the summary events of the refusals counted since
// the last ones were written, now, and ends the current interval. Close
// calls it; tests call it instead of waiting for the interval.
func (s *Store) FlushRefusals() error {
	p := &s.refusals
	p.mu.Lock()
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	windows := p.windows
	p.windows = nil
	p.mu.Unlock()
	return s.writeRefusalSummaries(windows)
}

func (s *Store) serverExists(name string) bool {
	ok := false
	_ = s.view(func(tx kvTx) error {
		ok = tx.Bucket(bucketServers).Get([]byte(name)) != nil
		return nil
	})
	return ok
}

// refusalReasonOf classifies a token refusal.
func refusalReasonOf(err error) RefusalReason {
	switch {
	case errors.Is(err, ErrTokenExpired):
		return RefusalTokenExpired
	case errors.Is(err, ErrTokenUsed):
		return RefusalTokenUsed
	case errors.Is(err, ErrTokenUnknown):
		return RefusalTokenUnknown
	default:
		return RefusalTokenMismatch
	}
}

// noteRefusal is RecordRefusal for a server already known to exist (or "").
func (s *Store) noteRefusal(server string, kind EventKind, why RefusalReason, message string) (first bool) {
	p := &s.refusals
	key := refusalKey{server, kind}
	p.mu.Lock()
	if p.totals == nil {
		p.totals = map[RefusalReason]int64{}
	}
	p.totals[why]++
	if p.closed {
		p.mu.Unlock()
		return false
	}
	if w, hot := p.windows[key]; hot {
		w.n++
		w.byWhy[why]++
		w.last, w.lastAt = message, s.nowUTC()
		p.mu.Unlock()
		return false
	}
	if p.windows == nil {
		p.windows = map[refusalKey]*refusalWindow{}
	}
	// Quiet key: written now; the window counts what follows it.
	p.windows[key] = &refusalWindow{byWhy: map[RefusalReason]int64{}}
	if p.timer == nil {
		every := p.every
		if every <= 0 {
			every = defaultRefusalEvery
		}
		p.timer = time.AfterFunc(every, func() { s.refusalTick(every) })
	}
	p.mu.Unlock()
	_ = s.update(func(tx kvTx) error {
		return s.appendEvent(tx, &Event{Server: server, Kind: kind, Actor: ActorController, Message: message})
	})
	return true
}

// refusalTick ends an interval: it writes the summaries of the keys that
// saw refusals, keeps them hot for another interval, and drops the quiet
// ones.
func (s *Store) refusalTick(every time.Duration) {
	p := &s.refusals
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	due := map[refusalKey]*refusalWindow{}
	for k, w := range p.windows {
		if w.n == 0 {
			delete(p.windows, k)
			continue
		}
		due[k] = w
		p.windows[k] = &refusalWindow{byWhy: map[RefusalReason]int64{}}
	}
	p.timer = nil
	if len(p.windows) > 0 {
		p.timer = time.AfterFunc(every, func() { s.refusalTick(every) })
	}
	p.mu.Unlock()
	_ = s.writeRefusalSummaries(due)
}

// writeRefusalSummaries appends one event per key with refusals, in one
// transaction.
func (s *Store) writeRefusalSummaries(windows map[refusalKey]*refusalWindow) error {
	keys := slices.SortedFunc(maps.Keys(windows), func(a, b refusalKey) int {
		return strings.Compare(a.server+"\x00"+string(a.kind), b.server+"\x00"+string(b.kind))
	})
	keys = slices.DeleteFunc(keys, func(k refusalKey) bool { return windows[k].n == 0 })
	if len(keys) == 0 {
		return nil
	}
	every := s.refusals.every
	if every <= 0 {
		every = defaultRefusalEvery
	}
	err := s.update(func(tx kvTx) error {
		for _, k := range keys {
			w := windows[k]
			var parts []string
			for _, why := range RefusalReasons() {
				if n := w.byWhy[why]; n > 0 {
					parts = append(parts, fmt.Sprintf("%s %d", why, n))
				}
			}
			msg := fmt.Sprintf("%d more requests refused within %s: %s; last at %s: %s",
				w.n, every, strings.Join(parts, ", "), w.lastAt.Format(time.RFC3339), w.last)
			if err := s.appendEvent(tx, &Event{Server: k.server, Kind: k.kind, Actor: ActorController, Message: msg}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("state: write refusal summaries: %w", err)
	}
	return nil
}

// closeRefusals writes what is pending and stops the pacer (Close).
func (s *Store) closeRefusals() {
	_ = s.FlushRefusals()
	p := &s.refusals
	p.mu.Lock()
	p.closed = true
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	p.mu.Unlock()
}

// Writes returns the number of page writes bbolt committed since the
// store was opened (bbolt TxStats.Write: at least one, the meta page, per
// commit; none for a rolled-back transaction); 0 on etcd. For tests that
// check a path writes nothing.
func (s *Store) Writes() int64 {
	if s.bdb == nil {
		return 0
	}
	st := s.bdb.Stats()
	return st.TxStats.GetWrite()
}
