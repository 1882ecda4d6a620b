package state

import (
	"bytes"
	"errors"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// boltEngine is the embedded engine: bbolt's own transactions.
type boltEngine struct {
	db *bolt.DB
	// serversGen counts write transactions that opened the servers
	// bucket: bumped when one opens it (before its commit) and again
	// when it ends (after its commit or rollback), so a value read
	// before a read transaction and seen unchanged later proves that no
	// server record changed in between (Store.ServersGen).
	serversGen atomic.Uint64
}

func (e *boltEngine) update(fn func(tx kvTx) error) error {
	var touched bool
	err := e.db.Update(func(tx *bolt.Tx) error { return fn(boltTx{tx: tx, e: e, touched: &touched}) })
	if touched {
		e.serversGen.Add(1)
	}
	return boltErr(err)
}

func (e *boltEngine) batch(fn func(tx kvTx) error) error {
	var touched atomic.Bool // Batch may run fn on another goroutine
	err := e.db.Batch(func(tx *bolt.Tx) error {
		var t bool
		err := fn(boltTx{tx: tx, e: e, touched: &t})
		if t {
			touched.Store(true)
		}
		return err
	})
	if touched.Load() {
		e.serversGen.Add(1)
	}
	return boltErr(err)
}

func (e *boltEngine) view(fn func(tx kvTx) error) error {
	return boltErr(e.db.View(func(tx *bolt.Tx) error { return fn(boltTx{tx: tx}) }))
}

func (e *boltEngine) close() error { return e.db.Close() }

func (e *boltEngine) describe() string { return "bbolt " + e.db.Path() }

func boltErr(err error) error {
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
}

// boltTx is a bbolt transaction; e and touched are set on write
// transactions, which mark opening the servers bucket (serversGen).
type boltTx struct {
	tx      *bolt.Tx
	e       *boltEngine
	touched *bool
}

// markServers records that a write transaction may change server records.
func (t boltTx) markServers(name []byte) {
	if t.touched != nil && bytes.Equal(name, bucketServers) {
		if !*t.touched {
			*t.touched = true
			t.e.serversGen.Add(1)
		}
	}
}

func (t boltTx) Bucket(name []byte) kvBucket {
	t.markServers(name)
	b := t.tx.Bucket(name)
	if b == nil {
		return nil
	}
	return boltBucket{b}
}

func (t boltTx) CreateBucketIfNotExists(name []byte) (kvBucket, error) {
	t.markServers(name)
	b, err := t.tx.CreateBucketIfNotExists(name)
	if err != nil {
		return nil, err
	}
	return boltBucket{b}, nil
}

type boltBucket struct{ b *bolt.Bucket }

func (b boltBucket) Get(key []byte) []byte                    { return b.b.Get(key) }
func (b boltBucket) Put(key, value []byte) error              { return b.b.Put(key, value) }
func (b boltBucket) Delete(key []byte) error                  { return b.b.Delete(key) }
func (b boltBucket) ForEach(fn func(k, v []byte) error) error { return b.b.ForEach(fn) }
func (b boltBucket) Cursor() kvCursor                         { return b.b.Cursor() }
func (b boltBucket) NextSequence() (uint64, error)            { return b.b.NextSequence() }
func (b boltBucket) Sequence() uint64                         { return b.b.Sequence() }
func (b boltBucket) DeleteBucket(name []byte) error           { return b.b.DeleteBucket(name) }
func (b boltBucket) KeyN() int                                { return b.b.Stats().KeyN }
func (b boltBucket) SetFillPercent(f float64)                 { b.b.FillPercent = f }
func (b boltBucket) CreateBucketIfNotExists(name []byte) (kvBucket, error) {
	nb, err := b.b.CreateBucketIfNotExists(name)
	if err != nil {
		return nil, err
	}
	return boltBucket{nb}, nil
}

func (b boltBucket) Bucket(name []byte) kvBucket {
	nb := b.b.Bucket(name)
	if nb == nil {
		return nil
	}
	return boltBucket{nb}
}
