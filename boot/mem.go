package boot

import (
	"context"
	"fmt"
	"github.com/machina-metal/machina/macaddr"
	"net"
	"sync"
)

// MemLookup is an in-memory [Lookup] and [Enroller] keyed by canonical MAC,
// used by tests, the simulated lab and `machina sim`. Discovered MACs get
// lifecycle commissioning. Safe for concurrent use; the zero value is empty
// and usable.
type MemLookup struct {
	mu         sync.RWMutex
	m          map[string]Assignment
	discovered []Discovery
}

// Set stores a (replacing any entry for a.MAC). It returns an error wrapping
// [ErrInvalidMAC] for a bad MAC.
func (l *MemLookup) Set(a Assignment) error {
	if err := macaddr.Check(a.MAC); err != nil {
		return fmt.Errorf("set assignment: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]Assignment{}
	}
	l.m[a.MAC.String()] = a
	return nil
}

// Lookup implements [Lookup].
func (l *MemLookup) Lookup(_ context.Context, mac net.HardwareAddr) (Assignment, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	a, ok := l.m[mac.String()]
	if !ok {
		return Assignment{}, fmt.Errorf("lookup %s: %w", mac, ErrNotFound)
	}
	return a, nil
}

// Discovered implements [Enroller]: it records d once per MAC and assigns
// lifecycle commissioning.
func (l *MemLookup) Discovered(_ context.Context, d Discovery) (Assignment, error) {
	if err := macaddr.Check(d.MAC); err != nil {
		return Assignment{}, fmt.Errorf("discovered: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if a, ok := l.m[d.MAC.String()]; ok {
		return a, nil
	}
	if l.m == nil {
		l.m = map[string]Assignment{}
	}
	a := Assignment{MAC: d.MAC, Lifecycle: LifecycleCommissioning}
	l.m[d.MAC.String()] = a
	l.discovered = append(l.discovered, d)
	return a, nil
}

// DiscoveredMACs returns the discoveries recorded so far, oldest first.
func (l *MemLookup) DiscoveredMACs() []Discovery {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return append([]Discovery(nil), l.discovered...)
}
