package state

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"time"
)

// bucketEnrolment holds enrolment tokens for the join listener:
// sha256(token) → EnrolmentToken JSON. Created on first use, so files
// written before it existed need no migration.
var bucketEnrolment = []byte("enrolment_tokens")

// EnrolmentToken is a single-use join token's stored record. Like machine
// tokens, only the SHA-256 of the value is stored; ID (12 hex digits of it)
// is safe to log. Payload is opaque to state: the join package stores the
// site, rack, tags, networks, storage pools and required checks in it.
type EnrolmentToken struct {
	ID        string          `json:"id"`
	IssuedAt  time.Time       `json:"issuedAt"`
	ExpiresAt time.Time       `json:"expiresAt"`
	IssuedBy  string          `json:"issuedBy,omitempty"`
	UsedAt    time.Time       `json:"usedAt,omitzero"`
	UsedBy    string          `json:"usedBy,omitempty"` // host name that consumed it
	Payload   json.RawMessage `json:"payload,omitempty"`
}

// IssueEnrolmentToken stores a single-use enrolment token valid for ttl
// (which must be positive) carrying payload (JSON, at most 64 KiB), and
// returns its value (43 URL-safe characters prefixed "mj_", shown once,
// never stored) and record. Errors: ErrInvalid.
func (s *Store) IssueEnrolmentToken(ttl time.Duration, payload json.RawMessage, actor string) (string, EnrolmentToken, error) {
	if ttl <= 0 {
		return "", EnrolmentToken{}, fmt.Errorf("state: issue enrolment token: ttl %s: %w", ttl, ErrInvalid)
	}
	if len(payload) > 64<<10 || (len(payload) > 0 && !json.Valid(payload)) {
		return "", EnrolmentToken{}, fmt.Errorf("state: issue enrolment token: payload is not JSON of at most 64 KiB: %w", ErrInvalid)
	}
	value, h, err := newSecret("mj_")
	if err != nil {
		return "", EnrolmentToken{}, fmt.Errorf("state: issue enrolment token: %w", err)
	}
	now := s.nowUTC()
	t := EnrolmentToken{ID: tokenID(h), IssuedAt: now, ExpiresAt: now.Add(ttl), IssuedBy: actor, Payload: payload}
	err = s.update(func(tx kvTx) error {
		b, err := tx.CreateBucketIfNotExists(bucketEnrolment)
		if err != nil {
			return err
		}
		if s.enrolPruneDue(now) {
			if err := pruneEnrolment(b, now); err != nil {
				return err
			}
		}
		data, err := json.Marshal(&t)
		if err != nil {
			return err
		}
		return b.Put(h[:], data)
	})
	if err != nil {
		return "", EnrolmentToken{}, fmt.Errorf("state: issue enrolment token: %w", err)
	}
	return value, t, nil
}

// ConsumeEnrolmentToken marks the token used by host and returns its
// record, atomically: of concurrent calls with one value exactly one
// succeeds. Refusals return ErrTokenUnknown, ErrTokenExpired or
// ErrTokenUsed and write an EventTokenRefused event naming the token ID
// (never the value).
func (s *Store) ConsumeEnrolmentToken(value, host string) (EnrolmentToken, error) {
	h := sha256.Sum256([]byte(value))
	var out EnrolmentToken
	var refused error
	var refusedMsg string
	err := s.update(func(tx kvTx) error {
		refused = nil
		b, err := tx.CreateBucketIfNotExists(bucketEnrolment)
		if err != nil {
			return err
		}
		refuse := func(id string, why error) error {
			refused = why
			// Paced, after the rollback (refusals.go): no write per refusal.
			refusedMsg = fmt.Sprintf("enrolment token %s refused: %v", tokenOrUnknown(id), why)
			return errRollback
		}
		data := b.Get(h[:])
		if data == nil {
			return refuse("", ErrTokenUnknown)
		}
		var t EnrolmentToken
		if err := json.Unmarshal(data, &t); err != nil {
			return fmt.Errorf("decode enrolment token %s: %w", tokenID(h), err)
		}
		now := s.nowUTC()
		switch {
		case !t.UsedAt.IsZero():
			return refuse(t.ID, ErrTokenUsed)
		case !now.Before(t.ExpiresAt):
			return refuse(t.ID, ErrTokenExpired)
		}
		t.UsedAt, t.UsedBy = now, host
		out = t
		data, err = json.Marshal(&t)
		if err != nil {
			return err
		}
		return b.Put(h[:], data)
	})
	err = rolledBack(err)
	if refused != nil {
		s.noteRefusal("", EventTokenRefused, refusalReasonOf(refused), refusedMsg)
	}
	if err != nil {
		return EnrolmentToken{}, fmt.Errorf("state: consume enrolment token: %w", err)
	}
	if refused != nil {
		return EnrolmentToken{}, fmt.Errorf("state: consume enrolment token: %w", refused)
	}
	return out, nil
}

// enrolmentPruneEvery is how often (store clock) an issue prunes expired
// enrolment tokens: pruning decodes every stored token, and a fleet's
// deploys issue one token each, so pruning at every issue made a wave of
// n deploys decode about n²/2 tokens. A token is then deleted between 24
// and 25 hours after it expired.
const enrolmentPruneEvery = time.Hour

// enrolPruneDue reports whether an issue at now prunes (the first issue of
// the process, or enrolmentPruneEvery after the last that did, or the
// clock went back), and if so marks now as the last. The mark is kept
// when the issue's transaction then fails: pruning is housekeeping, and
// the next due issue does it.
func (s *Store) enrolPruneDue(now time.Time) bool {
	last := s.enrolPrunedAt.Load()
	n := now.UnixNano()
	if last != 0 && n >= last && n-last < int64(enrolmentPruneEvery) {
		return false
	}
	return s.enrolPrunedAt.CompareAndSwap(last, n)
}

// pruneEnrolment deletes tokens that expired more than a day ago (kept that
// long so a late reuse is reported as expired or used, not unknown).
func pruneEnrolment(b kvBucket, now time.Time) error {
	var dead [][]byte
	err := b.ForEach(func(k, v []byte) error {
		var t EnrolmentToken
		if err := json.Unmarshal(v, &t); err != nil {
			return fmt.Errorf("decode enrolment token: %w", err)
		}
		if now.Sub(t.ExpiresAt) > 24*time.Hour {
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
	return nil
}

// UpdateHost applies fn to the named host's record in one transaction and
// returns the result; fn must not change Name. Errors: ErrNotFound, and
// whatever fn returns (wrapped).
func (s *Store) UpdateHost(name string, fn func(*Host) error) (Host, error) {
	var h Host
	err := s.update(func(tx kvTx) error {
		b := tx.Bucket(bucketHosts)
		if err := getJSON(b, name, &h); err != nil {
			return err
		}
		if err := fn(&h); err != nil {
			return err
		}
		if h.Name != name {
			return fmt.Errorf("host name changed to %q: %w", h.Name, ErrInvalid)
		}
		return putJSON(b, name, &h)
	})
	if err != nil {
		return Host{}, fmt.Errorf("state: update host %s: %w", name, err)
	}
	return h, nil
}

// PeekEnrolmentToken returns the enrolment token value names without using
// it or writing anything (the join listener checks what the token is
// bound to before it uses it). Errors: ErrTokenUnknown.
func (s *Store) PeekEnrolmentToken(value string) (EnrolmentToken, error) {
	h := sha256.Sum256([]byte(value))
	var t EnrolmentToken
	err := s.view(func(tx kvTx) error {
		b := tx.Bucket(bucketEnrolment)
		if b == nil {
			return ErrTokenUnknown
		}
		data := b.Get(h[:])
		if data == nil {
			return ErrTokenUnknown
		}
		return json.Unmarshal(data, &t)
	})
	if err != nil {
		return EnrolmentToken{}, fmt.Errorf("state: peek enrolment token: %w", err)
	}
	return t, nil
}
