package state

import (
	"fmt"
)

// UpdateServerWithEvent applies fn to the server's record and appends the
// event fn returns, in one transaction: both are written or neither (the
// controller records a failed step's error, its backoff and its event
// this way). The event's Server is set to name and a zero Kind means
// EventNote. fn may run more than once (the etcd engine retries a
// conflicting transaction), each time on the record as stored. Errors:
// ErrNotFound for an unknown server, fn's error, and those of UpdateServer.
func (s *Store) UpdateServerWithEvent(name string, fn func(*Server) (Event, error)) (Server, Event, error) {
	var (
		out Server
		ev  Event
	)
	err := s.update(func(tx kvTx) error {
		var err error
		out, err = s.updateServerTx(tx, name, func(srv *Server) error {
			e, err := fn(srv)
			ev = e
			return err
		})
		if err != nil {
			return err
		}
		ev.Server = name
		if ev.Kind == "" {
			ev.Kind = EventNote
		}
		return s.appendEvent(tx, &ev)
	})
	if err != nil {
		return Server{}, Event{}, fmt.Errorf("state: update server %s with event: %w", name, err)
	}
	return out, ev, nil
}
