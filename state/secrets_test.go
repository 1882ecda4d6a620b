package state_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/machina-metal/machina/state"
	bolt "go.etcd.io/bbolt"
)

const (
	testPassword = "hunter2-Sup3rSecret-pw"
	masterKey    = "0123456789abcdef-master-key-for-tests"
)

func TestSecretsSealedRoundTrip(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state.db")
		s, err := openEngine(t, path, state.Options{MasterKey: []byte(masterKey)})
		if err != nil {
			t.Fatal(err)
		}
		want := state.Credential{Username: "admin", Password: testPassword, Extra: map[string]string{"community": "c0mmunity-secret"}}
		info, err := s.PutSecret("bmc-default", want, "ops")
		if err != nil {
			t.Fatal(err)
		}
		if !info.Sealed || info.UpdatedBy != "ops" {
			t.Errorf("PutSecret = %+v", info)
		}
		got, err := s.Secret("bmc-default")
		if err != nil || got.Username != "admin" || got.Password != testPassword || got.Extra["community"] != "c0mmunity-secret" {
			t.Fatalf("Secret = %v, %v", got, err)
		}
		st, _ := s.SecretsStatus()
		if st != (state.SecretsStatus{Sealing: true, Sealed: 1}) {
			t.Errorf("SecretsStatus = %+v", st)
		}
		s.Close()

		raw := rawDump(t, path)
		for _, v := range []string{testPassword, "c0mmunity-secret"} {
			if bytes.Contains(raw, []byte(v)) {
				t.Errorf("sealed state file contains %q in the clear", v)
			}
		}

		// A wrong key fails Open with a clear error, never garbage.
		if _, err := openEngine(t, path, state.Options{MasterKey: []byte("another-master-key-entirely")}); !errors.Is(err, state.ErrWrongMasterKey) {
			t.Fatalf("Open with wrong key = %v, want ErrWrongMasterKey", err)
		}
		// A short key is refused.
		if _, err := openEngine(t, path, state.Options{MasterKey: []byte("short")}); !errors.Is(err, state.ErrInvalid) {
			t.Fatalf("Open with short key = %v, want ErrInvalid", err)
		}
		// Without a key the store opens (for token administration) but sealed secrets stay sealed.
		s2, err := openEngine(t, path, state.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s2.Secret("bmc-default"); !errors.Is(err, state.ErrMasterKeyRequired) {
			t.Errorf("Secret without key = %v, want ErrMasterKeyRequired", err)
		}
		st, _ = s2.SecretsStatus()
		if st != (state.SecretsStatus{Sealing: false, Sealed: 1}) {
			t.Errorf("SecretsStatus without key = %+v", st)
		}
		s2.Close()
		s3 := openAt(t, path, state.Options{MasterKey: []byte(masterKey)})
		if got, err := s3.Secret("bmc-default"); err != nil || got.Password != testPassword {
			t.Errorf("Secret after reopen = %v, %v", got, err)
		}
	})
}

// TestSecretBoundToName: a sealed record copied under another name fails
// authentication (the name is the GCM associated data).
func TestSecretBoundToName(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := state.Open(path, state.Options{MasterKey: []byte(masterKey)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutSecret("alpha", state.Credential{Username: "u", Password: testPassword}, "t"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("secrets"))
		return b.Put([]byte("beta"), append([]byte(nil), b.Get([]byte("alpha"))...))
	})
	db.Close()
	s2 := openAt(t, path, state.Options{MasterKey: []byte(masterKey)})
	if _, err := s2.Secret("beta"); err == nil {
		t.Fatal("a record moved to another name opened")
	}
	if _, err := s2.Secret("alpha"); err != nil {
		t.Errorf("original: %v", err)
	}
}

// TestUnsealedThenSealed: without a key secrets are stored in the clear and
// reported so; opening with a key seals them.
func TestUnsealedThenSealed(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state.db")
		s, err := openEngine(t, path, state.Options{})
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.PutSecret("ipmi", state.Credential{Username: "root", Password: testPassword}, "ops")
		if err != nil || info.Sealed {
			t.Fatalf("PutSecret unsealed = %+v, %v", info, err)
		}
		st, _ := s.SecretsStatus()
		if st != (state.SecretsStatus{Unsealed: 1}) {
			t.Errorf("SecretsStatus = %+v", st)
		}
		s.Close()
		var logs bytes.Buffer
		s2 := openAt(t, path, state.Options{MasterKey: []byte(masterKey), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		st, _ = s2.SecretsStatus()
		if st != (state.SecretsStatus{Sealing: true, Sealed: 1}) {
			t.Errorf("SecretsStatus after sealing = %+v", st)
		}
		if got, err := s2.Secret("ipmi"); err != nil || got.Password != testPassword {
			t.Errorf("Secret = %v, %v", got, err)
		}
		if !strings.Contains(logs.String(), "sealed secrets") || strings.Contains(logs.String(), testPassword) {
			t.Errorf("logs = %q", logs.String())
		}
	})
}

func TestCredentialRedacts(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		c := state.Credential{Username: "admin", Password: testPassword, Extra: map[string]string{"k": testPassword + "x"}}
		var logs bytes.Buffer
		slog.New(slog.NewJSONHandler(&logs, nil)).Info("cred", "c", c)
		js, _ := json.Marshal(c)
		for name, out := range map[string]string{
			"%v": fmt.Sprintf("%v", c), "%+v": fmt.Sprintf("%+v", c), "%#v": fmt.Sprintf("%#v", c), "%q": fmt.Sprintf("%q", c),
			"json": string(js), "slog": logs.String(),
		} {
			if strings.Contains(out, testPassword) {
				t.Errorf("%s leaks the password: %s", name, out)
			}
			if !strings.Contains(out, "admin") {
				t.Errorf("%s lost the username: %s", name, out)
			}
		}
	})
}

func TestSecretNamesValidated(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		for _, n := range []string{"", "../x", "UPPER", "a b", strings.Repeat("a", 64)} {
			if _, err := s.PutSecret(n, state.Credential{}, "t"); !errors.Is(err, state.ErrInvalid) {
				t.Errorf("PutSecret(%q) = %v, want ErrInvalid", n, err)
			}
		}
		if err := s.DeleteSecret("none", "t"); !errors.Is(err, state.ErrNotFound) {
			t.Errorf("DeleteSecret missing = %v", err)
		}
	})
}

// A server stalled because its BMC credential was missing or refused is
// retried once that credential is set: PutSecret clears Stalled on exactly
// the servers using it, records one server.unstalled event each, and leaves
// other servers (another credential, or not stalled) untouched.
func TestPutSecretUnstallsItsServers(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		mk := func(name, cred, stalled string) {
			mustCreate(t, s, state.Server{Name: name, BMC: state.BMCFacts{Driver: "redfish", Address: "https://127.0.0.1:1", Credentials: cred}})
			if stalled != "" {
				if _, err := s.UpdateServer(name, func(srv *state.Server) error { srv.Stalled = stalled; return nil }); err != nil {
					t.Fatal(err)
				}
			}
		}
		mk("a1", "bmc-a", "power-on/1")
		mk("a2", "bmc-a", "")
		mk("a3", "bmc-a", "commission/2")
		mk("b1", "bmc-b", "power-on/1")
		before, _ := s.Server("a2")

		if _, err := s.PutSecret("bmc-a", state.Credential{Username: "u", Password: testPassword}, "ops"); err != nil {
			t.Fatal(err)
		}
		for name, want := range map[string]string{"a1": "", "a3": "", "b1": "power-on/1"} {
			got, err := s.Server(name)
			if err != nil || got.Stalled != want {
				t.Errorf("%s: Stalled = %q, %v; want %q", name, got.Stalled, err, want)
			}
		}
		if after, _ := s.Server("a2"); after.Revision != before.Revision {
			t.Errorf("a2 (not stalled) was rewritten: revision %d → %d", before.Revision, after.Revision)
		}
		var unstalled []string
		for _, e := range allEvents(t, s, state.EventQuery{}) {
			if e.Kind == state.EventUnstalled {
				if e.Actor != "ops" || strings.Contains(e.Message, testPassword) {
					t.Errorf("event %+v", e)
				}
				unstalled = append(unstalled, e.Server)
			}
		}
		if fmt.Sprint(unstalled) != "[a1 a3]" {
			t.Errorf("server.unstalled events for %v, want [a1 a3]", unstalled)
		}
	})
}
