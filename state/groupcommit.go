package state

import (
	"errors"
	"sync"
)

// committer runs write transactions of concurrent callers in shared
// commits (group commit): a caller that finds no commit running commits
// its own transaction at once; callers that arrive while it runs queue,
// and the first of them then commits the whole queue in one transaction,
// with one fsync. Unlike bolt.DB.Batch there is no delay: an idle store
// commits each write as soon as it is asked, and under load a commit takes
// everything that queued during the previous one.
//
// A boot storm's 1,000 script GETs each mint a token
// (IssueToken); one commit and its fsync each, they queued behind one
// another and the last machine waited for all the others' fsyncs. The
// reconciler's workers likewise each journal an action before and after
// its effect, record power and move lifecycles: every Store.update on
// bbolt goes through it. Used on bbolt only (Open): an etcd transaction is
// bounded in operations (--max-txn-ops), and the etcd engine shares its
// transactions itself within that bound.
type committer struct {
	update func(fn func(tx kvTx) error) error // the engine's
	// max bounds the calls one commit takes (0: all that queued); the
	// rest wait for the next.
	max   int
	mu    sync.Mutex
	queue []*groupCall
	busy  bool // a caller is committing; the queue waits for it
}

type groupCall struct {
	fn       func(kvTx) error
	err      error
	panicked any       // what fn panicked with; its caller panics with it
	done     chan bool // true: commit the queue (lead); false: err is the result
}

// errPanicked stands for a function that panicked, inside commit.
var errPanicked = errors.New("state: group commit: function panicked")

// call runs c.fn in tx, turning a panic into errPanicked (kept in
// c.panicked for its caller), so that one caller's panic neither rolls
// back the others for good nor leaves the committer busy.
func (c *groupCall) call(tx kvTx) (err error) {
	defer func() {
		if r := recover(); r != nil {
			c.panicked, err = r, errPanicked
		}
	}()
	return c.fn(tx)
}

// run commits fn, alone or with other callers' functions in one
// transaction. fn may run more than once (when a function committed with
// it fails, the others run again without it), so it must be idempotent
// given the same starting state and must assign, not accumulate, its
// results; its error is returned as the engine's update would return it, and
// a panic in fn is a panic of run's caller (the other callers' functions
// are committed without it).
func (c *committer) run(fn func(kvTx) error) error {
	call := &groupCall{fn: fn, done: make(chan bool, 1)}
	c.mu.Lock()
	c.queue = append(c.queue, call)
	if c.busy {
		c.mu.Unlock()
		if lead := <-call.done; !lead {
			if call.panicked != nil {
				panic(call.panicked)
			}
			return call.err
		}
		c.mu.Lock() // handed the lead: busy stays set
	} else {
		c.busy = true
	}
	calls := c.queue
	c.queue = nil
	if c.max > 0 && len(calls) > c.max {
		// The caller leading is calls[0]: it queued first, or found
		// the committer idle and the queue empty.
		c.queue = append(c.queue, calls[c.max:]...)
		calls = calls[:c.max:c.max]
	}
	c.mu.Unlock()

	c.commit(calls, call)

	c.mu.Lock()
	if len(c.queue) > 0 {
		c.queue[0].done <- true // the first queued caller commits the next group
	} else {
		c.busy = false
	}
	c.mu.Unlock()
	if call.panicked != nil {
		panic(call.panicked)
	}
	return call.err
}

// commit runs calls in one transaction and gives each its result; self's
// is set but not signalled (its caller is running commit). When one
// function fails the transaction is rolled back; the failing one runs
// alone, for its own error (one that panicked does not run again, nor
// one that ran first in the transaction: it saw what it would see alone),
// and the others run again in a new one, as bolt.DB.Batch does.
func (c *committer) commit(calls []*groupCall, self *groupCall) {
	for len(calls) > 0 {
		failed := -1
		err := c.update(func(tx kvTx) error {
			for i, call := range calls {
				if err := call.call(tx); err != nil {
					failed = i
					return err
				}
			}
			return nil
		})
		if failed < 0 {
			// Committed, or the commit itself failed (every call fails).
			for _, call := range calls {
				call.err = err
				if call != self {
					call.done <- false
				}
			}
			return
		}
		bad := calls[failed]
		switch {
		case bad.panicked != nil:
		case failed == 0:
			// It ran first, on the committed state with nothing of the
			// others before it: as it would have alone, so the error is
			// its own (a lone caller's failure costs one run, not two).
			bad.err = err
		default:
			bad.err = c.update(bad.call)
		}
		if bad != self {
			bad.done <- false
		}
		calls = append(calls[:failed:failed], calls[failed+1:]...)
	}
}

// grouped is update: on bbolt every write goes through the store's
// committer (concurrent callers share one commit and one fsync, a lone
// caller commits at once); on etcd the engine shares transactions. fn
// may run more than once (see committer.run).
func (s *Store) grouped(fn func(tx kvTx) error) error { return s.update(fn) }
