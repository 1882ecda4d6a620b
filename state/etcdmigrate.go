package state

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sort"

	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// MigrateResult counts what MigrateToEtcd copied and verified.
type MigrateResult struct {
	// Records per top-level bucket ("servers", "events"; nested buckets
	// such as the per-server event index count in their parent).
	Records map[string]int
	// Total is the sum of Records.
	Total int
	// Buckets is the number of buckets (nested ones included).
	Buckets int
}

// migrateChunk is the records one etcd transaction of the copy carries
// (under etcd's default --max-txn-ops of 128 with the bucket keys).
const migrateChunk = 64

// MigrateToEtcd copies the bbolt site in the file from into etcd (cfg)
// record by record, with every bucket's sequence, and then reads every
// record back from etcd and compares it byte for byte with the file (and
// the record counts and sequences of every bucket). The file is opened as
// Open does (ErrLocked while a machina serve runs on it; an older schema is
// migrated forward first); it is not otherwise changed. Secrets are copied
// as stored (sealed ones stay sealed, under the same master key: the salt
// is copied with them).
//
// The target prefix must be empty: otherwise it fails before writing
// anything, naming how many keys are there. The schema version record is
// written last, so a copy that fails midway leaves a prefix that OpenEtcd
// refuses (ErrSchemaVersion) instead of a partial site; delete the prefix
// (etcdctl del --prefix PREFIX) and run the migration again.
func MigrateToEtcd(from string, cfg EtcdConfig, log *slog.Logger) (MigrateResult, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	res := MigrateResult{Records: map[string]int{}}
	src, err := Open(from, Options{MustExist: true, Logger: log})
	if err != nil {
		return res, fmt.Errorf("state: migrate: %w", err)
	}
	defer src.Close()
	e, err := newEtcdEngine(cfg)
	if err != nil {
		return res, fmt.Errorf("state: migrate: open etcd: %w", err)
	}
	defer e.close()
	if err := checkEmptyTarget(e); err != nil {
		return res, err
	}
	// The copy: bucket by bucket, records in chunks of migrateChunk per
	// etcd transaction, the schema version last.
	cp := &migrateCopy{e: e, res: &res}
	err = src.bdb.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			return cp.bucket([][]byte{append([]byte(nil), name...)}, b)
		})
	})
	version := cp.version
	if err != nil {
		return res, fmt.Errorf("state: migrate: %w", err)
	}
	if version == nil {
		return res, fmt.Errorf("state: migrate: %s has no schema version record: %w", from, ErrSchemaVersion)
	}
	if err := e.update(func(etx kvTx) error { return etx.Bucket(bucketMeta).Put(keyVersion, version) }); err != nil {
		return res, fmt.Errorf("state: migrate: write schema version: %w", err)
	}
	res.Records["meta"]++
	res.Total++
	log.Info("state copied to etcd; verifying", "target", e.target, "records", res.Total, "buckets", res.Buckets)
	if err := verifyCopy(src.bdb, e); err != nil {
		return res, fmt.Errorf("state: migrate: verify %s: %w", e.target, err)
	}
	return res, nil
}

// checkEmptyTarget fails (ErrExists, naming the key count) unless e's
// prefix holds no key.
func checkEmptyTarget(e *etcdEngine) error {
	ctx, cancel := context.WithTimeout(context.Background(), e.timeout)
	n, err := e.cli.Get(ctx, e.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	cancel()
	if err != nil {
		return fmt.Errorf("state: migrate: read %s: %w", e.target, err)
	}
	if n.Count > 0 {
		return fmt.Errorf("state: migrate: target %s is not empty (%d keys under %s): migrate into an empty prefix: %w", e.target, n.Count, e.prefix, ErrExists)
	}
	return nil
}

// migrateCopy copies bbolt buckets into an etcd engine for MigrateToEtcd,
// counting into res; the schema version record is held back in version.
type migrateCopy struct {
	e       *etcdEngine
	res     *MigrateResult
	version []byte
}

type migrateRec struct{ k, v []byte }

// flush writes chunk into the etcd bucket at path in one transaction and,
// when last, the bucket's sequence seq.
func (c *migrateCopy) flush(path [][]byte, chunk []migrateRec, seq uint64, last bool) error {
	if len(chunk) == 0 && !last {
		return nil
	}
	err := c.e.update(func(etx kvTx) error {
		eb, err := createPath(etx, path)
		if err != nil {
			return err
		}
		for _, r := range chunk {
			if err := eb.Put(r.k, r.v); err != nil {
				return err
			}
		}
		if last {
			eb.(*etcdBucket).setSequence(seq)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("copy bucket %s: %w", bucketPathString(path), err)
	}
	c.res.Records[escapeBucket(path[0])] += len(chunk)
	c.res.Total += len(chunk)
	return nil
}

// bucket copies b (at path) and then its nested buckets, records in chunks
// of migrateChunk.
func (c *migrateCopy) bucket(path [][]byte, b *bolt.Bucket) error {
	c.res.Buckets++
	var chunk []migrateRec
	var nested [][]byte
	cur := b.Cursor()
	for k, v := cur.First(); k != nil; k, v = cur.Next() {
		if v == nil && b.Bucket(k) != nil {
			nested = append(nested, append([]byte(nil), k...))
			continue
		}
		if len(path) == 1 && bytes.Equal(path[0], bucketMeta) && bytes.Equal(k, keyVersion) {
			c.version = append([]byte(nil), v...)
			continue
		}
		chunk = append(chunk, migrateRec{append([]byte(nil), k...), append([]byte{}, v...)})
		if len(chunk) == migrateChunk {
			if err := c.flush(path, chunk, 0, false); err != nil {
				return err
			}
			chunk = chunk[:0]
		}
	}
	if err := c.flush(path, chunk, b.Sequence(), true); err != nil {
		return err
	}
	for _, nk := range nested {
		if err := c.bucket(append(append([][]byte{}, path...), nk), b.Bucket(nk)); err != nil {
			return err
		}
	}
	return nil
}

// verifyCopy reads every bucket of db back from e and compares records
// (keys, values, order, count) and sequences.
func verifyCopy(db *bolt.DB, e *etcdEngine) error {
	return db.View(func(tx *bolt.Tx) error {
		var check func(path [][]byte, b *bolt.Bucket) error
		check = func(path [][]byte, b *bolt.Bucket) error {
			name := bucketPathString(path)
			var want [][2][]byte
			var nested [][]byte
			c := b.Cursor()
			for k, v := c.First(); k != nil; k, v = c.Next() {
				if v == nil && b.Bucket(k) != nil {
					nested = append(nested, append([]byte(nil), k...))
					continue
				}
				want = append(want, [2][]byte{k, v})
			}
			err := e.view(func(etx kvTx) error {
				eb := openPath(etx, path)
				if eb == nil {
					return fmt.Errorf("bucket %s missing in etcd", name)
				}
				if got := eb.Sequence(); got != b.Sequence() {
					return fmt.Errorf("bucket %s: sequence %d in etcd, %d in the file", name, got, b.Sequence())
				}
				i := 0
				ec := eb.Cursor()
				for k, v := ec.First(); k != nil; k, v = ec.Next() {
					if i >= len(want) {
						return fmt.Errorf("bucket %s: extra record %q in etcd", name, k)
					}
					if !bytes.Equal(k, want[i][0]) || !bytes.Equal(v, want[i][1]) {
						return fmt.Errorf("bucket %s: record %q differs from the file's %q", name, k, want[i][0])
					}
					i++
				}
				if i != len(want) {
					return fmt.Errorf("bucket %s: %d records in etcd, %d in the file", name, i, len(want))
				}
				return nil
			})
			if err != nil {
				return err
			}
			for _, nk := range nested {
				if err := check(append(append([][]byte{}, path...), nk), b.Bucket(nk)); err != nil {
					return err
				}
			}
			return nil
		}
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			return check([][]byte{name}, b)
		})
	})
}

func createPath(tx kvTx, path [][]byte) (kvBucket, error) {
	b, err := tx.CreateBucketIfNotExists(path[0])
	for _, p := range path[1:] {
		if err != nil {
			return nil, err
		}
		b, err = b.CreateBucketIfNotExists(p)
	}
	return b, err
}

func openPath(tx kvTx, path [][]byte) kvBucket {
	b := tx.Bucket(path[0])
	for _, p := range path[1:] {
		if b == nil {
			return nil
		}
		b = b.Bucket(p)
	}
	return b
}

func bucketPathString(path [][]byte) string {
	parts := make([]string, len(path))
	for i, p := range path {
		parts[i] = escapeBucket(p)
	}
	return joinPath(parts)
}

func joinPath(parts []string) string {
	var b bytes.Buffer
	for i, p := range parts {
		if i > 0 {
			b.WriteByte('/')
		}
		b.WriteString(p)
	}
	return b.String()
}

// setSequence sets the bucket's sequence (the migration copies bbolt's).
func (b *etcdBucket) setSequence(seq uint64) {
	if b.seqLoaded && b.seq == seq && !b.created {
		return
	}
	b.seq, b.seqLoaded, b.seqDirty, b.dirty = seq, true, true, true
}

// MigrateSummary renders res as sorted "bucket records" lines.
func (res MigrateResult) MigrateSummary() []string {
	var names []string
	for n := range res.Records {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]string, 0, len(names))
	for _, n := range names {
		out = append(out, fmt.Sprintf("%s %d", n, res.Records[n]))
	}
	return out
}
