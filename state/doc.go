// Package state is Machina's observed state: one bbolt file (or one etcd
// key prefix, see below) holding servers
// (lifecycle, power, BMC and hardware facts, allocation, observed action
// counters, last error), an append-only event log with bounded retention,
// single-use machine tokens, admin API tokens, named credentials (sealed
// with AES-256-GCM when a master key is configured), hosts and join logs.
//
// # Guarantees
//
//   - Every lifecycle move is compare-and-set inside one bbolt read-write
//     transaction and writes its event in that same transaction, so two
//     callers cannot both win and no committed move lacks its event.
//   - Only the moves in [CanTransition] are accepted; anything else returns a
//     [*TransitionError] carrying the current lifecycle.
//   - Machine tokens are stored as SHA-256 hashes and consumed atomically.
//   - Secrets never leave the package except through [Store.Secret].
//   - One process holds the file: [Open] fails with [ErrLocked] after
//     [Options.Timeout] when another process has it open.
//
// Buckets and keys are private; callers use [Store] methods only. Each
// method is one bbolt transaction, bounded by disk I/O (an fsync per
// committed write), so methods take no context: bbolt transactions cannot be
// cancelled part way. On etcd each method is one etcd transaction (a few
// reads and one Txn; writes of one process that wait while another commits
// share the next Txn, up to 8 of them, as bbolt's Batch shares a commit),
// each request bounded by EtcdConfig.RequestTimeout; a commit whose answer
// is lost returns [ErrCommitUncertain]. Read-only
// methods on etcd read a watch-fed copy of the site in memory (consistent at
// one etcd revision, holding this process's own commits; another
// controller's commits show after the watch's delay), falling back to etcd
// reads while that copy loads or lags (engine_etcd_replica.go).
//
// # Engines: bbolt and etcd
//
// The store logic is written once against a small transactional interface
// (engine.go) and runs on one of two engines. [Open] opens a bbolt file: the
// embedded default, unchanged for a single-controller site (same file
// format, same behaviour). [OpenEtcd] opens a site stored in etcd under a
// key prefix, for two or three controllers sharing one site: every method
// keeps its guarantees above (compare-and-set moves with their events in
// one transaction, single-use tokens), because each method is still one
// transaction: an optimistic etcd transaction that reads at one revision
// and commits only if nothing it read changed since, rerun otherwise
// (engine_etcd.go explains the compares, and why concurrency.STM was not
// enough). On etcd the lock of the file is replaced by the fence.
//
// # Fencing (etcd)
//
// A controller that won an election (etcd concurrency.Election) calls
// [Store.SetFence] with the election's leader key and its create revision
// (Election.Key(), Election.Rev()). From then on every write transaction
// compares that key in the same etcd Txn: when the key is gone (the lease
// lapsed, the leader resigned) or was created again (another campaign), the
// write commits nothing and returns an error wrapping [ErrNotLeader]; the
// store never retries it. Reads are not fenced. SetFence(nil) removes the
// fence; bbolt stores refuse fences ([ErrFenceUnsupported]). The caller
// steps down on ErrNotLeader and sets the new fence after winning again.
//
// # Events on etcd
//
// Retention (count site-wide, count per server, age) bounds the live event
// log on both engines; on etcd one append deletes at most 16 old events and
// Prune runs in bounded transactions (etcd's --max-txn-ops). etcd keeps old
// revisions of deleted and rewritten keys until they are compacted:
// compaction (--auto-compaction-mode/--auto-compaction-retention or
// `etcdctl compact`) and defragmentation are the etcd operator's task.
//
// state imports no other Machina package.
package state
