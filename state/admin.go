package state

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"
)

// AdminTokenPrefix starts every admin API token value, so secret scanners
// and humans can recognise one.
const AdminTokenPrefix = "mna_"

// AdminToken is an admin API bearer token's record. The value is never
// stored, only its SHA-256; ID is the first 12 hex digits of that hash.
type AdminToken struct {
	Name      string    `json:"name"`
	ID        string    `json:"id"`
	CreatedAt time.Time `json:"createdAt"`
	CreatedBy string    `json:"createdBy,omitempty"`
}

// CreateAdminToken creates a bearer token for the admin API named name (an
// RFC 1123 label, unique) and returns its value (AdminTokenPrefix plus 43
// URL-safe characters; shown once) and record. It writes an
// EventAdminCreated event naming actor. Errors: ErrInvalid, ErrExists.
func (s *Store) CreateAdminToken(name, actor string) (string, AdminToken, error) {
	if err := checkName("admin token", name); err != nil {
		return "", AdminToken{}, fmt.Errorf("state: create admin token: %w", err)
	}
	value, h, err := newSecret(AdminTokenPrefix)
	if err != nil {
		return "", AdminToken{}, fmt.Errorf("state: create admin token %s: %w", name, err)
	}
	t := AdminToken{Name: name, ID: tokenID(h), CreatedAt: s.nowUTC(), CreatedBy: actor}
	err = s.update(func(tx kvTx) error {
		names := tx.Bucket(bucketAdminNames)
		if names.Get([]byte(name)) != nil {
			return ErrExists
		}
		data, err := json.Marshal(&t)
		if err != nil {
			return err
		}
		if err := tx.Bucket(bucketAdminTokens).Put(h[:], data); err != nil {
			return err
		}
		if err := names.Put([]byte(name), h[:]); err != nil {
			return err
		}
		return s.appendEvent(tx, &Event{Kind: EventAdminCreated, Actor: actor, Message: "admin token " + name + " created"})
	})
	if err != nil {
		return "", AdminToken{}, fmt.Errorf("state: create admin token %s: %w", name, err)
	}
	return value, t, nil
}

// AuthenticateAdmin returns the record of the admin token with this value,
// or ErrTokenUnknown. Read-only; safe for concurrent use.
func (s *Store) AuthenticateAdmin(value string) (AdminToken, error) {
	h := sha256.Sum256([]byte(value))
	var t AdminToken
	err := s.view(func(tx kvTx) error {
		data := tx.Bucket(bucketAdminTokens).Get(h[:])
		if data == nil {
			return ErrTokenUnknown
		}
		return json.Unmarshal(data, &t)
	})
	if err != nil {
		return AdminToken{}, fmt.Errorf("state: authenticate admin: %w", err)
	}
	return t, nil
}

// ErrLastAdminToken: RevokeAdminTokenKeepOne would revoke the only admin
// token.
var ErrLastAdminToken = errors.New("the last admin token")

// RevokeAdminToken deletes the named admin token; requests bearing it are
// refused from the next request on. Errors: ErrNotFound.
func (s *Store) RevokeAdminToken(name, actor string) error {
	return s.revokeAdminToken(name, actor, false)
}

// RevokeAdminTokenKeepOne is RevokeAdminToken refusing, in the same
// transaction, to revoke the only admin token (ErrLastAdminToken): the
// admin API uses it, since while the controller holds the state file
// nothing else could create another.
func (s *Store) RevokeAdminTokenKeepOne(name, actor string) error {
	return s.revokeAdminToken(name, actor, true)
}

func (s *Store) revokeAdminToken(name, actor string, keepOne bool) error {
	err := s.update(func(tx kvTx) error {
		names := tx.Bucket(bucketAdminNames)
		h := names.Get([]byte(name))
		if h == nil {
			return ErrNotFound
		}
		if keepOne {
			c := names.Cursor()
			if first, _ := c.First(); first != nil {
				if second, _ := c.Next(); second == nil {
					return ErrLastAdminToken
				}
			}
		}
		if err := tx.Bucket(bucketAdminTokens).Delete(append([]byte(nil), h...)); err != nil {
			return err
		}
		if err := names.Delete([]byte(name)); err != nil {
			return err
		}
		return s.appendEvent(tx, &Event{Kind: EventAdminRevoked, Actor: actor, Message: "admin token " + name + " revoked"})
	})
	if err != nil {
		return fmt.Errorf("state: revoke admin token %s: %w", name, err)
	}
	return nil
}

// AdminTokens lists admin token records ordered by name.
func (s *Store) AdminTokens() ([]AdminToken, error) {
	var out []AdminToken
	err := s.view(func(tx kvTx) error {
		return tx.Bucket(bucketAdminTokens).ForEach(func(_, v []byte) error {
			var t AdminToken
			if err := json.Unmarshal(v, &t); err != nil {
				return err
			}
			out = append(out, t)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("state: list admin tokens: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
