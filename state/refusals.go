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
	RefusalRateLimited   RefusalReason = "rate_limited"   // a known machine (a joined host's heartbeats) over its own request rate: 429
)

// RefusalReasons lists every RefusalReason, for metrics.
func RefusalReasons() []RefusalReason {
	return []RefusalReason{RefusalTokenUnknown, RefusalTokenExpired, RefusalTokenUsed, RefusalTokenMismatch,
		RefusalWrongAddress, RefusalBadRequest, RefusalUnavailable, RefusalRateLimited}
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
// for "") and the event kind; host names the host of a machine anomaly
// (its heartbeats), "" for refusals.
type refusalKey struct {
	server string
	kind   EventKind
	host   string
}

type refusalWindow struct {
	n      int64
	byWhy  map[RefusalReason]int64
	last   string
	lastAt time.Time
}

// refusalPacer turns refused requests (and machine-reported anomalies:
// anomalies.go) into events at a bounded rate. The first one for a key is
// written at once (an operator sees a lone refusal as before); further
// ones are counted and written as one summary event per key when the
// interval ends; a key with nothing in an interval goes quiet again. A
// flood therefore costs one transaction (one fsync, one planner wake) per
// interval, and at most one event per key in it, whatever the request
// rate. Keys are bounded: a server is named only when it exists (the
// callers check), a host only when it is joined (it presented its node
// certificate), so at most one key per registered server (or host) and
// kind plus one per kind for unnamed refusals.
type refusalPacer struct {
	mu      sync.Mutex
	every   time.Duration
	windows map[refusalKey]*refusalWindow
	timer   *time.Timer
	closed  bool
	totals  map[RefusalReason]int64
	kinds   map[EventKind]int64
	// summary renders a key's summary event message.
	summary func(k refusalKey, w *refusalWindow, every time.Duration) string
}

// interval is the pacer's interval with its default.
func (p *refusalPacer) interval() time.Duration {
	if p.every <= 0 {
		return defaultRefusalEvery
	}
	return p.every
}

// refusalSummary is the refusal pacer's summary message.
func refusalSummary(_ refusalKey, w *refusalWindow, every time.Duration) string {
	var parts []string
	for _, why := range RefusalReasons() {
		if n := w.byWhy[why]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", why, n))
		}
	}
	return fmt.Sprintf("%d more requests refused within %s: %s; last at %s: %s",
		w.n, every, strings.Join(parts, ", "), w.lastAt.Format(time.RFC3339), w.last)
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
	return s.flushPacer(&s.refusals)
}

func (s *Store) flushPacer(p *refusalPacer) error {
	p.mu.Lock()
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	windows := p.windows
	p.windows = nil
	p.mu.Unlock()
	return s.writeSummaries(p, windows)
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
	key := refusalKey{server: server, kind: kind}
	p.mu.Lock()
	if p.totals == nil {
		p.totals = map[RefusalReason]int64{}
	}
	p.totals[why]++
	p.mu.Unlock()
	if !s.pace(p, key, why, message, true) {
		return false
	}
	_ = s.update(func(tx kvTx) error {
		return s.appendEvent(tx, &Event{Server: server, Kind: kind, Actor: ActorController, Message: message})
	})
	return true
}

// hot reports whether key has an open window (its next event is counted
// into a summary, not written).
func (p *refusalPacer) hot(key refusalKey) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.windows[key]
	return ok || p.closed
}

// pace accounts one occurrence for key. With open true, a quiet key's
// window is opened and pace reports true: the caller writes the event now.
// A hot key (or open false) is counted into its window's summary (why,
// message) and pace reports false. A closed pacer drops it.
func (s *Store) pace(p *refusalPacer, key refusalKey, why RefusalReason, message string, open bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	w, hot := p.windows[key]
	if !hot && open {
		if p.windows == nil {
			p.windows = map[refusalKey]*refusalWindow{}
		}
		// Quiet key: written now; the window counts what follows it.
		p.windows[key] = &refusalWindow{byWhy: map[RefusalReason]int64{}}
		s.armPacer(p)
		return true
	}
	if !hot {
		if p.windows == nil {
			p.windows = map[refusalKey]*refusalWindow{}
		}
		w = &refusalWindow{byWhy: map[RefusalReason]int64{}}
		p.windows[key] = w
		s.armPacer(p)
	}
	w.n++
	if why != "" {
		w.byWhy[why]++
	}
	w.last, w.lastAt = message, s.nowUTC()
	return false
}

// armPacer starts p's interval timer if it is not running (p.mu held).
func (s *Store) armPacer(p *refusalPacer) {
	if p.timer == nil {
		every := p.interval()
		p.timer = time.AfterFunc(every, func() { s.pacerTick(p, every) })
	}
}

// pacerTick ends an interval: it writes the summaries of the keys that
// saw something, keeps them hot for another interval, and drops the quiet
// ones.
func (s *Store) pacerTick(p *refusalPacer, every time.Duration) {
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
		p.timer = time.AfterFunc(every, func() { s.pacerTick(p, every) })
	}
	p.mu.Unlock()
	_ = s.writeSummaries(p, due)
}

// writeSummaries appends one event per key with something counted, in one
// transaction.
func (s *Store) writeSummaries(p *refusalPacer, windows map[refusalKey]*refusalWindow) error {
	keys := slices.SortedFunc(maps.Keys(windows), func(a, b refusalKey) int {
		return strings.Compare(a.server+"\x00"+string(a.kind)+"\x00"+a.host, b.server+"\x00"+string(b.kind)+"\x00"+b.host)
	})
	keys = slices.DeleteFunc(keys, func(k refusalKey) bool { return windows[k].n == 0 })
	if len(keys) == 0 {
		return nil
	}
	summary := p.summary
	if summary == nil {
		summary = refusalSummary
	}
	every := p.interval()
	err := s.update(func(tx kvTx) error {
		for _, k := range keys {
			msg := summary(k, windows[k], every)
			if err := s.appendEvent(tx, &Event{Server: k.server, Kind: k.kind, Actor: ActorController, Message: msg}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("state: write paced summaries: %w", err)
	}
	return nil
}

// closeRefusals writes what is pending and stops the pacers (Close).
func (s *Store) closeRefusals() {
	for _, p := range []*refusalPacer{&s.refusals, &s.anomalies} {
		_ = s.flushPacer(p)
		p.mu.Lock()
		p.closed = true
		if p.timer != nil {
			p.timer.Stop()
			p.timer = nil
		}
		p.mu.Unlock()
	}
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
