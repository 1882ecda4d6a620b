package state

import (
	"encoding/json"
	"sync"

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

// WriteGate holds each write transaction of a store at its start until
// the test lets it run: the store's write path busy behind other work (a
// long group commit of machine transitions, say), with the order in which
// the waiting writes run chosen by the test.
type WriteGate struct {
	// Entered receives, for each write that reaches the engine, the
	// channel to close to let it run.
	Entered chan chan struct{}
	open    chan struct{}
	once    sync.Once
}

// Open lets every write, held or to come, run.
func (g *WriteGate) Open() { g.once.Do(func() { close(g.open) }) }

type gatedEngine struct {
	engine
	g *WriteGate
}

func (e gatedEngine) update(fn func(tx kvTx) error) error {
	select {
	case <-e.g.open:
		return e.engine.update(fn)
	default:
	}
	run := make(chan struct{})
	select {
	case e.g.Entered <- run:
		select {
		case <-run:
		case <-e.g.open:
		}
	case <-e.g.open:
	}
	return e.engine.update(fn)
}

func (e gatedEngine) batch(fn func(tx kvTx) error) error { return e.update(fn) }

// HoldWrites puts a WriteGate in front of s's engine (call it before any
// concurrent use of s); every write waits at the gate until the test lets
// it run or opens the gate.
func HoldWrites(s *Store) *WriteGate {
	g := &WriteGate{Entered: make(chan chan struct{}), open: make(chan struct{})}
	s.eng = gatedEngine{engine: s.eng, g: g}
	return g
}

// QueuedHeartbeats is the number of heartbeat writes waiting for the
// heartbeats' group committer (bbolt stores).
func QueuedHeartbeats(s *Store) int {
	s.beats.mu.Lock()
	defer s.beats.mu.Unlock()
	return len(s.beats.queue)
}

// PutRawServer stores data as the servers bucket's record name, bypassing
// encoding and the decode cache: for tests of what reads do with a record
// they cannot decode.
func PutRawServer(s *Store, name string, data []byte) error {
	return s.update(func(tx kvTx) error { return tx.Bucket(bucketServers).Put([]byte(name), data) })
}

// DeleteRawServer deletes the servers bucket's record name.
func DeleteRawServer(s *Store, name string) error {
	return s.update(func(tx kvTx) error { return tx.Bucket(bucketServers).Delete([]byte(name)) })
}

// FreshSnapshot is Snapshot read without the decode cache: every record
// decoded from its stored bytes, as a store that has never read it
// would. For tests comparing the cached snapshot with a from-scratch one.
func FreshSnapshot(s *Store) (Snapshot, error) {
	snap := Snapshot{Servers: map[string]*Server{}, Hosts: map[string]Host{}}
	err := s.view(func(tx kvTx) error {
		err := tx.Bucket(bucketServers).ForEach(func(k, v []byte) error {
			var srv Server
			if err := json.Unmarshal(v, &srv); err != nil {
				return err
			}
			snap.Servers[srv.Name] = &srv
			snap.Names = append(snap.Names, srv.Name)
			return nil
		})
		if err != nil {
			return err
		}
		err = tx.Bucket(bucketHosts).ForEach(func(k, v []byte) error {
			var h Host
			if err := json.Unmarshal(v, &h); err != nil {
				return err
			}
			snap.Hosts[h.Name] = h
			return nil
		})
		snap.LastEventSeq = tx.Bucket(bucketEvents).Sequence()
		return err
	})
	return snap, err
}

// SharedChunks counts the chunks of b that are the very chunks of a
// (held once in memory), and b's chunks.
func SharedChunks(a, b BIOSValues) (shared, chunks int) {
	for _, c := range b.chunks {
		for _, d := range a.chunks {
			if c == d {
				shared++
				break
			}
		}
	}
	return shared, len(b.chunks)
}
