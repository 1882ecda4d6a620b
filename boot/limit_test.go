package boot

import (
	"testing"
	"time"
)

// TestLimiter: each key has its own bucket of Burst tokens, refilled at
// one per Every; a refusal says how long until the next token; idle full
// buckets are dropped past maxBuckets.
func TestLimiter(t *testing.T) {
	now := time.Unix(1000, 0)
	l := NewLimiter(Limit{Burst: 3, Every: 100 * time.Millisecond})
	l.now = func() time.Time { return now }
	for i := range 3 {
		if ok, _ := l.Allow("a"); !ok {
			t.Fatalf("request %d of a refused within the burst", i+1)
		}
	}
	ok, wait := l.Allow("a")
	if ok || wait != 100*time.Millisecond {
		t.Fatalf("4th request of a = %v, wait %v; want refused, 100ms", ok, wait)
	}
	if ok, _ := l.Allow("b"); !ok {
		t.Fatal("b refused: keys share a bucket")
	}
	now = now.Add(50 * time.Millisecond)
	if ok, wait := l.Allow("a"); ok || wait != 50*time.Millisecond {
		t.Fatalf("a after 50ms = %v, wait %v; want refused, 50ms", ok, wait)
	}
	now = now.Add(50 * time.Millisecond)
	if ok, _ := l.Allow("a"); !ok {
		t.Fatal("a refused after a token's refill time")
	}
	if ok, _ := l.Allow("a"); ok {
		t.Fatal("a allowed twice after one token's refill time")
	}
	now = now.Add(time.Hour)
	for i := range 3 {
		if ok, _ := l.Allow("a"); !ok {
			t.Fatalf("request %d of a refused after an hour idle: the bucket holds more than Burst?", i+1)
		}
	}
	if ok, _ := l.Allow("a"); ok {
		t.Fatal("an idle bucket filled beyond Burst")
	}

	// Past maxBuckets, full buckets are swept; a's, empty, stays.
	for i := range maxBuckets {
		l.buckets[string(rune(0x10000+i))] = bucket{tokens: 3, last: now.Add(-time.Hour)}
	}
	l.Allow("c")
	if _, ok := l.buckets["a"]; !ok || len(l.buckets) > 3 {
		t.Fatalf("after the sweep: %d buckets, a kept %v; want a and c (b is full and idle)", len(l.buckets), ok)
	}
}
