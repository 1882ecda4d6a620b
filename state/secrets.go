package state

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"
)

// MinMasterKeyLen is the shortest master key Open accepts, in bytes.
const MinMasterKeyLen = 16

// hkdfInfo binds derived keys to their use (RFC 5869 section 3.2).
const hkdfInfo = "machina state secrets v1 aes-256-gcm"

// keyCheckAAD and keyCheckPlain form the sealed record Open uses to detect a
// wrong master key before any secret is read.
const (
	keyCheckAAD   = "machina:key-check"
	keyCheckPlain = "machina master key check"
)

// Credential is a named secret: a username, a password and optional extra
// fields (API keys, community strings). Its String, GoString, LogValue and
// MarshalJSON redact Password and every Extra value, so printing, logging
// or encoding one by mistake leaks nothing.
type Credential struct {
	Username string
	Password string
	Extra    map[string]string
}

const redacted = "[redacted]"

func (c Credential) redact() map[string]any {
	m := map[string]any{"username": c.Username, "password": redacted}
	if len(c.Extra) > 0 {
		ex := map[string]string{}
		for k := range c.Extra {
			ex[k] = redacted
		}
		m["extra"] = ex
	}
	return m
}

// String returns the username with the password redacted.
func (c Credential) String() string {
	return fmt.Sprintf("Credential{Username:%q Password:%s}", c.Username, redacted)
}

// GoString is String, for %#v.
func (c Credential) GoString() string { return c.String() }

// LogValue implements slog.LogValuer with secrets redacted.
func (c Credential) LogValue() slog.Value {
	return slog.GroupValue(slog.String("username", c.Username), slog.String("password", redacted))
}

// MarshalJSON encodes c with Password and Extra values redacted.
func (c Credential) MarshalJSON() ([]byte, error) { return json.Marshal(c.redact()) }

// credPlain is the plaintext stored (sealed or not) for a Credential.
type credPlain struct {
	Username string            `json:"u"`
	Password string            `json:"p"`
	Extra    map[string]string `json:"x,omitempty"`
}

// secretRecord is a secrets-bucket value. Data is AES-256-GCM ciphertext
// (with Nonce, AAD = the secret's name) when Sealed, else credPlain JSON.
type secretRecord struct {
	Sealed    bool      `json:"sealed"`
	Nonce     []byte    `json:"nonce,omitempty"`
	Data      []byte    `json:"data"`
	UpdatedAt time.Time `json:"updatedAt"`
	UpdatedBy string    `json:"updatedBy,omitempty"`
}

// SecretInfo describes a stored secret without its value.
type SecretInfo struct {
	Name      string    `json:"name"`
	Sealed    bool      `json:"sealed"`
	UpdatedAt time.Time `json:"updatedAt"`
	UpdatedBy string    `json:"updatedBy,omitempty"`
}

// SecretsStatus says whether the store seals secrets and how many records
// are sealed and unsealed.
type SecretsStatus struct {
	Sealing  bool // a master key is configured: new secrets are sealed
	Sealed   int
	Unsealed int
}

// initSealing derives the sealing key, checks it against the key-check
// record (writing one on first use), and seals any unsealed secrets.
func (s *Store) initSealing(master []byte) error {
	if len(master) < MinMasterKeyLen {
		return fmt.Errorf("master key is %d bytes, want at least %d: %w", len(master), MinMasterKeyLen, ErrInvalid)
	}
	key, err := hkdf.Key(sha256.New, master, s.salt, hkdfInfo, 32)
	if err != nil {
		return fmt.Errorf("derive sealing key: %w", err)
	}
	s.sealKey = key
	sealedNow := 0
	err = s.eng.update(func(tx kvTx) error {
		if err := s.checkMasterKeyTx(tx); err != nil {
			return err
		}
		n, err := s.sealUnsealedTx(tx)
		sealedNow = n
		return err
	})
	if err != nil {
		s.sealKey = nil
		return err
	}
	if sealedNow > 0 {
		s.log.Info("sealed secrets stored without a master key", "count", sealedNow)
	}
	return nil
}

// checkMasterKeyTx checks the sealing key against the key-check record,
// or, on first use, checks that every sealed secret opens and writes the
// record. A key that opens neither returns ErrWrongMasterKey.
func (s *Store) checkMasterKeyTx(tx kvTx) error {
	meta := tx.Bucket(bucketMeta)
	if kc := meta.Get(keyKeyCheck); kc != nil {
		var rec secretRecord
		if err := json.Unmarshal(kc, &rec); err != nil {
			return fmt.Errorf("decode key check: %w", err)
		}
		if _, err := s.open(rec, keyCheckAAD); err != nil {
			return ErrWrongMasterKey
		}
		return nil
	}
	// No check record: any sealed secret must still open.
	err := tx.Bucket(bucketSecrets).ForEach(func(k, v []byte) error {
		var rec secretRecord
		if err := json.Unmarshal(v, &rec); err != nil {
			return fmt.Errorf("decode secret %s: %w", k, err)
		}
		if rec.Sealed {
			if _, err := s.open(rec, string(k)); err != nil {
				return ErrWrongMasterKey
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	rec, err := s.seal([]byte(keyCheckPlain), keyCheckAAD)
	if err != nil {
		return err
	}
	data, _ := json.Marshal(rec)
	return meta.Put(keyKeyCheck, data)
}

// sealUnsealedTx seals the secrets an earlier run without a master key
// stored in the clear, keeping their UpdatedAt/UpdatedBy, and returns how
// many it sealed.
func (s *Store) sealUnsealedTx(tx kvTx) (int, error) {
	b := tx.Bucket(bucketSecrets)
	var names []string
	recs := map[string]secretRecord{}
	err := b.ForEach(func(k, v []byte) error {
		var rec secretRecord
		if err := json.Unmarshal(v, &rec); err != nil {
			return fmt.Errorf("decode secret %s: %w", k, err)
		}
		if !rec.Sealed {
			names = append(names, string(k))
			recs[string(k)] = rec
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, name := range names {
		old := recs[name]
		rec, err := s.seal(old.Data, name)
		if err != nil {
			return 0, err
		}
		rec.UpdatedAt, rec.UpdatedBy = old.UpdatedAt, old.UpdatedBy
		if err := putJSON(b, name, &rec); err != nil {
			return 0, err
		}
	}
	return len(names), nil
}

func (s *Store) aead() (cipher.AEAD, error) {
	block, err := aes.NewCipher(s.sealKey)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// seal encrypts plain with a fresh random 96-bit nonce and aad.
func (s *Store) seal(plain []byte, aad string) (secretRecord, error) {
	g, err := s.aead()
	if err != nil {
		return secretRecord{}, err
	}
	nonce := make([]byte, g.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return secretRecord{}, err
	}
	return secretRecord{Sealed: true, Nonce: nonce, Data: g.Seal(nil, nonce, plain, []byte(aad))}, nil
}

// open decrypts rec; aad must be the name it was sealed under.
func (s *Store) open(rec secretRecord, aad string) ([]byte, error) {
	if !rec.Sealed {
		return rec.Data, nil
	}
	if s.sealKey == nil {
		return nil, ErrMasterKeyRequired
	}
	g, err := s.aead()
	if err != nil {
		return nil, err
	}
	if len(rec.Nonce) != g.NonceSize() {
		return nil, errors.New("sealed record has a bad nonce")
	}
	plain, err := g.Open(nil, rec.Nonce, rec.Data, []byte(aad))
	if err != nil {
		return nil, fmt.Errorf("open sealed record: authentication failed")
	}
	return plain, nil
}

// PutSecret stores c under name (an RFC 1123 label), sealed when the store
// has a master key, replacing any earlier value, and writes an
// EventSecretSet event naming actor and the secret (never its value).
// Errors: ErrInvalid.
func (s *Store) PutSecret(name string, c Credential, actor string) (SecretInfo, error) {
	if err := checkName("secret", name); err != nil {
		return SecretInfo{}, fmt.Errorf("state: put secret: %w", err)
	}
	plain, err := json.Marshal(credPlain(c))
	if err != nil {
		return SecretInfo{}, fmt.Errorf("state: put secret %s: %w", name, err)
	}
	rec := secretRecord{Data: plain}
	if s.sealKey != nil {
		if rec, err = s.seal(plain, name); err != nil {
			return SecretInfo{}, fmt.Errorf("state: put secret %s: %w", name, err)
		}
	}
	rec.UpdatedAt = s.nowUTC()
	rec.UpdatedBy = actor
	err = s.update(func(tx kvTx) error {
		if err := putJSON(tx.Bucket(bucketSecrets), name, &rec); err != nil {
			return err
		}
		return s.appendEvent(tx, &Event{Kind: EventSecretSet, Actor: actor, Message: "secret " + name + " set"})
	})
	if err != nil {
		return SecretInfo{}, fmt.Errorf("state: put secret %s: %w", name, err)
	}
	// A new or changed credential deserves a new try, as new BMC settings
	// do: servers stalled on a missing or refused credential would
	// otherwise wait for a change of their desired state.
	if _, err := s.UnstallByCredential(name, actor); err != nil {
		return SecretInfo{}, fmt.Errorf("state: put secret %s: %w", name, err)
	}
	s.secretsChanged()
	return SecretInfo{Name: name, Sealed: rec.Sealed, UpdatedAt: rec.UpdatedAt, UpdatedBy: actor}, nil
}

// errUnchanged aborts an UpdateServer whose fn found nothing to change.
var errUnchanged = errors.New("unchanged")

// UnstallByCredential clears Stalled on every server whose BMC uses the
// named credential and records an EventUnstalled event for each; it returns
// their names in name order. PutSecret calls it, so the reconciler retries
// an action that stalled because the secret was missing or wrong (the
// Driver reports both as bmc.ErrAuth, which stalls). A server updated
// concurrently is skipped if it no longer matches. Errors are the store's.
func (s *Store) UnstallByCredential(name, actor string) ([]string, error) {
	names, err := s.serverNames(func(srv *Server) bool { return srv.Stalled != "" && srv.BMC.Credentials == name })
	if err != nil {
		return nil, err
	}
	var done []string
	for _, n := range names {
		_, err := s.UpdateServer(n, func(srv *Server) error {
			if srv.Stalled == "" || srv.BMC.Credentials != name {
				return errUnchanged
			}
			srv.Stalled = ""
			return nil
		})
		if errors.Is(err, ErrNotFound) || errors.Is(err, errUnchanged) {
			continue
		}
		if err != nil {
			return done, err
		}
		done = append(done, n)
		if _, err := s.AppendEvent(Event{Server: n, Kind: EventUnstalled, Actor: actor, Message: "credential " + name + " set: stalled action will be retried"}); err != nil {
			return done, err
		}
	}
	return done, nil
}

// Secret returns the named credential. Errors: ErrNotFound,
// ErrMasterKeyRequired (sealed, and the store has no key), or an
// authentication error if the record was tampered with or moved to
// another name.
func (s *Store) Secret(name string) (Credential, error) {
	var rec secretRecord
	err := s.view(func(tx kvTx) error { return getJSON(tx.Bucket(bucketSecrets), name, &rec) })
	if err != nil {
		return Credential{}, fmt.Errorf("state: get secret %s: %w", name, err)
	}
	plain, err := s.open(rec, name)
	if err != nil {
		return Credential{}, fmt.Errorf("state: get secret %s: %w", name, err)
	}
	var p credPlain
	if err := json.Unmarshal(plain, &p); err != nil {
		return Credential{}, fmt.Errorf("state: get secret %s: decode: %w", name, err)
	}
	return Credential(p), nil
}

// DeleteSecret removes the named secret and writes an EventSecretDeleted
// event. Errors: ErrNotFound.
func (s *Store) DeleteSecret(name, actor string) error {
	err := s.update(func(tx kvTx) error {
		b := tx.Bucket(bucketSecrets)
		if b.Get([]byte(name)) == nil {
			return ErrNotFound
		}
		if err := b.Delete([]byte(name)); err != nil {
			return err
		}
		return s.appendEvent(tx, &Event{Kind: EventSecretDeleted, Actor: actor, Message: "secret " + name + " deleted"})
	})
	if err != nil {
		return fmt.Errorf("state: delete secret %s: %w", name, err)
	}
	return nil
}

// Secrets lists the stored secrets by name, without values.
func (s *Store) Secrets() ([]SecretInfo, error) {
	var out []SecretInfo
	err := s.view(func(tx kvTx) error {
		return tx.Bucket(bucketSecrets).ForEach(func(k, v []byte) error {
			var rec secretRecord
			if err := json.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("decode secret %s: %w", k, err)
			}
			out = append(out, SecretInfo{Name: string(k), Sealed: rec.Sealed, UpdatedAt: rec.UpdatedAt, UpdatedBy: rec.UpdatedBy})
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("state: list secrets: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// SecretsStatus reports whether secrets are sealed and counts records.
func (s *Store) SecretsStatus() (SecretsStatus, error) {
	list, err := s.Secrets()
	if err != nil {
		return SecretsStatus{}, err
	}
	st := SecretsStatus{Sealing: s.sealKey != nil}
	for _, i := range list {
		if i.Sealed {
			st.Sealed++
		} else {
			st.Unsealed++
		}
	}
	return st, nil
}
