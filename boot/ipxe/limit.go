package ipxe

import (
	"sync"
	"time"
)

// limiter is a set of token buckets keyed by string (IP or MAC).
type limiter struct {
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

func newLimiter(l Limit) *limiter {
	return &limiter{lim: l, now: time.Now, buckets: map[string]*bucket{}}
}

// allow takes one token for key; when none is left it returns false and how
// long until the next one.
func (l *limiter) allow(key string) (bool, time.Duration) {
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

func (l *limiter) sweep(now time.Time) {
	full := time.Duration(l.lim.Burst) * l.lim.Every
	for k, b := range l.buckets {
		if now.Sub(b.last) >= full {
			delete(l.buckets, k)
		}
	}
}
