// Package state is Machina's observed state: one bbolt file holding servers
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
// cancelled part way.
//
// state imports no other Machina package.
package state
