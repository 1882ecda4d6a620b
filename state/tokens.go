package state

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"
)

// Purpose is what a machine token may be used for. A token is accepted only
// for its own purpose.
type Purpose string

// Token purposes (docs/architecture.md "Flow" and "Security").
const (
	PurposeBoot   Purpose = "boot"   // GET /boot/... scripts for one boot
	PurposeReport Purpose = "report" // POST of a commissioning report
	PurposePlan   Purpose = "plan"   // GET of a deploy plan
	PurposeImage  Purpose = "image"  // GET of an image (usually Reusable, for Range requests)
	PurposeJoin   Purpose = "join"   // first-boot enrolment over the join listener
	PurposeDone   Purpose = "done"   // POST of a deploy outcome by the ramdisk
	// PurposeWipe: GET of a release wipe plan by the ramdisk (wipe mode).
	PurposeWipe Purpose = "wipe"
	// PurposeWiped: POST of a release wipe outcome by the ramdisk.
	PurposeWiped Purpose = "wiped"
	// PurposeEraseProgress: a release wipe's erase progress reports
	// (reusable, for the length of the wipe).
	PurposeEraseProgress Purpose = "erase-progress"
	// PurposeInstall: GETs of an installer's documents (autoinstall
	// user-data and meta-data, kickstart); usually Reusable, since the
	// installer fetches several documents and may retry.
	PurposeInstall Purpose = "install"
	// PurposeInstalled: the installer's single completion callback.
	PurposeInstalled Purpose = "installed"
)

// Valid reports whether p is one of the purposes above.
func (p Purpose) Valid() bool {
	switch p {
	case PurposeBoot, PurposeReport, PurposePlan, PurposeImage, PurposeJoin, PurposeDone, PurposeWipe, PurposeWiped, PurposeEraseProgress, PurposeInstall, PurposeInstalled:
		return true
	}
	return false
}

// DefaultTokenTTL is the lifetime of a machine token whose spec has no TTL.
const DefaultTokenTTL = 30 * time.Minute

// TokenSpec describes a machine token to issue.
type TokenSpec struct {
	Purpose Purpose
	Server  string        // the server it is bound to (RFC 1123 label); required
	MAC     string        // optional: the MAC it is bound to (any notation macaddr.Parse reads)
	TTL     time.Duration // lifetime; zero means DefaultTokenTTL
	// Reusable tokens are accepted any number of times until they expire
	// (short-lived rather than single-use), e.g. image downloads resumed
	// with Range requests. Default: single-use.
	Reusable bool
	// Heard, when set, is recorded as the server's LastHeard (now) once
	// the token is issued, written behind as NoteHeard writes it (within
	// HeardDelay, outside the token's transaction): the machine asked
	// for it.
	Heard string
}

// Token is a machine token's stored record. The token value itself is never
// stored, only its SHA-256; ID is the first 12 hex digits of that hash, safe
// to log.
type Token struct {
	ID        string    `json:"id"`
	Purpose   Purpose   `json:"purpose"`
	Server    string    `json:"server"`
	MAC       string    `json:"mac,omitempty"`
	IssuedAt  time.Time `json:"issuedAt"`
	ExpiresAt time.Time `json:"expiresAt"`
	Reusable  bool      `json:"reusable,omitempty"`
	Uses      int       `json:"uses"`
	UsedAt    time.Time `json:"usedAt,omitzero"`
	// Request is the hex SHA-256 fingerprint of the request that used a
	// single-use token through [Store.UseToken] (its requester and body);
	// a retry with the same fingerprint gets Answer again.
	Request string `json:"request,omitempty"`
	// Answer is what that use was answered, recorded in the transaction
	// that used the token; nil for answers that are re-made on a retry.
	Answer *Answer `json:"answer,omitempty"`
}

// TokenClaim is what a request presenting a token says about itself.
// Purpose is always checked; Server is checked when non-empty; MAC is
// checked when both the claim and the token carry one (a token issued
// before the MAC was known binds to the server only).
type TokenClaim struct {
	Purpose Purpose
	Server  string
	MAC     string
}

// newSecret returns a random 256-bit token value with prefix, and its hash.
func newSecret(prefix string) (string, [32]byte, error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", [32]byte{}, err
	}
	v := prefix + base64.RawURLEncoding.EncodeToString(raw)
	return v, sha256.Sum256([]byte(v)), nil
}

func tokenID(h [32]byte) string { return hex.EncodeToString(h[:6]) }

// IssueToken creates a machine token and returns its value (43 URL-safe
// characters, shown once, never stored) and its record. Concurrent calls
// share commits (one fsync for all that queued during the previous
// commit; a lone call commits at once). Errors: ErrInvalid.
func (s *Store) IssueToken(spec TokenSpec) (string, Token, error) {
	spec, err := checkSpec(spec)
	if err != nil {
		return "", Token{}, fmt.Errorf("state: issue token: %w", err)
	}
	var value string
	var t Token
	// Grouped: concurrent mints (a boot storm's script GETs, one token
	// each) share one commit and fsync; a lone mint commits at once. The
	// function may run again (a new secret each time): the last run is
	// what was committed, and what is returned.
	err = s.grouped(func(tx kvTx) error {
		var err error
		value, t, err = s.issueTokenTx(tx, spec)
		return err
	})
	if err != nil {
		return "", Token{}, fmt.Errorf("state: issue token: %w", err)
	}
	if spec.Heard != "" {
		s.NoteHeard(spec.Server, spec.Heard)
	}
	return value, t, nil
}

// checkSpec validates spec and fills its defaults.
func checkSpec(spec TokenSpec) (TokenSpec, error) {
	if !spec.Purpose.Valid() {
		return spec, fmt.Errorf("purpose %q: %w", spec.Purpose, ErrInvalid)
	}
	if err := checkName("server", spec.Server); err != nil {
		return spec, err
	}
	if spec.MAC != "" {
		m, err := normalizeMAC(spec.MAC)
		if err != nil {
			return spec, err
		}
		spec.MAC = m
	}
	if spec.TTL <= 0 {
		spec.TTL = DefaultTokenTTL
	}
	return spec, nil
}

// liveKey is the token_live key of server's token for purpose.
func liveKey(server string, p Purpose) []byte { return []byte(server + "\x00" + string(p)) }

// issueTokenTx stores a new token for a checked spec and revokes the
// previous token of the same server and purpose: one live token per
// purpose per server, so a token handed out earlier (a script fetched
// twice, a plan fetched again) stops working the moment a new one exists.
func (s *Store) issueTokenTx(tx kvTx, spec TokenSpec) (string, Token, error) {
	value, h, err := newSecret("")
	if err != nil {
		return "", Token{}, err
	}
	now := s.nowUTC()
	t := Token{ID: tokenID(h), Purpose: spec.Purpose, Server: spec.Server, MAC: spec.MAC,
		IssuedAt: now, ExpiresAt: now.Add(spec.TTL), Reusable: spec.Reusable}
	data, err := json.Marshal(&t)
	if err != nil {
		return "", Token{}, err
	}
	s.prepared.forget(string(liveKey(spec.Server, spec.Purpose)))
	live := tx.Bucket(bucketTokenLive)
	if prev := live.Get(liveKey(spec.Server, spec.Purpose)); prev != nil {
		if err := tx.Bucket(bucketTokens).Delete(prev); err != nil {
			return "", Token{}, err
		}
	}
	if err := live.Put(liveKey(spec.Server, spec.Purpose), h[:]); err != nil {
		return "", Token{}, err
	}
	return value, t, tx.Bucket(bucketTokens).Put(h[:], data)
}

// ConsumeToken checks value against claim and, for a single-use token,
// marks it used, atomically: of any number of concurrent calls with the
// same single-use value exactly one succeeds. Refusals return
// ErrTokenUnknown, ErrTokenExpired, ErrTokenUsed or ErrTokenMismatch, and
// each writes an EventTokenRefused event (naming the token ID, never the
// value) in the same transaction.
func (s *Store) ConsumeToken(value string, claim TokenClaim) (Token, error) {
	return s.useToken(value, claim, true)
}

// CheckToken validates a token like ConsumeToken but does not use it up:
// for requests a single-use token authorises any number of times before
// its one consuming request (the commissioning throughput test's payload
// GETs before the report). Refusals leave an event like ConsumeToken's.
func (s *Store) CheckToken(value string, claim TokenClaim) (Token, error) {
	return s.useToken(value, claim, false)
}

func (s *Store) useToken(value string, claim TokenClaim, consume bool) (Token, error) {
	if claim.MAC != "" {
		m, err := normalizeMAC(claim.MAC)
		if err != nil {
			return Token{}, fmt.Errorf("state: consume token: %w", err)
		}
		claim.MAC = m
	}
	h := sha256.Sum256([]byte(value))
	if !s.tokenKnown(h) {
		s.unknownTokens.Add(1)
		return Token{}, fmt.Errorf("state: consume token: %w", ErrTokenUnknown)
	}
	var out Token
	var refused error
	var refusedServer, refusedMsg string
	err := s.update(func(tx kvTx) error {
		refused = nil
		b := tx.Bucket(bucketTokens)
		data := b.Get(h[:])
		refuse := func(t Token, why error) error {
			refused = why
			server := t.Server
			if server == "" && tx.Bucket(bucketServers).Get([]byte(claim.Server)) != nil {
				// Only a registered server: claimed names must not grow the index.
				server = claim.Server
			}
			// Paced, after the rollback (refusals.go): no write per refusal.
			refusedServer, refusedMsg = server, fmt.Sprintf("%s token %s refused: %v", claim.Purpose, tokenOrUnknown(t.ID), why)
			return errRollback
		}
		if data == nil {
			return refuse(Token{}, ErrTokenUnknown)
		}
		var t Token
		if err := json.Unmarshal(data, &t); err != nil {
			return fmt.Errorf("decode token %s: %w", tokenID(h), err)
		}
		now := s.nowUTC()
		switch {
		case subtle.ConstantTimeCompare([]byte(t.Purpose), []byte(claim.Purpose)) != 1,
			claim.Server != "" && claim.Server != t.Server,
			claim.MAC != "" && t.MAC != "" && claim.MAC != t.MAC:
			return refuse(t, ErrTokenMismatch)
		case !now.Before(t.ExpiresAt):
			return refuse(t, ErrTokenExpired)
		case !t.Reusable && t.Uses > 0:
			return refuse(t, ErrTokenUsed)
		}
		if !consume {
			out = t
			return errRollback // a check writes nothing
		}
		t.Uses++
		t.UsedAt = now
		out = t
		data, err := json.Marshal(&t)
		if err != nil {
			return err
		}
		return b.Put(h[:], data)
	})
	err = rolledBack(err)
	if refused != nil {
		s.noteRefusal(refusedServer, EventTokenRefused, refusalReasonOf(refused), refusedMsg)
	}
	if err != nil {
		return Token{}, fmt.Errorf("state: consume token: %w", err)
	}
	if refused != nil {
		return Token{}, fmt.Errorf("state: consume token: %w", refused)
	}
	return out, nil
}

// tokenKnown reports whether a machine token with hash h exists, in a
// read-only transaction: a value that names no token (a guess, a flood)
// is refused without a write, an fsync or an event; it is counted
// (UnknownTokenRefusals, machina_machine_unknown_tokens_total).
func (s *Store) tokenKnown(h [32]byte) bool {
	known := true
	err := s.view(func(tx kvTx) error {
		known = tx.Bucket(bucketTokens).Get(h[:]) != nil
		return nil
	})
	if err != nil {
		// A read error (etcd unreachable: Get then returns nil inside
		// the view) says nothing about the token: let the write
		// transaction decide, and fail with the store's error.
		return true
	}
	return known
}

// UnknownTokenRefusals is how many machine requests presented a token
// value that names no token (never issued, revoked, or pruned) since the
// store was opened. They write nothing.
func (s *Store) UnknownTokenRefusals() int64 { return s.unknownTokens.Load() }

func tokenOrUnknown(id string) string {
	if id == "" {
		return "(unknown)"
	}
	return id
}

// RevokeTokens deletes the machine tokens bound to server, for one purpose
// or for all when purpose is empty, and returns how many were deleted.
func (s *Store) RevokeTokens(server string, purpose Purpose) (int, error) {
	n := 0
	err := s.update(func(tx kvTx) error {
		// Inside the transaction (writers serialise): a value prepared
		// before it is forgotten, one prepared after it is a new token.
		if purpose == "" {
			s.prepared.forgetServer(server)
		} else {
			s.prepared.forget(string(liveKey(server, purpose)))
		}
		b := tx.Bucket(bucketTokens)
		var dead [][]byte
		err := b.ForEach(func(k, v []byte) error {
			var t Token
			if err := json.Unmarshal(v, &t); err != nil {
				return fmt.Errorf("decode token: %w", err)
			}
			if t.Server == server && (purpose == "" || t.Purpose == purpose) {
				dead = append(dead, append([]byte(nil), k...))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range dead {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		n = len(dead)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("state: revoke tokens %s: %w", server, err)
	}
	return n, nil
}

// pruneTokens deletes expired machine tokens inside tx.
func (s *Store) pruneTokens(tx kvTx) (int, error) { return s.pruneTokensMax(tx, 0) }

// pruneTokensMax deletes up to max (≤0: every) expired machine tokens.
func (s *Store) pruneTokensMax(tx kvTx, max int) (int, error) {
	now := s.nowUTC()
	var dead [][]byte
	err := tx.Bucket(bucketTokens).ForEach(func(k, v []byte) error {
		var t Token
		if err := json.Unmarshal(v, &t); err != nil {
			return fmt.Errorf("decode token: %w", err)
		}
		if !now.Before(t.ExpiresAt) && (max <= 0 || len(dead) < max) {
			dead = append(dead, append([]byte(nil), k...))
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, k := range dead {
		if err := tx.Bucket(bucketTokens).Delete(k); err != nil {
			return 0, err
		}
	}
	return len(dead), nil
}
