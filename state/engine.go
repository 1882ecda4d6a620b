package state

// The store logic (every file of this package but engine*.go) is written
// once against the small transactional interface below, the subset of
// bbolt's Tx/Bucket/Cursor API it uses, and runs on one of two engines:
//
//   - bbolt (engine_bolt.go): the embedded default, one file, one process.
//     The interface maps 1:1 onto bbolt's Update/View/Batch, so the file
//     format and behaviour are those of the code before the interface.
//   - etcd (engine_etcd.go): the same buckets as key ranges under a prefix,
//     transactions as optimistic etcd transactions (see OpenEtcd).

// kvTx is one transaction: read-only in view, read-write in update.
type kvTx interface {
	// Bucket returns the top-level bucket name, or nil when it does not
	// exist.
	Bucket(name []byte) kvBucket
	// CreateBucketIfNotExists returns the top-level bucket name, creating
	// it first when needed.
	CreateBucketIfNotExists(name []byte) (kvBucket, error)
}

// kvBucket is an ordered map of byte keys to byte values (keys compare
// bytewise) with a sequence counter and nested buckets. Values returned
// by Get and cursors are valid until the transaction ends or the key is
// next written, as in bbolt: copy them to keep them.
type kvBucket interface {
	// Get returns the value of key, or nil when absent (or a nested
	// bucket).
	Get(key []byte) []byte
	Put(key, value []byte) error
	Delete(key []byte) error
	// ForEach calls fn for every key in order; fn must not modify the
	// bucket. Nested buckets are not data: engines may or may not list
	// them (bbolt does, with a nil value); the store logic never puts data
	// and nested buckets in one bucket.
	ForEach(fn func(k, v []byte) error) error
	Cursor() kvCursor
	// NextSequence increments and returns the bucket's sequence;
	// Sequence returns it without change.
	NextSequence() (uint64, error)
	Sequence() uint64
	Bucket(name []byte) kvBucket
	CreateBucketIfNotExists(name []byte) (kvBucket, error)
	DeleteBucket(name []byte) error
	// KeyN is the number of records (a sizing hint: bbolt Stats().KeyN,
	// a page walk; etcd a count at the snapshot).
	KeyN() int
	// SetFillPercent is a page-split hint for append-only buckets (bbolt
	// Bucket.FillPercent); engines without pages ignore it.
	SetFillPercent(f float64)
}

// kvCursor walks a bucket in key order. Each method returns nil, nil past
// the end. After a Put or Delete in the same bucket, call First or Seek
// again before Next (as bbolt requires).
type kvCursor interface {
	First() (k, v []byte)
	Next() (k, v []byte)
	Seek(seek []byte) (k, v []byte)
}

// engine runs transactions. update and batch commit fn's writes when it
// returns nil and discard them otherwise; both may run fn more than once
// (etcd retries on conflict; bbolt's Batch reruns a failing member), so fn
// must be idempotent given the same starting state.
type engine interface {
	update(fn func(tx kvTx) error) error
	batch(fn func(tx kvTx) error) error
	view(fn func(tx kvTx) error) error
	close() error
	// describe names the engine and its location for errors and logs
	// (never a secret).
	describe() string
}
