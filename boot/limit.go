package boot

import (
	"sync"
	"time"
)

// Limit is a token bucket: Burst requests at once, refilled one per Every.
type Limit struct {
	Burst int
	Every time.Duration
}

// Limiter is a set of token buckets keyed by string (a client IP or MAC),
// for the per-client rate limits of the machine-facing endpoints. Memory
// is bounded: beyond 65,536 keys, idle buckets are dropped. Safe for
// concurrent use.
type Limiter struct {
	lim Limit
	now func() time.Time

	mu      sync.Mutex
	buckets map[string]bucket
}

type bucket struct {
	tokens float64
	last   time.Time
}

// maxBuckets bounds memory: beyond it, full (idle) buckets are dropped.
const maxBuckets = 65536

// initialBuckets sizes a new Limiter's map for a rack-sized burst of new
// keys (a boot storm's first requests after the controller started): the
// map does not grow, rehashing and faulting in new tables, under the
// burst; about 40 KB.
const initialBuckets = 1024

// NewLimiter returns a Limiter applying l to each key.
func NewLimiter(l Limit) *Limiter {
	return &Limiter{lim: l, now: time.Now, buckets: make(map[string]bucket, initialBuckets)}
}

// Allow takes one token for key; when none is left it returns false and how
// long until the next one.
func (l *Limiter) Allow(key string) (bool, time.Duration) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[key]
	if !ok {
		if len(l.buckets) >= maxBuckets {
			l.sweep(now)
		}
		b = bucket{tokens: float64(l.lim.Burst), last: now}
	}
	b.tokens += float64(now.Sub(b.last)) / float64(l.lim.Every)
	if max := float64(l.lim.Burst); b.tokens > max {
		b.tokens = max
	}
	b.last = now
	allowed := b.tokens >= 1
	if allowed {
		b.tokens--
	}
	l.buckets[key] = b
	if !allowed {
		return false, time.Duration((1 - b.tokens) * float64(l.lim.Every))
	}
	return true, 0
}

func (l *Limiter) sweep(now time.Time) {
	full := time.Duration(l.lim.Burst) * l.lim.Every
	for k, b := range l.buckets {
		if now.Sub(b.last) >= full {
			delete(l.buckets, k)
		}
	}
}
