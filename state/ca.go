package state

import (
	"encoding/json"
	"fmt"
)

// Meta keys of the controller CA. The key record is a
// secretRecord: AES-256-GCM sealed under the store's master key with AAD
// caKeyAAD when the store has one, like every other secret.
var (
	keyCACert = []byte("ca_cert")
	keyCAKey  = []byte("ca_key")
)

const caKeyAAD = "machina:ca-key"

// CARecord is the controller CA as stored: the certificate (DER, public)
// and its private key (PKCS #8 DER, sealed at rest when a master key is set).
type CARecord struct {
	CertDER []byte
	KeyDER  []byte
	// Sealed reports whether the key is stored sealed (output only).
	Sealed bool
}

// CA returns the stored controller CA, or ErrNotFound before the first
// PutCA. A key stored unsealed by an earlier run without a master key is
// sealed in place when this store has one. Errors: ErrMasterKeyRequired,
// or an authentication error when the sealed key was tampered with.
func (s *Store) CA() (CARecord, error) {
	var rec CARecord
	var kr secretRecord
	err := s.view(func(tx kvTx) error {
		meta := tx.Bucket(bucketMeta)
		c, k := meta.Get(keyCACert), meta.Get(keyCAKey)
		if c == nil || k == nil {
			return ErrNotFound
		}
		rec.CertDER = append([]byte(nil), c...)
		return json.Unmarshal(k, &kr)
	})
	if err != nil {
		return CARecord{}, fmt.Errorf("state: get ca: %w", err)
	}
	key, err := s.open(kr, caKeyAAD)
	if err != nil {
		return CARecord{}, fmt.Errorf("state: get ca: %w", err)
	}
	rec.KeyDER, rec.Sealed = key, kr.Sealed
	if !kr.Sealed && s.sealKey != nil {
		if err := s.putCA(rec, true); err != nil {
			return CARecord{}, fmt.Errorf("state: seal ca key: %w", err)
		}
		rec.Sealed = true
	}
	return rec, nil
}

// PutCA stores the controller CA if none is stored yet and returns the one
// stored (the argument, or an earlier CA when two controllers raced on the
// same file). The key is sealed when the store has a master key.
func (s *Store) PutCA(rec CARecord) (CARecord, error) {
	if len(rec.CertDER) == 0 || len(rec.KeyDER) == 0 {
		return CARecord{}, fmt.Errorf("state: put ca: empty certificate or key: %w", ErrInvalid)
	}
	if err := s.putCA(rec, false); err != nil {
		return CARecord{}, fmt.Errorf("state: put ca: %w", err)
	}
	return s.CA()
}

func (s *Store) putCA(rec CARecord, replace bool) error {
	kr := secretRecord{Data: rec.KeyDER}
	if s.sealKey != nil {
		var err error
		if kr, err = s.seal(rec.KeyDER, caKeyAAD); err != nil {
			return err
		}
	}
	kr.UpdatedAt = s.nowUTC()
	data, err := json.Marshal(&kr)
	if err != nil {
		return err
	}
	return s.update(func(tx kvTx) error {
		meta := tx.Bucket(bucketMeta)
		if !replace && meta.Get(keyCACert) != nil {
			return nil
		}
		if err := meta.Put(keyCACert, rec.CertDER); err != nil {
			return err
		}
		return meta.Put(keyCAKey, data)
	})
}
