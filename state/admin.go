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
	// Role is what the token may do (RoleViewer, RoleOperator,
	// RoleAdmin). A record stored before tokens had roles has none and
	// reads as RoleAdmin: every token could do everything then, and an
	// upgrade takes nothing away.
	Role Role `json:"role,omitempty"`
}

// Role is an admin token's permission level. Each is a superset of the
// one before: a viewer reads; an operator also moves servers through
// their lifecycle, provisions, approves held plans, fences and unfences
// hosts, opens serial consoles and asks for a reconcile; an admin also
// manages secrets and admin tokens, scans BMC subnets and takes state
// snapshots. Which role each admin API route needs is api.RouteRoles.
type Role string

// Admin token roles, from least to most allowed.
const (
	RoleViewer   Role = "viewer"
	RoleOperator Role = "operator"
	RoleAdmin    Role = "admin"
)

// Roles returns the roles from least to most allowed.
func Roles() []Role { return []Role{RoleViewer, RoleOperator, RoleAdmin} }

// rank orders the roles; 0 for an unknown one.
func (r Role) rank() int {
	switch r {
	case RoleViewer:
		return 1
	case RoleOperator:
		return 2
	case RoleAdmin:
		return 3
	}
	return 0
}

// Valid reports whether r is one of Roles.
func (r Role) Valid() bool { return r.rank() > 0 }

// Allows reports whether a token of role r may do what needs role need.
// An unknown r allows nothing; an unknown need is allowed by none.
func (r Role) Allows(need Role) bool {
	return r.rank() > 0 && need.rank() > 0 && r.rank() >= need.rank()
}

// ParseRole reads a role's name; "" is ErrInvalid (a caller that means
// the default says RoleAdmin).
func ParseRole(s string) (Role, error) {
	if r := Role(s); r.Valid() {
		return r, nil
	}
	return "", fmt.Errorf("role %q (want viewer, operator or admin): %w", s, ErrInvalid)
}

// decodeAdminToken reads a stored admin token record; one without a role
// (stored before roles) reads as RoleAdmin.
func decodeAdminToken(data []byte) (AdminToken, error) {
	var t AdminToken
	if err := json.Unmarshal(data, &t); err != nil {
		return AdminToken{}, err
	}
	if t.Role == "" {
		t.Role = RoleAdmin
	}
	return t, nil
}

// adminRoleTx returns the role of the admin token named name, or "" when
// no such token exists (an actor that is not a token, or one revoked).
func adminRoleTx(tx kvTx, name string) Role {
	h := tx.Bucket(bucketAdminNames).Get([]byte(name))
	if h == nil {
		return ""
	}
	data := tx.Bucket(bucketAdminTokens).Get(h)
	if data == nil {
		return ""
	}
	t, err := decodeAdminToken(data)
	if err != nil {
		return ""
	}
	return t.Role
}

// CreateAdminToken creates a bearer token for the admin API named name (an
// RFC 1123 label, unique) with RoleAdmin and returns its value
// (AdminTokenPrefix plus 43 URL-safe characters; shown once) and record.
// It writes an EventAdminCreated event naming actor. Errors: ErrInvalid,
// ErrExists.
func (s *Store) CreateAdminToken(name, actor string) (string, AdminToken, error) {
	return s.CreateAdminTokenRole(name, RoleAdmin, actor)
}

// CreateAdminTokenRole is CreateAdminToken with the token's role; the
// event's message names the role. Errors: ErrInvalid (name or role),
// ErrExists.
func (s *Store) CreateAdminTokenRole(name string, role Role, actor string) (string, AdminToken, error) {
	if err := checkName("admin token", name); err != nil {
		return "", AdminToken{}, fmt.Errorf("state: create admin token: %w", err)
	}
	if !role.Valid() {
		return "", AdminToken{}, fmt.Errorf("state: create admin token %s: role %q: %w", name, role, ErrInvalid)
	}
	value, h, err := newSecret(AdminTokenPrefix)
	if err != nil {
		return "", AdminToken{}, fmt.Errorf("state: create admin token %s: %w", name, err)
	}
	t := AdminToken{Name: name, ID: tokenID(h), CreatedAt: s.nowUTC(), CreatedBy: actor, Role: role}
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
		return s.appendEvent(tx, &Event{Kind: EventAdminCreated, Actor: actor, Message: "admin token " + name + " created with role " + string(role)})
	})
	if err != nil {
		return "", AdminToken{}, fmt.Errorf("state: create admin token %s: %w", name, err)
	}
	return value, t, nil
}

// AuthenticateAdmin returns the record of the admin token with this value
// (its Role set: RoleAdmin for a record stored before roles), or
// ErrTokenUnknown. Read-only; safe for concurrent use.
func (s *Store) AuthenticateAdmin(value string) (AdminToken, error) {
	h := sha256.Sum256([]byte(value))
	var t AdminToken
	err := s.view(func(tx kvTx) error {
		data := tx.Bucket(bucketAdminTokens).Get(h[:])
		if data == nil {
			return ErrTokenUnknown
		}
		var err error
		t, err = decodeAdminToken(data)
		return err
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
		role := adminRoleTx(tx, actor) // read first: a token may revoke itself
		if err := tx.Bucket(bucketAdminTokens).Delete(append([]byte(nil), h...)); err != nil {
			return err
		}
		if err := names.Delete([]byte(name)); err != nil {
			return err
		}
		return s.appendEvent(tx, &Event{Kind: EventAdminRevoked, Actor: actor, Role: role, Message: "admin token " + name + " revoked"})
	})
	if err != nil {
		return fmt.Errorf("state: revoke admin token %s: %w", name, err)
	}
	return nil
}

// AdminTokens lists admin token records ordered by name, each with its
// Role set (RoleAdmin for a record stored before roles).
func (s *Store) AdminTokens() ([]AdminToken, error) {
	var out []AdminToken
	err := s.view(func(tx kvTx) error {
		return tx.Bucket(bucketAdminTokens).ForEach(func(_, v []byte) error {
			t, err := decodeAdminToken(v)
			if err != nil {
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
