package api

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/boot/ipxe"
	"github.com/machina-metal/machina/state"
)

// BootIndex adapts the state store to the boot servers: boot.Lookup (MAC →
// server, lifecycle, boot mode) and boot.Tokens (the ramdisk's single-use
// tokens, stored hashed in the store and bound to the server and its MAC).
// It keeps a MAC → server name index and reads the named server from the
// store on every lookup, so an answer never predates a change committed
// before the request (a machine that reboots the moment its deploy is
// recorded gets the deployed server's script, not the deploy ramdisk
// again), while a lookup costs one store read, not a scan of the fleet. A
// MAC the index does not hold, or that now names another server, is looked
// up with [state.Store.ServerByBootMAC] (the one record the store's decode
// cache notes for that MAC, else a byte scan of the records) and the index
// updated: every server registered after the index was built takes that
// path at its first netboot. Safe for concurrent use.
type BootIndex struct {
	st *state.Store

	mu      sync.RWMutex
	byMAC   map[string]string    // canonical boot MAC → server name
	unknown map[string]time.Time // MACs no server has, and when that was seen
	// facts caches what indexed read for a MAC, with the store's
	// ServersGen read before that read: while the generation is the same,
	// no server record changed and the facts are current (bbolt only).
	facts map[string]cachedFacts
}

type cachedFacts struct {
	f   bootFacts
	gen uint64
}

// maxCachedFacts bounds BootIndex.facts; past it the cache is reset.
const maxCachedFacts = 200_000

// unknownTTL is how long a MAC found on no server is answered "not found"
// without another scan: a flood of unknown MACs on the provisioning network
// (DHCP asks once per packet) then costs one scan per MAC per second, and a
// server registered meanwhile is found at its client's next retry.
const unknownTTL = time.Second

// NewBootIndex builds the index from st.
func NewBootIndex(st *state.Store) (*BootIndex, error) {
	b := &BootIndex{st: st, unknown: map[string]time.Time{}}
	if err := b.rebuild(); err != nil {
		return nil, err
	}
	return b, nil
}

// rebuild replaces the MAC index with one read from a store snapshot.
func (b *BootIndex) rebuild() error {
	snap, err := b.st.Snapshot()
	if err != nil {
		return fmt.Errorf("boot index: %w", err)
	}
	m := make(map[string]string, len(snap.Servers))
	for _, s := range snap.Servers {
		if s.BootMAC != "" {
			m[s.BootMAC] = s.Name
		}
	}
	b.mu.Lock()
	b.byMAC = m
	b.mu.Unlock()
	return nil
}

// bootFacts are the fields of a server the boot servers need, copied out
// of the store's decode cache (state.Store.ServerFunc) rather than a deep
// copy of the whole 736-byte Server per script request.
type bootFacts struct {
	Name, BootMAC, BootMode string
	Lifecycle               state.Lifecycle
	NeedsWipe               bool
	Deploy, Image           string // the allocation's, when there is one
}

func factsOf(s *state.Server) bootFacts {
	f := bootFacts{Name: s.Name, BootMAC: s.BootMAC, BootMode: s.BootMode, Lifecycle: s.Lifecycle, NeedsWipe: s.NeedsWipe}
	if s.Allocation != nil {
		f.Deploy, f.Image = s.Allocation.Deploy, s.Allocation.Image
	}
	return f
}

// server returns the server whose boot MAC is mac, read from the store now.
// With cached, a MAC found on no server within unknownTTL is not looked up
// again (Lookup only: a token is issued right after an auto-enrolment
// created the server).
func (b *BootIndex) server(mac net.HardwareAddr, cached bool) (bootFacts, bool, error) {
	key := mac.String()
	if f, ok, err := b.indexed(key); ok || err != nil {
		return f, ok, err
	}
	return b.unindexed(key, cached)
}

// unindexed is server's path for a MAC the index does not hold: a read of
// the store by boot MAC, cached as unknown when no server has it. It is
// its own function, kept out of line, because its state.Server copy needs
// a 2.4 KB stack frame, which server (on every script request's path, the
// index answering) no longer reserves: 0x160 bytes instead of 0xa58
// (go build -gcflags=-S). In a boot storm a deeper request goroutine's stack is
// grown by copying.
//
//go:noinline
func (b *BootIndex) unindexed(key string, cached bool) (bootFacts, bool, error) {
	now := time.Now()
	b.mu.RLock()
	seen, isUnknown := b.unknown[key]
	b.mu.RUnlock()
	if cached && isUnknown && now.Sub(seen) < unknownTTL {
		return bootFacts{}, false, nil
	}
	s, err := b.st.ServerByBootMAC(key)
	switch {
	case errors.Is(err, state.ErrNotFound):
		b.mu.Lock()
		if len(b.unknown) >= 4096 {
			clear(b.unknown)
		}
		b.unknown[key] = now
		b.mu.Unlock()
		return bootFacts{}, false, nil
	case err != nil:
		return bootFacts{}, false, fmt.Errorf("boot index: %w", err)
	}
	b.mu.Lock()
	b.byMAC[key] = s.Name
	delete(b.unknown, key)
	b.mu.Unlock()
	return factsOf(&s), true, nil
}

// indexed reads the server the index names for key; ok is false when the
// index has no entry or the server no longer has that boot MAC.
func (b *BootIndex) indexed(key string) (bootFacts, bool, error) {
	b.mu.RLock()
	name, ok := b.byMAC[key]
	b.mu.RUnlock()
	if !ok {
		return bootFacts{}, false, nil
	}
	gen, genOK := b.st.ServersGen()
	if genOK {
		b.mu.RLock()
		c, hit := b.facts[key]
		b.mu.RUnlock()
		if hit && c.gen == gen && c.f.Name == name {
			return c.f, c.f.BootMAC == key, nil
		}
	}
	var f bootFacts
	err := b.st.ServerFunc(name, func(s *state.Server) { f = factsOf(s) })
	switch {
	case errors.Is(err, state.ErrNotFound):
		return bootFacts{}, false, nil
	case err != nil:
		return bootFacts{}, false, fmt.Errorf("boot index: %w", err)
	}
	ok = f.BootMAC == key
	if genOK {
		b.mu.Lock()
		if b.facts == nil || len(b.facts) >= maxCachedFacts {
			b.facts = map[string]cachedFacts{}
		}
		b.facts[key] = cachedFacts{f: f, gen: gen}
		b.mu.Unlock()
	}
	return f, ok, nil
}

// Lookup implements boot.Lookup.
func (b *BootIndex) Lookup(_ context.Context, mac net.HardwareAddr) (boot.Assignment, error) {
	s, ok, err := b.server(mac, true)
	if err != nil {
		return boot.Assignment{}, err
	}
	if !ok {
		return boot.Assignment{}, fmt.Errorf("boot index: %s: %w", mac.String(), boot.ErrNotFound)
	}
	mode := boot.ModeUEFI
	if s.BootMode == "bios" {
		mode = boot.ModeBIOS
	}
	a := boot.Assignment{MAC: mac, Name: s.Name, Lifecycle: boot.Lifecycle(s.Lifecycle), Mode: mode,
		Wipe: s.Lifecycle == state.LifecycleReady && s.NeedsWipe}
	if s.Lifecycle == state.LifecycleDeploying {
		switch s.Deploy {
		case ipxe.InstallerAutoinstall, ipxe.InstallerKickstart:
			a.Installer, a.InstallerImage = s.Deploy, s.Image
		}
	}
	return a, nil
}

// purposeOf maps the iPXE script's token purposes to the store's.
func purposeOf(p string) (state.Purpose, error) {
	switch p {
	case ipxe.PurposeCommission:
		return state.PurposeReport, nil
	case ipxe.PurposeDeploy:
		return state.PurposePlan, nil
	case ipxe.PurposeWipe:
		return state.PurposeWipe, nil
	case ipxe.PurposeInstall:
		return state.PurposeInstall, nil
	}
	return "", fmt.Errorf("boot index: unknown token purpose %q", p)
}

// Issue implements boot.Tokens: a token for the server that owns mac.
func (b *BootIndex) Issue(_ context.Context, mac net.HardwareAddr, purpose string, ttl time.Duration) (string, error) {
	p, err := purposeOf(purpose)
	if err != nil {
		return "", err
	}
	// The handler calls Issue right after a Lookup of the same MAC in
	// the same request, which read the server and checked the index entry
	// against its boot MAC: the entry names the server without a second
	// store read (a read per script GET of a boot storm). A
	// server whose boot MAC moved in between gets a token bound to the
	// old MAC, which no request of the server's new machine can use (the
	// token's MAC and the lease address are checked at use).
	key := mac.String()
	b.mu.RLock()
	name, ok := b.byMAC[key]
	b.mu.RUnlock()
	if !ok {
		s, found, err := b.server(mac, false)
		if err != nil {
			return "", err
		}
		if !found {
			return "", fmt.Errorf("boot index: issue token for %s: %w", key, boot.ErrNotFound)
		}
		name, key = s.Name, s.BootMAC
	}
	// The install token is reusable (short-lived): the installer fetches
	// its kernel, initrd, ISO or tree and documents with it, some more than
	// once; every other boot token is single-use.
	tok, _, err := b.st.IssueToken(state.TokenSpec{Purpose: p, Server: name, MAC: key, TTL: ttl, Reusable: p == state.PurposeInstall,
		Heard: heardScript(purpose)})
	return tok, err
}

// Prepare implements boot.PreparedTokens over state.Store.PrepareToken:
// the token is minted into the store (hashed, bound to the server and
// its boot MAC) unless the server has a live one of that purpose, and
// its value kept in the store's memory for one Take.
func (b *BootIndex) Prepare(_ context.Context, mac net.HardwareAddr, purpose string, ttl time.Duration) (bool, error) {
	p, err := purposeOf(purpose)
	if err != nil {
		return false, err
	}
	s, found, err := b.server(mac, false)
	if err != nil {
		return false, err
	}
	if !found {
		return false, fmt.Errorf("boot index: prepare token for %s: %w", mac.String(), boot.ErrNotFound)
	}
	return b.st.PrepareToken(state.TokenSpec{Purpose: p, Server: s.Name, MAC: s.BootMAC, TTL: ttl, Reusable: p == state.PurposeInstall})
}

// Take implements boot.PreparedTokens over state.Store.TakeToken (no
// write); the server's LastHeard is noted as Issue notes it.
// Like Issue, it names the server from the index entry the request's
// Lookup just checked.
func (b *BootIndex) Take(_ context.Context, mac net.HardwareAddr, purpose string, minLeft time.Duration) (string, bool, error) {
	p, err := purposeOf(purpose)
	if err != nil {
		return "", false, err
	}
	key := mac.String()
	b.mu.RLock()
	name, ok := b.byMAC[key]
	b.mu.RUnlock()
	if !ok {
		return "", false, nil
	}
	return b.st.TakeToken(name, p, key, minLeft, heardScript(purpose))
}

// heardScript is the LastHeard a script request records.
func heardScript(purpose string) string { return "boot script fetched (" + purpose + ")" }

// Consume implements boot.Tokens.
func (b *BootIndex) Consume(_ context.Context, mac net.HardwareAddr, purpose, token string) error {
	p, err := purposeOf(purpose)
	if err != nil {
		return err
	}
	_, err = b.st.ConsumeToken(token, state.TokenClaim{Purpose: p, MAC: mac.String()})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, state.ErrTokenExpired):
		return fmt.Errorf("%w: %v", boot.ErrTokenExpired, err)
	case errors.Is(err, state.ErrTokenUsed):
		return fmt.Errorf("%w: %v", boot.ErrTokenUsed, err)
	default:
		return fmt.Errorf("%w: %v", boot.ErrTokenInvalid, err)
	}
}
