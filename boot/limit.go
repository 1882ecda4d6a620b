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
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	last   time.Time
}

// maxBuckets bounds memory: beyond it, full (idle) buckets are dropped.
const maxBuckets = 65536

// NewLimiter returns a Limiter applying l to each key.
func NewLimiter(l Limit) *Limiter {
	return &Limiter{lim: l, now: time.Now, buckets: map[string]*bucket{}}
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
		b = &bucket{tokens: float64(l.lim.Burst), last: now}
		l.buckets[key] = b
	}
	b.tokens += float64(now.Sub(b.last)) / float64(l.lim.Every)
	if max := float64(l.lim.Burst); b.tokens > max {
		b.tokens = max
	}
	b.last = now
	if b.tokens < 1 {
		return false, time.Duration((1 - b.tokens) * float64(l.lim.Every))
	}
	b.tokens--
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
