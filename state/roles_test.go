package state_test

import (
	"crypto/sha256"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/machina-metal/machina/state"
	bolt "go.etcd.io/bbolt"
)

// TestAdminTokenRoleUpgrade: an admin token record written before tokens
// had roles (the JSON has no "role", as every record of an older state
// file) reads as admin, through AuthenticateAdmin and AdminTokens alike,
// and the audit events of its requests carry that role.
func TestAdminTokenRoleUpgrade(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := state.Open(path, state.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	v, _, err := s.CreateAdminToken("old", state.ActorLocal)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Rewrite the record as the store wrote it before roles.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256([]byte(v))
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("admin_tokens"))
		old := string(b.Get(h[:]))
		if !strings.Contains(old, `"role":"admin"`) {
			return errors.New("stored record has no role: " + old)
		}
		return b.Put(h[:], []byte(strings.Replace(old, `,"role":"admin"`, "", 1)))
	})
	if cerr := db.Close(); err != nil || cerr != nil {
		t.Fatal(err, cerr)
	}
	s = openAt(t, path, state.Options{})
	got, err := s.AuthenticateAdmin(v)
	if err != nil || got.Role != state.RoleAdmin {
		t.Fatalf("AuthenticateAdmin(record without role) = %+v, %v; want role admin", got, err)
	}
	list, err := s.AdminTokens()
	if err != nil || len(list) != 1 || list[0].Role != state.RoleAdmin {
		t.Fatalf("AdminTokens = %+v, %v", list, err)
	}
	if _, err := s.AppendEvent(state.Event{Kind: "secret.set", Actor: "old", Message: "m"}); err != nil {
		t.Fatal(err)
	}
	evs := allEvents(t, s, state.EventQuery{})
	if last := evs[len(evs)-1]; last.Actor != "old" || last.Role != state.RoleAdmin {
		t.Errorf("audit event = %+v; want actor old, role admin", last)
	}
}

// TestAdminTokenRoles: a token is created with its role, which
// AuthenticateAdmin and AdminTokens return; an unknown role is refused;
// audit events name the actor's role (filled in by the store), also when
// a token revokes itself; events of the controller and of local commands
// carry none.
func TestAdminTokenRoles(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		v, tok, err := s.CreateAdminTokenRole("watch", state.RoleViewer, state.ActorLocal)
		if err != nil || tok.Role != state.RoleViewer {
			t.Fatalf("CreateAdminTokenRole = %+v, %v", tok, err)
		}
		if _, _, err := s.CreateAdminTokenRole("x", "root", state.ActorLocal); !errors.Is(err, state.ErrInvalid) {
			t.Errorf("unknown role: %v", err)
		}
		if got, err := s.AuthenticateAdmin(v); err != nil || got.Role != state.RoleViewer {
			t.Errorf("AuthenticateAdmin = %+v, %v", got, err)
		}
		if _, _, err := s.CreateAdminTokenRole("ops", state.RoleOperator, "watch"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.AppendEvent(state.Event{Kind: "server.moved", Actor: "ops"}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.AppendEvent(state.Event{Kind: "x", Actor: state.ActorController}); err != nil {
			t.Fatal(err)
		}
		if err := s.RevokeAdminToken("ops", "ops"); err != nil {
			t.Fatal(err)
		}
		want := map[string]state.Role{"admin_token.created/local": "", "admin_token.created/watch": state.RoleViewer,
			"server.moved/ops": state.RoleOperator, "x/controller": "", "admin_token.revoked/ops": state.RoleOperator}
		for _, e := range allEvents(t, s, state.EventQuery{}) {
			k := string(e.Kind) + "/" + e.Actor
			r, ok := want[k]
			if !ok {
				continue
			}
			delete(want, k)
			if e.Role != r {
				t.Errorf("event %s role = %q, want %q", k, e.Role, r)
			}
		}
		if len(want) > 0 {
			t.Errorf("events missing: %v", want)
		}
		for _, tc := range []struct {
			have, need state.Role
			ok         bool
		}{{state.RoleViewer, state.RoleViewer, true}, {state.RoleViewer, state.RoleOperator, false}, {state.RoleOperator, state.RoleOperator, true},
			{state.RoleOperator, state.RoleAdmin, false}, {state.RoleAdmin, state.RoleViewer, true}, {"", state.RoleViewer, false}, {state.RoleAdmin, "", false}} {
			if got := tc.have.Allows(tc.need); got != tc.ok {
				t.Errorf("%q.Allows(%q) = %v", tc.have, tc.need, got)
			}
		}
	})
}
