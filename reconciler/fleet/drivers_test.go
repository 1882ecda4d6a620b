package fleet

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/machina-metal/machina/bmc"
)

// fakeDriver satisfies bmc.Driver for the cache tests; no method is called.
type fakeDriver struct {
	bmc.Driver
	name string
}

// TestStoreDriversEviction: the cache keeps at most MaxDrivers, dropping the
// least recently used first, and drops drivers idle past IdleTimeout at the
// next sweep.
func TestStoreDriversEviction(t *testing.T) {
	d := &StoreDrivers{MaxDrivers: 3, IdleTimeout: 10 * time.Minute, drivers: map[string]cachedDriver{}}
	t0 := time.Now()
	d.lastSweep = t0
	var evicted []string
	for i := range 5 {
		now := t0.Add(time.Duration(i) * time.Second)
		for _, drv := range d.evictLocked(now) {
			evicted = append(evicted, drv.(fakeDriver).name)
		}
		name := fmt.Sprintf("s%d", i)
		d.drivers[name] = cachedDriver{drv: fakeDriver{name: name}, used: now}
	}
	if fmt.Sprint(evicted) != "[s0 s1]" || len(d.drivers) != 3 {
		t.Fatalf("evicted %v, kept %d; want [s0 s1] and 3", evicted, len(d.drivers))
	}
	// s2 used again: s3 is now the least recently used.
	c := d.drivers["s2"]
	c.used = t0.Add(10 * time.Second)
	d.drivers["s2"] = c
	if got := d.evictLocked(t0.Add(11 * time.Second)); len(got) != 1 || got[0].(fakeDriver).name != "s3" {
		t.Fatalf("evicted %v, want s3", got)
	}
	// Eleven minutes later every driver is idle and the sweep takes them all.
	if got := d.evictLocked(t0.Add(21 * time.Minute)); len(got) != 2 || len(d.drivers) != 0 {
		t.Fatalf("idle sweep evicted %d, kept %d; want 2 and 0", len(got), len(d.drivers))
	}
}

// slowCloser is a driver whose Close takes d (or until ctx is done).
type slowCloser struct {
	bmc.Driver
	d      time.Duration
	closed *atomic.Int32
}

func (s slowCloser) Close(ctx context.Context) error {
	select {
	case <-time.After(s.d):
		s.closed.Add(1)
	case <-ctx.Done():
	}
	return nil
}

// TestStoreDriversCloseBounded: Close logs out of drivers in parallel
// (40 one-second closes take two seconds, not forty) and returns when ctx
// is done even if a BMC never answers; the cache is empty afterwards.
func TestStoreDriversCloseBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var closed atomic.Int32
		d := &StoreDrivers{drivers: map[string]cachedDriver{}}
		for i := range 40 {
			d.drivers[fmt.Sprintf("s%d", i)] = cachedDriver{drv: slowCloser{d: time.Second, closed: &closed}}
		}
		start := time.Now()
		d.Close(context.Background())
		if took := time.Since(start); took != 2*time.Second || closed.Load() != 40 || len(d.drivers) != 0 {
			t.Errorf("40 closes of 1 s: took %v, closed %d, left %d; want 2s, 40, 0", took, closed.Load(), len(d.drivers))
		}

		d.drivers["silent"] = cachedDriver{drv: slowCloser{d: time.Hour, closed: &closed}}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		start = time.Now()
		d.Close(ctx)
		if took := time.Since(start); took != 3*time.Second {
			t.Errorf("a silent BMC held Close for %v, want the 3 s context", took)
		}
		synctest.Wait()
	})
}
