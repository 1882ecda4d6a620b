package boot

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"github.com/machina-metal/machina/macaddr"
	"net"
	"sync"
	"time"
)

// MemTokens is an in-memory [Tokens]: tokens are 32 random bytes
// (base64url, 43 characters), stored only as their SHA-256, bound to a MAC
// and a purpose, single-use and expiring. Used entries are kept until they
// expire so that a reuse reports [ErrTokenUsed] rather than [ErrTokenInvalid].
// The zero value is not usable; call [NewMemTokens]. Safe for concurrent use.
type MemTokens struct {
	mu      sync.Mutex
	entries map[[sha256.Size]byte]*tokenEntry
	now     func() time.Time
	sweepAt int // sweep expired entries when the map reaches this size
}

type tokenEntry struct {
	mac     string
	purpose string
	expires time.Time
	used    bool
}

// NewMemTokens returns an empty token store that reads the clock with
// time.Now (so testing/synctest controls it).
func NewMemTokens() *MemTokens {
	return &MemTokens{entries: map[[sha256.Size]byte]*tokenEntry{}, now: time.Now, sweepAt: 1024}
}

// Issue implements [Tokens]. ttl must be positive.
func (m *MemTokens) Issue(_ context.Context, mac net.HardwareAddr, purpose string, ttl time.Duration) (string, error) {
	if err := macaddr.Check(mac); err != nil {
		return "", fmt.Errorf("issue token: %w", err)
	}
	if ttl <= 0 {
		return "", fmt.Errorf("issue token: ttl %v is not positive", ttl)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", fmt.Errorf("issue token: %w", err)
	}
	tok := base64.RawURLEncoding.EncodeToString(raw[:])
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.entries) >= m.sweepAt { // amortised housekeeping: O(1) per Issue
		for k, e := range m.entries {
			if now.After(e.expires) {
				delete(m.entries, k)
			}
		}
		m.sweepAt = max(1024, 2*len(m.entries))
	}
	m.entries[sha256.Sum256([]byte(tok))] = &tokenEntry{mac: mac.String(), purpose: purpose, expires: now.Add(ttl)}
	return tok, nil
}

// Consume implements [Tokens].
func (m *MemTokens) Consume(_ context.Context, mac net.HardwareAddr, purpose, token string) error {
	h := sha256.Sum256([]byte(token))
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[h]
	if !ok {
		return fmt.Errorf("consume token: %w", ErrTokenInvalid)
	}
	if subtle.ConstantTimeCompare([]byte(e.mac), []byte(mac.String())) != 1 || e.purpose != purpose {
		return fmt.Errorf("consume token: %w: bound to another mac or purpose", ErrTokenInvalid)
	}
	if e.used {
		return fmt.Errorf("consume token: %w", ErrTokenUsed)
	}
	if now.After(e.expires) {
		return fmt.Errorf("consume token: %w", ErrTokenExpired)
	}
	e.used = true
	return nil
}
