package state

import (
	"context"
	"sort"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// # The read replica (etcd)
//
// Views on etcd read a watch-fed copy of every key under the prefix kept in
// this process's memory, instead of one etcd range read per bucket walked:
// a Snapshot of 10,000 servers or a lookup by boot MAC then costs what it
// costs on bbolt (a walk of memory), not a transfer of the servers bucket
// per call.
//
//   - Consistent at one revision: the replica is loaded by range reads at
//     one revision, then fed by a watch from the next revision on; each
//     watch response is applied under the write lock (etcd never splits a
//     revision's events across responses), and a view holds the read lock
//     for its whole function, so it sees exactly one revision.
//   - Linearizable, as a direct read: a view first learns etcd's current
//     revision (a count-only read of one key, linearizable; the views that
//     arrive while one such read is in flight share the next one, so many
//     concurrent views cost two round trips at most, not one each) and
//     waits until the replica has applied it; so a view sees every commit
//     that ended before it began, this process's and other controllers'
//     (a token issued by one controller is known to the other at once). A
//     commit at revision R when the replica is at R-1 (this process the
//     only writer meanwhile: the fenced leader's normal case) is applied to
//     the replica at once from the transaction's own operations, so the
//     leader does not wait for the watch to bring back its own writes.
//   - Falls back to etcd: while the replica is loading, after its watch
//     broke (compaction, a lost member; it is loaded again after a second),
//     or when it lags etcd's revision by more than repMaxLag, a view reads
//     etcd directly, as before. (A revision made outside the prefix, by
//     another site or an election, never reaches the replica's watch: a
//     view waiting for it reads etcd after repMaxLag. Watch progress
//     reports are not asked for and would not be trusted: etcd before
//     3.4.25 and 3.5.8 can report a revision ahead of undelivered events,
//     etcd-io/etcd#15220.)
//   - Updates never read the replica: they read etcd (or the write cache)
//     and their compares make them correct whatever a view showed.
//
// View functions must not call the store (a nested view could wait on the
// replica's lock behind the watch's writer: the same rule as bbolt's nested
// transactions).

// repMaxLag bounds how long a view waits for the replica to reach this
// process's last commit before it reads etcd directly.
const repMaxLag = 500 * time.Millisecond

// repPage is the page size of the replica's loading range reads.
const repPage = 1000

type replica struct {
	e      *etcdEngine
	mu     sync.RWMutex
	synced bool  // loaded and watching: views may use it
	rev    int64 // every revision up to rev is applied
	adv    chan struct{}
	kv     map[string][]byte   // full etcd key → value ([]byte{} when empty)
	idx    map[string][]string // bucket data prefix (P k/<id>=) → sorted record keys

	fmu     sync.Mutex // guards pending and busy
	pending *revRead   // the revision read the views arriving now will share
	busy    bool       // a revision read is in flight
}

// revRead is one shared read of etcd's current revision.
type revRead struct {
	done chan struct{}
	rev  int64
	err  error
}

// current returns etcd's current revision by a linearizable read sent
// after the call began (shared with the views arriving meanwhile).
func (r *replica) current() (int64, error) {
	r.fmu.Lock()
	if r.pending == nil {
		r.pending = &revRead{done: make(chan struct{})}
	}
	f := r.pending
	if !r.busy {
		r.busy = true
		go r.sendReads()
	}
	r.fmu.Unlock()
	<-f.done
	return f.rev, f.err
}

// sendReads sends the pending revision reads one after another.
func (r *replica) sendReads() {
	for {
		r.fmu.Lock()
		f := r.pending
		r.pending = nil
		if f == nil {
			r.busy = false
			r.fmu.Unlock()
			return
		}
		r.fmu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), r.e.timeout)
		t0 := time.Now()
		resp, err := r.e.cli.Get(ctx, r.e.prefix+"m/"+escapeBucket(bucketMeta), clientv3.WithCountOnly())
		r.e.stats.revReads.Add(1)
		r.e.stats.revReadNanos.Add(int64(time.Since(t0)))
		cancel()
		if err != nil {
			f.err = err
		} else {
			f.rev = resp.Header.Revision
		}
		close(f.done)
	}
}

func newReplica(e *etcdEngine) *replica {
	return &replica{e: e, adv: make(chan struct{}), kv: map[string][]byte{}, idx: map[string][]string{}}
}

func (r *replica) run(ctx context.Context) {
	for ctx.Err() == nil {
		rev, err := r.load(ctx)
		if err == nil {
			r.follow(ctx, rev)
		}
		r.mu.Lock()
		r.synced = false
		r.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// load reads every key under the prefix at one revision into a fresh copy
// and installs it.
func (r *replica) load(ctx context.Context) (int64, error) {
	p := r.e.prefix
	end := clientv3.GetPrefixRangeEnd(p)
	kv := map[string][]byte{}
	idx := map[string][]string{}
	var rev int64
	from := p
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(repPage)}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		c, cancel := context.WithTimeout(ctx, r.e.timeout)
		resp, err := r.e.cli.Get(c, from, opts...)
		cancel()
		if err != nil {
			return 0, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, x := range resp.Kvs {
			k := string(x.Key)
			kv[k] = nonNil(x.Value)
			if pfx, rk, ok := r.split(k); ok {
				idx[pfx] = append(idx[pfx], rk) // range reads come in key order
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	r.mu.Lock()
	r.kv, r.idx, r.rev, r.synced = kv, idx, rev, true
	r.advance()
	r.mu.Unlock()
	return rev, nil
}

// follow applies the watch from rev+1 until it breaks or ctx ends.
func (r *replica) follow(ctx context.Context, rev int64) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := r.e.cli.Watch(clientv3.WithRequireLeader(wctx), r.e.prefix, clientv3.WithPrefix(),
		clientv3.WithRev(rev+1))
	for resp := range wch {
		if resp.Err() != nil || resp.Canceled {
			return
		}
		r.mu.Lock()
		for _, ev := range resp.Events {
			if ev.Kv.ModRevision <= r.rev {
				continue // applied already from this process's commit
			}
			k := string(ev.Kv.Key)
			if ev.Type == clientv3.EventTypeDelete {
				r.del(k)
			} else {
				r.put(k, nonNil(ev.Kv.Value))
			}
		}
		top := r.rev
		if n := len(resp.Events); n > 0 {
			top = max(top, resp.Events[n-1].Kv.ModRevision)
		}
		// Only events advance the copy (the watch asks for no progress
		// notifications): etcd before 3.4.25 and 3.5.8 (etcd-io/etcd#15220;
		// Debian 12 ships 3.4.23) can send one with a revision ahead of
		// events it has not sent yet, and a view trusting it read a token
		// another controller had just issued as unknown
		// (TestEtcdTwoControllersTokenOnce, 1 in 15 runs). A view waits
		// for the watch's next event or reads etcd after repMaxLag.
		if top > r.rev {
			r.rev = top
			r.advance()
		}
		r.mu.Unlock()
	}
}

// advance wakes the views waiting for a revision; r.mu is held.
func (r *replica) advance() {
	close(r.adv)
	r.adv = make(chan struct{})
}

// split returns the data prefix and record key of a record's etcd key.
func (r *replica) split(k string) (string, string, bool) {
	rest, ok := strings.CutPrefix(k, r.e.prefix+"k/")
	if !ok {
		return "", "", false
	}
	i := strings.IndexByte(rest, '=')
	if i < 0 {
		return "", "", false
	}
	n := len(k) - len(rest) + i + 1
	return k[:n], k[n:], true
}

// put and del change one key; r.mu is held.
func (r *replica) put(k string, v []byte) {
	if _, had := r.kv[k]; !had {
		if pfx, rk, ok := r.split(k); ok {
			keys := r.idx[pfx]
			if n := len(keys); n == 0 || rk > keys[n-1] {
				keys = append(keys, rk)
			} else {
				i := sort.SearchStrings(keys, rk)
				keys = append(keys, "")
				copy(keys[i+1:], keys[i:])
				keys[i] = rk
			}
			r.idx[pfx] = keys
		}
	}
	r.kv[k] = v
}

func (r *replica) del(k string) {
	if _, had := r.kv[k]; !had {
		return
	}
	delete(r.kv, k)
	if pfx, rk, ok := r.split(k); ok {
		keys := r.idx[pfx]
		if i := sort.SearchStrings(keys, rk); i < len(keys) && keys[i] == rk {
			keys = append(keys[:i], keys[i+1:]...)
		}
		if len(keys) == 0 {
			delete(r.idx, pfx)
		} else {
			r.idx[pfx] = keys
		}
	}
}

// delPrefix deletes every record of the bucket with data prefix pfx.
func (r *replica) delPrefix(pfx string) {
	for _, rk := range r.idx[pfx] {
		delete(r.kv, pfx+rk)
	}
	delete(r.idx, pfx)
}

// committed applies this process's commit at revision rev when the replica
// is at rev-1 (otherwise the watch brings it). The operations are the
// transaction's Then branch: puts, deletes and whole-bucket prefix deletes.
func (r *replica) committed(rev int64, ops []clientv3.Op) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.synced || r.rev != rev-1 {
		return
	}
	for _, op := range ops {
		k := string(op.KeyBytes())
		switch {
		case op.IsPut():
			r.put(k, nonNil(op.ValueBytes()))
		case op.IsDelete() && len(op.RangeBytes()) > 0:
			// Only whole-bucket deletes use a range: the bucket's data
			// prefix to its prefix end.
			r.delPrefix(k)
		case op.IsDelete():
			r.del(k)
		}
	}
	r.rev = rev
	r.advance()
}

// view runs fn on the replica once it holds etcd's current revision;
// false when it cannot (not synced, lagging past repMaxLag, or the
// revision read failed): read etcd.
func (r *replica) view(fn func(tx kvTx) error) (ok bool, err error) {
	stamped := false // the wait was counted (fn's own time is not)
	r.mu.RLock()
	synced := r.synced
	r.mu.RUnlock()
	if !synced {
		return false, nil
	}
	t0 := time.Now()
	defer func() {
		if !stamped {
			r.e.stats.viewWaitNanos.Add(int64(time.Since(t0)))
		}
	}()
	want, rerr := r.current()
	if rerr != nil {
		return false, nil
	}
	want = max(want, r.e.lastRev.Load())
	var timer <-chan time.Time
	for {
		r.mu.RLock()
		if !r.synced {
			r.mu.RUnlock()
			return false, nil
		}
		if r.rev >= want {
			break // holding the read lock
		}
		ch := r.adv
		r.mu.RUnlock()
		if timer == nil {
			timer = time.After(repMaxLag)
		}
		select {
		case <-ch:
		case <-timer:
			return false, nil
		}
	}
	defer r.mu.RUnlock()
	r.e.stats.viewWaitNanos.Add(int64(time.Since(t0)))
	stamped = true
	tx := r.e.newTx(false)
	tx.rep = r
	return true, fn(tx)
}

// get reads one key; r.mu is held (read).
func (r *replica) get(k string) cachedKV {
	v, ok := r.kv[k]
	if !ok {
		return cachedKV{}
	}
	return cachedKV{v: v, present: true}
}

// next returns the first record of the bucket with data prefix pfx whose
// key is ≥ k; r.mu is held (read).
func (r *replica) next(pfx, k string) ([]byte, []byte) {
	keys := r.idx[pfx]
	i := sort.SearchStrings(keys, k)
	if i == len(keys) {
		return nil, nil
	}
	return []byte(keys[i]), r.kv[pfx+keys[i]]
}

// count is the number of records of the bucket with data prefix pfx.
func (r *replica) count(pfx string) int { return len(r.idx[pfx]) }

func nonNil(v []byte) []byte {
	if v == nil {
		return []byte{}
	}
	return v
}

// startReplica starts the views' read replica; Close stops it.
func (e *etcdEngine) startReplica() {
	ctx, cancel := context.WithCancel(context.Background())
	e.stopRep = cancel
	r := newReplica(e)
	e.rep = r
	go r.run(ctx)
}

// noteCommit records a commit at rev (views wait for the replica to reach
// it) and applies it to the replica when that is current. A transaction
// without a put may change nothing (deletes of absent keys), so etcd may
// not have made rev for it: the watch brings such ones.
func (e *etcdEngine) noteCommit(rev int64, ops []clientv3.Op) {
	for {
		last := e.lastRev.Load()
		if rev <= last || e.lastRev.CompareAndSwap(last, rev) {
			break
		}
	}
	if e.rep == nil {
		return
	}
	for _, op := range ops {
		if op.IsPut() {
			e.rep.committed(rev, ops)
			return
		}
	}
}
