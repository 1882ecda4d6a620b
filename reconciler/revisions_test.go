package reconciler

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/inventory"
)

// fakeRevisions is a Revisions whose answer the test sets.
type fakeRevisions struct {
	mu      sync.Mutex
	inv     *inventory.Inventory
	digest  string
	invalid bool
	changed chan struct{}
}

func (f *fakeRevisions) DesiredRevision() (*inventory.Inventory, string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inv, f.digest, f.invalid
}

func (f *fakeRevisions) Changed() <-chan struct{} { return f.changed }

func (f *fakeRevisions) set(inv *inventory.Inventory, digest string, invalid bool) {
	f.mu.Lock()
	f.inv, f.digest, f.invalid = inv, digest, invalid
	f.mu.Unlock()
	f.changed <- struct{}{}
}

// TestFollow: the executor takes desired state only through Revisions:
// a new good revision becomes desired and reaches onNew once; the same
// digest again does not; an invalid newest revision holds deploys and
// keeps the last good one desired.
func TestFollow(t *testing.T) {
	c, err := New(Config{Store: openEnrolStore(t), Drivers: driverFunc(nil), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	revs := &fakeRevisions{changed: make(chan struct{})}
	news := make(chan *inventory.Inventory, 4)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); c.Follow(ctx, revs, func(inv *inventory.Inventory) { news <- inv }) }()

	a, b := &inventory.Inventory{Digest: "a"}, &inventory.Inventory{Digest: "b"}
	revs.set(a, "a", false)
	if got := <-news; got != a || c.Desired() != a || c.deploysHeld() {
		t.Fatalf("first revision: onNew %v, desired %v, held %v", got, c.Desired(), c.deploysHeld())
	}
	revs.set(a, "a", true) // the newest is invalid: hold, keep a
	revs.set(a, "a", true) // (a second change: the first was applied)
	if c.Desired() != a || !c.deploysHeld() {
		t.Errorf("invalid newest: desired %v, held %v; want a and held", c.Desired(), c.deploysHeld())
	}
	revs.set(b, "b", false)
	select {
	case got := <-news:
		if got != b {
			t.Errorf("onNew %v, want b", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no onNew for revision b")
	}
	revs.set(b, "b", false)
	revs.set(b, "b", false)
	if len(news) != 0 || c.Desired() != b || c.deploysHeld() {
		t.Errorf("same digest again: %d onNew, desired %v, held %v", len(news), c.Desired(), c.deploysHeld())
	}
	cancel()
	<-done
}
