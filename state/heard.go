package state

import (
	"errors"
	"maps"
	"slices"
	"sync"
	"time"
)

// HeardDelay is how long a LastHeard note from NoteHeard (or
// TokenSpec.Heard) waits before it is written: the notes of every server
// heard in that time share one transaction. A crash loses at most the
// notes of the last HeardDelay, which the silence detection they feed
// (minutes: the reconciler's re-netboot of a silent machine) cannot tell.
const HeardDelay = 250 * time.Millisecond

// heardChunk bounds the servers one flush transaction updates (two
// operations each on etcd, whose transactions are bounded at 128
// operations by default).
const heardChunk = 48

// heardNote is a pending LastHeard note.
type heardNote struct {
	what string
	at   time.Time
	boot *BootFetch // NoteBootFetch's, nil for other notes
}

// heardQueue holds the LastHeard notes not yet written. A boot storm's
// script fetches each used to rewrite their server's record inside the
// token's own transaction: about two thirds of a 1,000-mint burst's commit
// time on this project's lab disk (bench/bootstorm.md). Written
// behind, a burst of notes costs one record write per server per
// HeardDelay, in a few shared transactions, and the token's transaction
// is the token alone.
type heardQueue struct {
	mu      sync.Mutex
	pending map[string]heardNote
	// lastFlush is how many notes the last flush took: the size of the
	// next pending map.
	lastFlush int
	timer     *time.Timer
	closed    bool
	// flushMu serialises flushes, so two never write one server's notes
	// out of order.
	flushMu sync.Mutex
}

// NoteHeard records that server's machine did what at the store's now,
// as the server's LastHeard and LastHeardAt, written behind: within
// HeardDelay, in a transaction shared with the other notes of that time;
// FlushHeard and Close write what is pending at once. A later note for
// the same server replaces an earlier pending one, and a note never
// replaces a LastHeard that another write recorded after it. Notes for a
// server that does not exist (any more) are dropped. It never fails: a
// flush that cannot be written is logged and dropped, as the next
// request from the machine notes it again.
func (s *Store) NoteHeard(server, what string) {
	s.noteHeard(server, heardNote{what: what, at: s.nowUTC()})
}

// NoteBootFetch records that server's machine was sent the boot file f
// (f.At is set to the store's now): as LastHeard ("boot file fetched:
// FILE by VIA") and as BootFetch, written behind as NoteHeard writes.
func (s *Store) NoteBootFetch(server string, f BootFetch) {
	f.At = s.nowUTC()
	s.noteHeard(server, heardNote{what: HeardBootFile(f.File, f.Via), at: f.At, boot: &f})
}

// noteHeard queues n as server's pending note (the latest wins) and arms
// the flush; a closed queue drops it.
func (s *Store) noteHeard(server string, n heardNote) {
	q := &s.heard
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	if q.pending == nil {
		// Sized as the last flush's notes: a boot storm's burst of
		// script requests fills it without growing it.
		q.pending = make(map[string]heardNote, q.lastFlush)
	}
	q.pending[server] = n
	q.armLocked(s)
}

// HeardBootFile is the LastHeard of a boot file fetch.
func HeardBootFile(file, via string) string {
	return "boot file fetched: " + file + " by " + via
}

// armLocked starts the flush timer if none runs; q.mu is held.
func (q *heardQueue) armLocked(s *Store) {
	if q.timer == nil {
		q.timer = time.AfterFunc(HeardDelay, func() {
			if err := s.FlushHeard(); err != nil {
				s.log.Warn("state: last-heard notes not written", "err", err)
			}
		})
	}
}

// FlushHeard writes the pending LastHeard notes now (NoteHeard), in
// transactions of at most 48 servers, waking no Notify listener. Errors: the engine's, after which
// the notes of the failed transaction are dropped.
func (s *Store) FlushHeard() error {
	q := &s.heard
	q.flushMu.Lock()
	defer q.flushMu.Unlock()
	q.mu.Lock()
	if q.timer != nil {
		q.timer.Stop()
		q.timer = nil
	}
	pending := q.pending
	q.pending = nil
	if len(pending) > 0 {
		q.lastFlush = min(len(pending), 4096)
	}
	q.mu.Unlock()
	if len(pending) == 0 {
		return nil
	}
	names := slices.Sorted(maps.Keys(pending))
	var first error
	for chunk := range slices.Chunk(names, heardChunk) {
		// Not s.update: a LastHeard note wakes no Notify listener. The
		// reconciler plans from it only a machine's silence, which a
		// note can only push later; a pass per flush (every HeardDelay
		// while machines talk) planned nothing new.
		err := s.eng.update(func(tx kvTx) error {
			wrote := false
			for _, name := range chunk {
				n := pending[name]
				_, err := s.updateServerTx(tx, name, func(srv *Server) error {
					if !n.at.After(srv.LastHeardAt) {
						return errHeardStale
					}
					srv.LastHeard, srv.LastHeardAt = n.what, n.at
					if n.boot != nil {
						srv.BootFetch = n.boot
					}
					return nil
				})
				switch {
				case err == nil:
					wrote = true
				case err == errHeardStale, errors.Is(err, ErrNotFound): // stale note, or the server is gone
				default:
					return err
				}
			}
			if !wrote {
				return errRollback
			}
			return nil
		})
		if err = rolledBack(err); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// errHeardStale skips a note older than the server's LastHeardAt.
var errHeardStale = errors.New("state: last-heard note older than the record")

// heardCloseWait bounds how long Close waits for the pending notes'
// write: on etcd a write queues behind the process's other writers, and
// with etcd unreachable each of them runs to its request timeout (a
// deposed leader's stuck actions); Close must not wait for them all.
const heardCloseWait = time.Second

// closeHeard stops taking notes and writes the pending ones, waiting at
// most heardCloseWait: a write still queued then ends with the engine's
// ErrClosed and its notes are lost, as in a crash.
func (s *Store) closeHeard() {
	q := &s.heard
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- s.FlushHeard() }()
	select {
	case err := <-done:
		if err != nil {
			s.log.Warn("state: last-heard notes not written at close", "err", err)
		}
	case <-time.After(heardCloseWait):
		s.log.Warn("state: last-heard notes not written at close: the store did not take the write within the wait", "wait", heardCloseWait)
	}
}
