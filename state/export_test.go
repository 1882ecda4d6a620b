package state

import bolt "go.etcd.io/bbolt"

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
