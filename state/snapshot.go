package state

import (
	"fmt"
	"io"

	bolt "go.etcd.io/bbolt"
)

// Snapshot is every server and host as of one read transaction, for the
// reconciler's plan (observed state against desired state). Maps are keyed
// by name. Each value is a copy of its struct, whose fields the caller may
// set (replace a pointer, a slice or a map as a whole), but what a value's
// pointers, slices and maps reach (Server.Hardware, Allocation, Actions,
// InFlight, Firmware, Addresses; Host.Tags, Lost, ...) is shared with the
// store's decode cache and other snapshots and is read-only: to change
// one, copy it first.
type Snapshot struct {
	Servers      map[string]Server
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
	snap := Snapshot{Servers: make(map[string]Server, n), Hosts: map[string]Host{}, Names: make([]string, 0, n)}
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
