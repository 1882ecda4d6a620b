package state

import (
	"encoding/json"
	"fmt"
)

// EventAdopted is written on both names when AdoptServer renames an
// auto-enrolled server to its servers.yaml name.
const EventAdopted EventKind = "server.adopted"

// AdoptServer gives the record of server from to the name to, when
// servers.yaml names its boot MAC under another name: an auto-enrolled
// server whose entry an operator renamed in review, or a server renamed in
// servers.yaml. The record, with its lifecycle, hardware and history
// fields, moves to the key to in one transaction, the hosts that run on it
// follow (Host.Server), and an EventAdopted event is written on both
// names. Events already recorded keep the old name. Tokens are bound to a
// server name, so a server with a token outstanding (commissioning or
// deploying) is refused: the caller waits until the ramdisk has reported.
//
// Errors: ErrNotFound (from), ErrExists (to), ErrInvalid (to is not a
// label, or from is commissioning or deploying).
func (s *Store) AdoptServer(from, to, actor string) (Server, error) {
	if err := checkName("server", to); err != nil {
		return Server{}, fmt.Errorf("state: adopt server %s: %w", from, err)
	}
	if actor == "" {
		actor = ActorController
	}
	var out Server
	err := s.update(func(tx kvTx) error {
		b := tx.Bucket(bucketServers)
		var srv Server
		if err := getJSON(b, from, &srv); err != nil {
			return err
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
		if err := s.putServer(b, to, &srv); err != nil {
			return err
		}
		if err := b.Delete([]byte(from)); err != nil {
			return err
		}
		out = srv
		hb := tx.Bucket(bucketHosts)
		var hosts []Host
		if err := hb.ForEach(func(k, v []byte) error {
			var h Host
			if err := json.Unmarshal(v, &h); err != nil {
				return fmt.Errorf("decode host %s: %w", k, err)
			}
			if h.Server == from {
				hosts = append(hosts, h)
			}
			return nil
		}); err != nil {
			return err
		}
		for _, h := range hosts {
			h.Server = to
			if err := putJSON(hb, h.Name, &h); err != nil {
				return err
			}
		}
		kind := "auto-enrolled server"
		if srv.Enrolled == nil {
			kind = "server"
		}
		msg := fmt.Sprintf("%s %s adopted as %s (servers.yaml entry with boot MAC %s)", kind, from, to, srv.BootMAC)
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
