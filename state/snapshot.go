package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	bolt "go.etcd.io/bbolt"
)

// Snapshot is every server and host as of one read transaction, for the
// reconciler's plan (observed state against desired state). Maps are keyed
// by name.
//
// Servers' records are shared and read-only: each *Server points at the
// store's decode cache entry, the same record every other snapshot (and
// every lookup through the cache) of the same stored bytes sees, so a
// snapshot copies no record. A caller MUST NOT write through one (set a
// field, or change what its pointers, slices and maps reach); a caller
// that needs a changed record copies it first (*srv, then replace the
// fields it changes) and may then store the copy's pointer in the map
// (the map itself is the caller's: adding, replacing and deleting keys is
// fine). Hosts' values are copies of their structs, whose fields the
// caller may set, but what a Host's slices and pointers reach (Tags,
// Lost, ...) is shared and read-only in the same way.
type Snapshot struct {
	Servers      map[string]*Server
	Hosts        map[string]Host
	LastEventSeq uint64 // the newest event included in this view
	// Names are Servers' keys in byte order, as the store read them, so
	// a planner need not sort them again; read-only. A caller that adds
	// or removes servers leaves it stale: users check it against Servers
	// (length, order, membership) and sort the keys themselves otherwise.
	// Nil in a Snapshot built by hand.
	Names []string
}

// Snapshot returns a consistent view of all servers and hosts.
func (s *Store) Snapshot() (Snapshot, error) {
	// Sized as the last snapshot, so a pass's snapshot of a large fleet
	// does not grow its map step by step.
	n := s.snapServers.Load()
	snap := Snapshot{Servers: make(map[string]*Server, n), Hosts: map[string]Host{}, Names: make([]string, 0, n)}
	err := s.view(func(tx kvTx) error {
		err := tx.Bucket(bucketServers).ForEach(func(k, v []byte) error {
			srv, err := s.servers.share(k, v)
			if err != nil {
				return fmt.Errorf("decode server %s: %w", k, err)
			}
			snap.Servers[srv.Name] = srv
			snap.Names = append(snap.Names, srv.Name)
			return nil
		})
		if err != nil {
			return err
		}
		err = tx.Bucket(bucketHosts).ForEach(func(k, v []byte) error {
			h, err := s.hosts.share(k, v)
			if err != nil {
				return fmt.Errorf("decode host %s: %w", k, err)
			}
			snap.Hosts[h.Name] = h
			return nil
		})
		snap.LastEventSeq = tx.Bucket(bucketEvents).Sequence()
		return err
	})
	if err != nil {
		return Snapshot{}, fmt.Errorf("state: snapshot: %w", err)
	}
	s.snapServers.Store(int64(len(snap.Servers)))
	return snap, nil
}

// ErrSharedRecordChanged is returned by CheckSharedRecords: a record the
// store shares (through Snapshot) was written through.
var ErrSharedRecordChanged = errors.New("state: a shared server record was changed in place")

// CheckSharedRecords is a debug check for tests: it decodes every stored
// server record whose decoding the store holds (and shares with
// snapshots) and compares the two encodings, returning ErrSharedRecordChanged
// (wrapped, naming the servers) when one differs: some caller wrote
// through a record it got from Snapshot, which would corrupt what every
// later snapshot and lookup sees. It reads the whole fleet in one read
// transaction and decodes each cached record, so it is for tests, not for
// a running controller. Safe for concurrent use.
func (s *Store) CheckSharedRecords() error {
	var bad []string
	err := s.view(func(tx kvTx) error {
		return tx.Bucket(bucketServers).ForEach(func(k, v []byte) error {
			s.servers.mu.RLock()
			e, ok := s.servers.m[string(k)]
			s.servers.mu.RUnlock()
			if !ok || e.sum != sumOf(v) {
				return nil // not shared: the next read decodes it afresh
			}
			// Compared by their encodings: the cache's entry shares BIOS
			// registries and value chunks (interned), a fresh decoding
			// holds its own, laid out differently.
			var fresh Server
			if err := json.Unmarshal(v, &fresh); err != nil {
				return fmt.Errorf("decode server %s: %w", k, err)
			}
			want, err := json.Marshal(&fresh)
			if err != nil {
				return fmt.Errorf("encode server %s: %w", k, err)
			}
			got, err := json.Marshal(&e.srv)
			if err != nil || !bytes.Equal(got, want) {
				bad = append(bad, string(k))
			}
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("state: check shared records: %w", err)
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: %v", ErrSharedRecordChanged, bad)
	}
	return nil
}

// WriteBackup writes a consistent copy of the whole state file to w, as of
// one read transaction (bbolt Tx.WriteTo), while the store stays open and
// writable: an online backup. size reports the copy's length in bytes
// before anything is written (the answer's Content-Length). The copy is a
// bbolt file that Open accepts as it is; it holds what the state file
// holds, secrets sealed when a master key is set (unsealed otherwise) and
// admin tokens as hashes, so keep it as carefully as the state file.
func (s *Store) WriteBackup(w io.Writer, size func(int64)) (int64, error) {
	if s.bdb == nil {
		return s.backupCopy(w, size)
	}
	var n int64
	err := boltErr(s.bdb.View(func(tx *bolt.Tx) error {
		if size != nil {
			size(tx.Size())
		}
		var err error
		n, err = tx.WriteTo(w)
		return err
	}))
	if err != nil {
		return n, fmt.Errorf("state: backup: %w", err)
	}
	return n, nil
}
