package controller

import (
	"fmt"
	"testing"
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
