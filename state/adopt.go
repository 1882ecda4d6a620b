package state

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// EventAdopted is written on both names when AdoptServer renames an
// auto-enrolled server to its servers.yaml name.
const EventAdopted EventKind = "server.adopted"

// AdoptServer gives the auto-enrolled server from the name to (its entry in
// servers.yaml after an operator renamed it in review): the record, with
// its lifecycle, hardware and history fields, moves to the key to in one
// transaction, and an EventAdopted event is written on both names. Events
// already recorded keep the old name. Tokens are bound to a server name, so
// a server with a token outstanding (commissioning or deploying) is refused:
// the caller waits until the ramdisk has reported.
//
// Errors: ErrNotFound (from), ErrExists (to), ErrInvalid (to is not a label,
// from was not auto-enrolled, or it is commissioning or deploying).
func (s *Store) AdoptServer(from, to, actor string) (Server, error) {
	if err := checkName("server", to); err != nil {
		return Server{}, fmt.Errorf("state: adopt server %s: %w", from, err)
	}
	if actor == "" {
		actor = ActorController
	}
	var out Server
	err := s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketServers)
		var srv Server
		if err := getJSON(b, from, &srv); err != nil {
			return err
		}
		if srv.Enrolled == nil {
			return fmt.Errorf("%s was not auto-enrolled: %w", from, ErrInvalid)
		}
		if srv.Lifecycle == LifecycleCommissioning || srv.Lifecycle == LifecycleDeploying {
			return fmt.Errorf("%s is %s (a token is outstanding): %w", from, srv.Lifecycle, ErrInvalid)
		}
		if b.Get([]byte(to)) != nil {
			return ErrExists
		}
		now := s.nowUTC()
		srv.Name = to
		srv.Revision++
		srv.UpdatedAt = now
		srv.InFlight = nil
		if err := putJSON(b, to, &srv); err != nil {
			return err
		}
		if err := b.Delete([]byte(from)); err != nil {
			return err
		}
		out = srv
		msg := fmt.Sprintf("auto-enrolled server %s adopted as %s (servers.yaml entry with boot MAC %s)", from, to, srv.BootMAC)
		if err := s.appendEvent(tx, &Event{Server: from, Kind: EventAdopted, Actor: actor, Message: msg}); err != nil {
			return err
		}
		return s.appendEvent(tx, &Event{Server: to, Kind: EventAdopted, Actor: actor, Message: msg})
	})
	if err != nil {
		return Server{}, fmt.Errorf("state: adopt server %s as %s: %w", from, to, err)
	}
	return out, nil
}
