package bmc

import (
	"context"
	"sync"
)

// ShareReads returns a context for one operation of several driver calls
// on one BMC, run by one caller in turn (a netboot: set the boot override,
// read the power state, power on or reset). Under it a driver MAY answer a
// read that only chooses its next request (the state a write starts from:
// the boot override's current properties, the power state that picks on
// or reset, the reset action and its allowed types) from the newest
// answer it had from the BMC within the operation, instead of asking
// again; any write the driver sends forgets that answer. A read that
// verifies (a read-back after a write, a poll for a power state) always
// asks the BMC. Nothing outlives ctx: a later operation reads afresh, as
// the BMC's state changes under the controller (a host powering itself
// off, a button pressed).
//
// A driver that does not share reads ignores the scope. Calls under one
// scope must not run concurrently on one driver; different drivers may
// share a scope (each keeps its own answer).
func ShareReads(ctx context.Context) context.Context {
	return context.WithValue(ctx, shareKey{}, &ReadScope{vals: map[any]any{}})
}

type shareKey struct{}

// ReadScope holds what drivers read within one ShareReads operation,
// keyed by a value of the driver's choosing (its own connection). Safe for
// concurrent use.
type ReadScope struct {
	mu   sync.Mutex
	vals map[any]any
}

// SharedReads returns ctx's scope, nil when ctx has none (every read then
// asks the BMC).
func SharedReads(ctx context.Context) *ReadScope {
	s, _ := ctx.Value(shareKey{}).(*ReadScope)
	return s
}

// Load returns what was stored under key; ok is false when nothing is or
// s is nil.
func (s *ReadScope) Load(key any) (v any, ok bool) {
	if s == nil {
		return nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok = s.vals[key]
	return v, ok
}

// Store keeps v under key, replacing what was there; a nil s ignores it.
func (s *ReadScope) Store(key, v any) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.vals[key] = v
}

// Forget drops what was stored under key (after a write); a nil s
// ignores it.
func (s *ReadScope) Forget(key any) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.vals, key)
}
