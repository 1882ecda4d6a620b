package state

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// Snapshot is every server and host as of one read transaction, for the
// reconciler's plan (observed state against desired state). Maps are keyed
// by name; values are copies the caller may modify.
type Snapshot struct {
	Servers      map[string]Server
	Hosts        map[string]Host
	LastEventSeq uint64 // the newest event included in this view
}

// Snapshot returns a consistent view of all servers and hosts.
func (s *Store) Snapshot() (Snapshot, error) {
	snap := Snapshot{Servers: map[string]Server{}, Hosts: map[string]Host{}}
	err := s.view(func(tx *bolt.Tx) error {
		err := tx.Bucket(bucketServers).ForEach(func(k, v []byte) error {
			srv, err := s.servers.decode(k, v)
			if err != nil {
				return fmt.Errorf("decode server %s: %w", k, err)
			}
			snap.Servers[srv.Name] = srv
			return nil
		})
		if err != nil {
			return err
		}
		err = tx.Bucket(bucketHosts).ForEach(func(k, v []byte) error {
			h, err := s.hosts.decode(k, v)
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
	return snap, nil
}
