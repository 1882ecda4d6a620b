package state

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"
)

// Answer is the HTTP answer recorded with a token's use: a retry of the
// same request gets it again (at-least-once requests, exactly-once
// effects). Body is the response body (JSON); it never holds a secret.
type Answer struct {
	Status int             `json:"status"`
	Body   json.RawMessage `json:"body,omitempty"`
}

// Tx is the transaction of one token use, handed to [TokenUse.Effect]:
// what it changes commits together with the token's use, or not at all.
// It must not be used after Effect returns.
type Tx struct {
	s  *Store
	tx kvTx
}

// Server reads a server inside the transaction. Errors: ErrNotFound.
func (t *Tx) Server(name string) (Server, error) {
	var srv Server
	if err := getJSON(t.tx.Bucket(bucketServers), name, &srv); err != nil {
		return Server{}, err
	}
	return srv, nil
}

// Apply is [Store.Apply] inside the transaction; a refusal is a
// *TransitionError.
func (t *Tx) Apply(m Move) (Server, error) {
	srv, te, err := t.s.applyTx(t.tx, m)
	if te != nil {
		return Server{}, te
	}
	return srv, err
}

// UpdateServer is [Store.UpdateServer] inside the transaction.
func (t *Tx) UpdateServer(name string, fn func(*Server) error) (Server, error) {
	return t.s.updateServerTx(t.tx, name, fn)
}

// SetPower is [Store.SetPower] inside the transaction.
func (t *Tx) SetPower(name string, p Power, src PowerSource) (Server, error) {
	if !p.Valid() {
		return Server{}, fmt.Errorf("power %q: %w", p, ErrInvalid)
	}
	return t.s.setPowerTx(t.tx, name, p, src)
}

// IssueToken is [Store.IssueToken] inside the transaction (revoking the
// server's previous token of that purpose). spec.Heard is written in the
// transaction, not behind: its caller is writing the server already.
func (t *Tx) IssueToken(spec TokenSpec) (string, Token, error) {
	spec, err := checkSpec(spec)
	if err != nil {
		return "", Token{}, err
	}
	value, tok, err := t.s.issueTokenTx(t.tx, spec)
	if err != nil || spec.Heard == "" || t.tx.Bucket(bucketServers).Get([]byte(spec.Server)) == nil {
		return value, tok, err
	}
	if _, err := t.s.updateServerTx(t.tx, spec.Server, func(srv *Server) error {
		srv.LastHeard, srv.LastHeardAt = spec.Heard, tok.IssuedAt
		return nil
	}); err != nil {
		return "", Token{}, err
	}
	return value, tok, nil
}

// AppendEvent writes ev inside the transaction.
func (t *Tx) AppendEvent(ev Event) error {
	if ev.Actor == "" {
		ev.Actor = ActorController
	}
	return t.s.appendEvent(t.tx, &ev)
}

// TokenUse is one request presenting a single-use token to
// [Store.UseToken].
type TokenUse struct {
	// Claim is checked as by ConsumeToken.
	Claim TokenClaim
	// Request fingerprints the request: the requester (source address,
	// MAC) and the body. [RequestFingerprint] makes one.
	Request [32]byte
	// Effect is what the token authorises. It runs inside the
	// transaction that marks the token used; an error (or a panic) rolls
	// both back, so a request answered 4xx/5xx consumes nothing. The
	// Answer it returns is recorded with the use unless Rerun is set.
	Effect func(tx *Tx, t Token) (Answer, error)
	// Rerun: a retry re-runs Effect (on the used token) instead of getting
	// the recorded answer, for answers that carry fresh secrets (a deploy
	// plan's image and done tokens), which are never stored. Effect must
	// then be idempotent.
	Rerun bool
}

// RequestFingerprint hashes the parts that identify a request (source
// address, MAC, body, ...), each length-prefixed so that no two different
// lists hash alike.
func RequestFingerprint(parts ...[]byte) [32]byte {
	h := sha256.New()
	for _, p := range parts {
		var n [8]byte
		l := uint64(len(p))
		for i := range n {
			n[i] = byte(l >> (8 * (7 - i)))
		}
		h.Write(n[:])
		h.Write(p)
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// UseToken checks a single-use token against u.Claim and runs u.Effect in
// the same transaction that marks it used, recording the answer with it.
// A retry within the token's lifetime with the same u.Request gets the
// recorded answer again (replayed true) and changes nothing (or, with
// Rerun, runs Effect again); any other request presenting a used token is
// refused with ErrTokenUsed. Refusals return the ErrToken* errors, commit
// nothing and are counted with a paced EventTokenRefused event
// (RecordRefusal), as ConsumeToken's. An error from Effect is returned as
// is, and nothing is consumed.
func (s *Store) UseToken(value string, u TokenUse) (tok Token, ans Answer, replayed bool, err error) {
	if u.Claim.MAC != "" {
		m, err := normalizeMAC(u.Claim.MAC)
		if err != nil {
			return Token{}, Answer{}, false, fmt.Errorf("state: use token: %w", err)
		}
		u.Claim.MAC = m
	}
	h := sha256.Sum256([]byte(value))
	if !s.tokenKnown(h) {
		s.unknownTokens.Add(1)
		return Token{}, Answer{}, false, fmt.Errorf("state: use token: %w", ErrTokenUnknown)
	}
	fp := hex.EncodeToString(u.Request[:])
	var refused, effectErr error
	var refusedServer, refusedMsg string
	err = s.update(func(tx kvTx) error {
		refused, effectErr, replayed = nil, nil, false
		b := tx.Bucket(bucketTokens)
		data := b.Get(h[:])
		refuse := func(t Token, why error) error {
			refused = why
			server := t.Server
			if server == "" && tx.Bucket(bucketServers).Get([]byte(u.Claim.Server)) != nil {
				server = u.Claim.Server
			}
			// Paced, after the rollback (refusals.go): no write per refusal.
			refusedServer, refusedMsg = server, fmt.Sprintf("%s token %s refused: %v", u.Claim.Purpose, tokenOrUnknown(t.ID), why)
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
		switch why, replay := useVerdict(t, u, fp, now); {
		case why != nil:
			return refuse(t, why)
		case replay:
			replayed, tok, ans = true, t, *t.Answer
			return errRollback // nothing to write: no commit, no fsync
		}
		retry := t.Uses > 0
		a, err := u.Effect(&Tx{s: s, tx: tx}, t)
		if err != nil {
			effectErr = err
			return err
		}
		if retry {
			replayed = true
		} else {
			t.Uses, t.UsedAt, t.Request = 1, now, fp
		}
		if !u.Rerun {
			t.Answer = &a
		}
		tok, ans = t, a
		data, err = json.Marshal(&t)
		if err != nil {
			return err
		}
		return b.Put(h[:], data)
	})
	err = rolledBack(err)
	if refused != nil {
		s.noteRefusal(refusedServer, EventTokenRefused, refusalReasonOf(refused), refusedMsg)
	}
	switch {
	case effectErr != nil:
		return Token{}, Answer{}, false, effectErr
	case err != nil:
		return Token{}, Answer{}, false, fmt.Errorf("state: use token: %w", err)
	case refused != nil:
		return Token{}, Answer{}, false, fmt.Errorf("state: use token: %w", refused)
	}
	return tok, ans, replayed, nil
}

// useVerdict decides one use of t by u (fingerprint fp) at now: refused
// (why: ErrTokenMismatch, ErrTokenExpired, ErrTokenUsed), a replay of the
// recorded answer, or neither (run the effect).
func useVerdict(t Token, u TokenUse, fp string, now time.Time) (why error, replay bool) {
	switch {
	case subtle.ConstantTimeCompare([]byte(t.Purpose), []byte(u.Claim.Purpose)) != 1,
		u.Claim.Server != "" && u.Claim.Server != t.Server,
		u.Claim.MAC != "" && t.MAC != "" && u.Claim.MAC != t.MAC:
		return ErrTokenMismatch, false
	case !now.Before(t.ExpiresAt):
		return ErrTokenExpired, false
	case t.Reusable:
		return fmt.Errorf("%w: reusable token presented for a single use", ErrTokenMismatch), false
	case t.Uses > 0 && subtle.ConstantTimeCompare([]byte(t.Request), []byte(fp)) != 1:
		return ErrTokenUsed, false
	case t.Uses > 0 && !u.Rerun:
		if t.Answer == nil {
			return ErrTokenUsed, false
		}
		return nil, true
	}
	return nil, false
}

// PeekToken returns the token value names if it exists for claim's
// purpose (and server), used or not and without writing anything: the
// machine endpoints read the server a request is about before they check
// its body. Errors: ErrTokenUnknown, ErrTokenMismatch (no event: the
// request is refused later, by UseToken, with one).
func (s *Store) PeekToken(value string, claim TokenClaim) (Token, error) {
	h := sha256.Sum256([]byte(value))
	var t Token
	err := s.view(func(tx kvTx) error {
		data := tx.Bucket(bucketTokens).Get(h[:])
		if data == nil {
			return ErrTokenUnknown
		}
		if err := json.Unmarshal(data, &t); err != nil {
			return fmt.Errorf("decode token %s: %w", tokenID(h), err)
		}
		if subtle.ConstantTimeCompare([]byte(t.Purpose), []byte(claim.Purpose)) != 1 || (claim.Server != "" && claim.Server != t.Server) {
			return ErrTokenMismatch
		}
		return nil
	})
	if err != nil {
		return Token{}, fmt.Errorf("state: peek token: %w", err)
	}
	return t, nil
}
