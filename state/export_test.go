package state

import (
	"encoding/json"

	bolt "go.etcd.io/bbolt"
)

// LastTxID is the ID of the store's last committed write transaction
// (bbolt's meta txid, one more per commit): for tests that count commits.
// bbolt stores only.
func LastTxID(s *Store) int {
	var id int
	_ = s.bdb.View(func(tx *bolt.Tx) error { id = tx.ID(); return nil })
	return id
}

// Grouped runs fn through the store's group committer (Store.grouped) on
// a bbolt store.
func Grouped(s *Store, fn func(*bolt.Tx) error) error {
	return s.grouped(func(tx kvTx) error { return fn(tx.(boltTx).tx) })
}

// View runs fn in a read transaction of the store's bbolt file.
func View(s *Store, fn func(*bolt.Tx) error) error { return s.bdb.View(fn) }

// PutLegacyEvent stores e in the machine log as a build before the audit
// log did, whatever its actor (Seq and At assigned), and marks the store
// not split, so that the next Open moves its audit events (splitAuditLog).
func PutLegacyEvent(s *Store, e Event) (Event, error) {
	err := s.update(func(tx kvTx) error {
		events := tx.Bucket(bucketEvents)
		seq, err := events.NextSequence()
		if err != nil {
			return err
		}
		e.Seq, e.At = seq, s.nowUTC()
		data, err := json.Marshal(&e)
		if err != nil {
			return err
		}
		if err := events.Put(u64(seq), data); err != nil {
			return err
		}
		meta := tx.Bucket(bucketMeta)
		if err := meta.Put(keyEventsN, u64(btoi(meta.Get(keyEventsN))+1)); err != nil {
			return err
		}
		if e.Server != "" {
			sb, err := tx.Bucket(bucketServerEvents).CreateBucketIfNotExists([]byte(e.Server))
			if err != nil {
				return err
			}
			if err := sb.Put(u64(seq), nil); err != nil {
				return err
			}
			counts := tx.Bucket(bucketEventCounts)
			if err := counts.Put([]byte(e.Server), u64(btoi(counts.Get([]byte(e.Server)))+1)); err != nil {
				return err
			}
		}
		return meta.Delete(keyAuditSplit)
	})
	return e, err
}
