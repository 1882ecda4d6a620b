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
// The MAC index is rebuilt when the store changes, so a DHCP packet costs a
// map lookup. Safe for concurrent use.
type BootIndex struct {
	st *state.Store

	mu    sync.RWMutex
	byMAC map[string]state.Server
	dirty bool
}

// NewBootIndex builds the index from st. Call Run to keep it fresh.
func NewBootIndex(st *state.Store) (*BootIndex, error) {
	b := &BootIndex{st: st}
	if err := b.rebuild(); err != nil {
		return nil, err
	}
	return b, nil
}

// Run marks the index stale whenever the store changes, until ctx is done.
func (b *BootIndex) Run(ctx context.Context) error {
	ch, stop := b.st.Notify()
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ch:
			b.mu.Lock()
			b.dirty = true
			b.mu.Unlock()
		}
	}
}

func (b *BootIndex) rebuild() error {
	snap, err := b.st.Snapshot()
	if err != nil {
		return fmt.Errorf("boot index: %w", err)
	}
	m := make(map[string]state.Server, len(snap.Servers))
	for _, s := range snap.Servers {
		if s.BootMAC != "" {
			m[s.BootMAC] = s
		}
	}
	b.mu.Lock()
	b.byMAC, b.dirty = m, false
	b.mu.Unlock()
	return nil
}

func (b *BootIndex) server(mac net.HardwareAddr) (state.Server, bool, error) {
	b.mu.RLock()
	dirty := b.dirty
	b.mu.RUnlock()
	if dirty {
		if err := b.rebuild(); err != nil {
			return state.Server{}, false, err
		}
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	s, ok := b.byMAC[boot.FormatMAC(mac)]
	return s, ok, nil
}

// Lookup implements boot.Lookup.
func (b *BootIndex) Lookup(_ context.Context, mac net.HardwareAddr) (boot.Assignment, error) {
	s, ok, err := b.server(mac)
	if err != nil {
		return boot.Assignment{}, err
	}
	if !ok {
		return boot.Assignment{}, fmt.Errorf("boot index: %s: %w", boot.FormatMAC(mac), boot.ErrNotFound)
	}
	mode := boot.ModeUEFI
	if s.BootMode == "bios" {
		mode = boot.ModeBIOS
	}
	return boot.Assignment{MAC: mac, Name: s.Name, Lifecycle: boot.Lifecycle(s.Lifecycle), Mode: mode}, nil
}

// purposeOf maps the iPXE script's token purposes to the store's.
func purposeOf(p string) (state.Purpose, error) {
	switch p {
	case ipxe.PurposeCommission:
		return state.PurposeReport, nil
	case ipxe.PurposeDeploy:
		return state.PurposePlan, nil
	}
	return "", fmt.Errorf("boot index: unknown token purpose %q", p)
}

// Issue implements boot.Tokens: a token for the server that owns mac.
func (b *BootIndex) Issue(_ context.Context, mac net.HardwareAddr, purpose string, ttl time.Duration) (string, error) {
	p, err := purposeOf(purpose)
	if err != nil {
		return "", err
	}
	s, ok, err := b.server(mac)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", fmt.Errorf("boot index: issue token for %s: %w", boot.FormatMAC(mac), boot.ErrNotFound)
	}
	tok, _, err := b.st.IssueToken(state.TokenSpec{Purpose: p, Server: s.Name, MAC: s.BootMAC, TTL: ttl})
	return tok, err
}

// Consume implements boot.Tokens.
func (b *BootIndex) Consume(_ context.Context, mac net.HardwareAddr, purpose, token string) error {
	p, err := purposeOf(purpose)
	if err != nil {
		return err
	}
	_, err = b.st.ConsumeToken(token, state.TokenClaim{Purpose: p, MAC: boot.FormatMAC(mac)})
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
