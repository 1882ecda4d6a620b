package state

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// backupCopy is WriteBackup on etcd: the site as of one etcd revision,
// written as a bbolt state file (in a temporary folder, removed after)
// that Open accepts, then streamed to w. So a backup is the same kind of
// file on both engines, and restoring one onto a single controller, or
// into etcd again with MigrateToEtcd, needs nothing else.
func (s *Store) backupCopy(w io.Writer, size func(int64)) (int64, error) {
	e := s.eng.(*etcdEngine)
	dir, err := os.MkdirTemp("", "machina-backup-")
	if err != nil {
		return 0, fmt.Errorf("state: backup: %w", err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "state.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		return 0, fmt.Errorf("state: backup: %w", err)
	}
	err = e.dumpTo(db)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("state: backup of %s: %w", s.path, err)
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("state: backup: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("state: backup: %w", err)
	}
	if size != nil {
		size(fi.Size())
	}
	n, err := io.Copy(w, f)
	if err != nil {
		return n, fmt.Errorf("state: backup: %w", err)
	}
	return n, nil
}

// dumpTo copies every bucket (nested ones included) with its sequence and
// records into db, all read at one etcd revision.
func (e *etcdEngine) dumpTo(db *bolt.DB) error {
	ctx, cancel := context.WithTimeout(context.Background(), e.timeout)
	metas, err := e.cli.Get(ctx, e.prefix+"m/", clientv3.WithPrefix())
	cancel()
	if err != nil {
		return err
	}
	rev := metas.Header.Revision
	type bucketMeta struct {
		id  string
		seq uint64
	}
	var buckets []bucketMeta
	for _, kv := range metas.Kvs {
		buckets = append(buckets, bucketMeta{strings.TrimPrefix(string(kv.Key), e.prefix+"m/"), btoi(kv.Value)})
	}
	sort.Slice(buckets, func(i, j int) bool { return buckets[i].id < buckets[j].id }) // parents first
	return db.Update(func(tx *bolt.Tx) error {
		for _, bm := range buckets {
			var b *bolt.Bucket
			for i, part := range strings.Split(bm.id, "/") {
				name, err := unescapeBucket(part)
				if err != nil {
					return fmt.Errorf("bucket key %q: %w", bm.id, err)
				}
				if i == 0 {
					b, err = tx.CreateBucketIfNotExists(name)
				} else {
					b, err = b.CreateBucketIfNotExists(name)
				}
				if err != nil {
					return err
				}
			}
			if err := b.SetSequence(bm.seq); err != nil {
				return err
			}
			pfx := e.prefix + "k/" + bm.id + "="
			from, end := pfx, clientv3.GetPrefixRangeEnd(pfx)
			for {
				ctx, cancel := context.WithTimeout(context.Background(), e.timeout)
				resp, err := e.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithRev(rev), clientv3.WithLimit(etcdPage))
				cancel()
				if err != nil {
					return err
				}
				for _, kv := range resp.Kvs {
					if err := b.Put([]byte(strings.TrimPrefix(string(kv.Key), pfx)), kv.Value); err != nil {
						return err
					}
				}
				if !resp.More || len(resp.Kvs) == 0 {
					break
				}
				from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
			}
		}
		return nil
	})
}

// unescapeBucket reverses escapeBucket.
func unescapeBucket(s string) ([]byte, error) {
	var out []byte
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			out = append(out, s[i])
			continue
		}
		if i+2 >= len(s) {
			return nil, fmt.Errorf("truncated escape: %w", ErrInvalid)
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return nil, fmt.Errorf("bad escape %q: %w", s[i:i+3], ErrInvalid)
		}
		out = append(out, byte(v))
		i += 2
	}
	return out, nil
}
