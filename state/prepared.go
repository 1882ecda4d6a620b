package state

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Prepared boot tokens: a boot storm's script requests each
// minted a token, a write and a share of an fsync on the request path
// (about two thirds of the script handler's CPU in BenchmarkBootScriptStore).
// The executor knows a machine will ask for one before the machine does:
// it netboots the machine into the ramdisk, and the firmware's PXE
// request follows tens of seconds later. So the executor prepares the
// token then (PrepareToken), the store keeps the value in memory, and the
// script request takes it (TakeToken) without a write. A store reopened
// after a restart, or a server netbooted by someone else, has nothing
// prepared: the script request mints inline as before.

// preparedCap bounds the prepared values kept in memory; at the cap a
// Prepare drops the expired ones first and then refuses (the script
// request mints inline).
const preparedCap = 1 << 17

type preparedToken struct {
	value   string
	mac     string
	expires time.Time
}

// preparedTokens holds the values PrepareToken minted, keyed by liveKey,
// until one TakeToken hands each out. Never persisted, never logged.
type preparedTokens struct {
	mu sync.Mutex
	m  map[string]preparedToken
}

// PrepareToken mints a token for spec (as IssueToken: hashed in the store,
// bound to the server and MAC) only when the server has no live token of
// that purpose (unused and unexpired), and keeps its value in memory for
// one TakeToken. It never revokes a token: one a machine may already hold
// (fetched before a controller restart, or by a machine that was booted
// outside the executor) stays valid, and the machine's next script
// request mints inline as before. prepared is false when a live token
// existed. spec.Heard is ignored (the machine has said nothing yet).
// Errors: an invalid spec (ErrInvalid), the store's write errors.
func (s *Store) PrepareToken(spec TokenSpec) (prepared bool, err error) {
	spec, err = checkSpec(spec)
	if err != nil {
		return false, fmt.Errorf("state: prepare token: %w", err)
	}
	spec.Heard = ""
	key := string(liveKey(spec.Server, spec.Purpose))
	if !s.prepared.room(s.nowUTC()) {
		return false, nil
	}
	var value string
	err = s.grouped(func(tx kvTx) error {
		value, prepared = "", false
		if live, _ := s.liveTokenTx(tx, spec.Server, spec.Purpose); live != nil {
			return nil
		}
		v, t, err := s.issueTokenTx(tx, spec)
		if err != nil {
			return err
		}
		// Kept inside the transaction: writers serialise, so a mint of
		// the same server and purpose committed after this one (which
		// forgets the key in issueTokenTx) always comes after this
		// store; a run that does not commit is removed below.
		value, prepared = v, true
		s.prepared.put(key, preparedToken{value: v, mac: t.MAC, expires: t.ExpiresAt})
		return nil
	})
	if err != nil {
		if value != "" {
			s.prepared.forgetValue(key, value)
		}
		return false, fmt.Errorf("state: prepare token: %w", err)
	}
	return prepared, nil
}

func (p *preparedTokens) put(key string, t preparedToken) {
	p.mu.Lock()
	if p.m == nil {
		p.m = map[string]preparedToken{}
	}
	p.m[key] = t
	p.mu.Unlock()
}

// forget drops the value prepared for key (a liveKey): called by every
// transaction that mints or revokes that server's token of that purpose,
// committed or not (forgetting is always safe: the script request then
// mints inline).
func (p *preparedTokens) forget(key string) {
	p.mu.Lock()
	delete(p.m, key)
	p.mu.Unlock()
}

// forgetServer drops every value prepared for server.
func (p *preparedTokens) forgetServer(server string) {
	p.mu.Lock()
	for k := range p.m {
		if strings.HasPrefix(k, server+"\x00") {
			delete(p.m, k)
		}
	}
	p.mu.Unlock()
}

// forgetValue drops key's value if it is still value.
func (p *preparedTokens) forgetValue(key, value string) {
	p.mu.Lock()
	if p.m[key].value == value {
		delete(p.m, key)
	}
	p.mu.Unlock()
}

// room reports whether another prepared value may be kept, dropping the
// expired ones when the map is at its cap.
func (p *preparedTokens) room(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.m) < preparedCap {
		return true
	}
	for k, v := range p.m {
		if !now.Before(v.expires) {
			delete(p.m, k)
		}
	}
	return len(p.m) < preparedCap
}

// TakeToken hands out the value PrepareToken minted for server and
// purpose, once: ok is true when it is still that server's live token
// (not revoked, replaced or used), is bound to mac (any notation; ""
// skips the check) and has at least minLeft of its life left. The value
// is forgotten either way, so a second request for the same server mints
// (IssueToken, revoking this one) as every script request did before.
// With heard set, the server's LastHeard is noted as IssueToken notes it.
// No write, no fsync; on bbolt no read either (see below), on etcd one
// read transaction. Errors: the store's read errors (nothing is handed
// out).
func (s *Store) TakeToken(server string, purpose Purpose, mac string, minLeft time.Duration, heard string) (value string, ok bool, err error) {
	key := string(liveKey(server, purpose))
	s.prepared.mu.Lock()
	p, found := s.prepared.m[key]
	if found {
		delete(s.prepared.m, key)
	}
	s.prepared.mu.Unlock()
	if !found {
		return "", false, nil
	}
	if mac != "" {
		m, err := normalizeMAC(mac)
		if err != nil {
			return "", false, fmt.Errorf("state: take token: %w", err)
		}
		if m != p.mac {
			return "", false, nil
		}
	}
	if p.expires.Sub(s.nowUTC()) < minLeft {
		return "", false, nil
	}
	// bbolt: this process is the file's only writer (flock), and every
	// mint or revocation of this server and purpose forgot the value
	// inside its transaction (issueTokenTx, RevokeTokens); a value still
	// here was never handed out, so never used, and only the expiry,
	// checked above, can have ended it. etcd: another controller may
	// have minted or revoked since, so the store is read.
	if s.bdb == nil {
		h := sha256.Sum256([]byte(p.value))
		live := false
		err = s.view(func(tx kvTx) error {
			t, th := s.liveTokenTx(tx, server, purpose)
			live = t != nil && bytes.Equal(th, h[:]) && t.MAC == p.mac
			return nil
		})
		if err != nil {
			return "", false, fmt.Errorf("state: take token: %w", err)
		}
		if !live {
			return "", false, nil
		}
	}
	if heard != "" {
		s.NoteHeard(server, heard)
	}
	return p.value, true, nil
}

// liveTokenTx returns server's live token of purpose (the one token_live
// names, if it is still stored, unused and unexpired) and its hash; nil
// when there is none.
func (s *Store) liveTokenTx(tx kvTx, server string, purpose Purpose) (*Token, []byte) {
	h := tx.Bucket(bucketTokenLive).Get(liveKey(server, purpose))
	if h == nil {
		return nil, nil
	}
	data := tx.Bucket(bucketTokens).Get(h)
	if data == nil {
		return nil, nil
	}
	var t Token
	if json.Unmarshal(data, &t) != nil {
		return nil, nil
	}
	if !s.nowUTC().Before(t.ExpiresAt) || (!t.Reusable && t.Uses > 0) {
		return nil, nil
	}
	return &t, append([]byte(nil), h...)
}
