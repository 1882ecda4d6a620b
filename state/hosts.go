package state

import (
	"encoding/json"
	"fmt"
	"time"
)

// Host is a joined hypervisor host (docs/architecture.md "Flow" step 5).
type Host struct {
	Name            string    `json:"name"`             // RFC 1123 label
	Server          string    `json:"server,omitempty"` // the server it runs on, when known
	Site            string    `json:"site,omitempty"`
	Rack            string    `json:"rack,omitempty"`
	Tags            []string  `json:"tags,omitempty"`
	CertFingerprint string    `json:"certFingerprint,omitempty"` // SHA-256 of the node certificate, hex
	JoinedAt        time.Time `json:"joinedAt"`
	LastSeen        time.Time `json:"lastSeen,omitzero"`
	// JoinStatus is the outcome of the last join: "joining" while the node
	// applies networks and pools, then "joined" or "failed".
	JoinStatus string `json:"joinStatus,omitempty"`
	// JoinReason says why the last join failed (empty otherwise).
	JoinReason string `json:"joinReason,omitempty"`
	// Networks and StoragePools are the names the node reported applied
	// in its last join, in report order.
	Networks     []string `json:"networks,omitempty"`
	StoragePools []string `json:"storagePools,omitempty"`
	// BootedAt is when the host last booted (heartbeat time minus its
	// uptime), AgentStartedAt when its node agent started, AgentVersion
	// the agent's version: zero from agents that do not say.
	BootedAt       time.Time `json:"bootedAt,omitzero"`
	AgentStartedAt time.Time `json:"agentStartedAt,omitzero"`
	AgentVersion   string    `json:"agentVersion,omitempty"`
	// Uptime and AgentUptime are the last heartbeat's: one smaller than
	// these tells a reboot or an agent restart.
	Uptime      time.Duration `json:"uptimeNs,omitempty"`
	AgentUptime time.Duration `json:"agentUptimeNs,omitempty"`
	// AgentProcessStart is the agent process's start as it reports it
	// (its host's clock).
	AgentProcessStart time.Time `json:"agentProcessStart,omitzero"`
	// Lost is set while the host misses its heartbeats (MarkHostLost),
	// cleared by its next heartbeat.
	Lost *HostLoss `json:"lost,omitempty"`
	// Fenced mirrors its server's fence (FenceServer), nil when none.
	Fenced *Fencing `json:"fenced,omitempty"`
	// FenceNotHeld is set when the host heartbeats while fenced
	// (RecordHeartbeat): its power read back off, yet its node agent
	// runs, so the fence did not hold (a fencing device that drives
	// another machine, a BMC that reports off while the host runs, a
	// power-off that did not reach the host). Cleared by a new fence or an
	// unfence; nil otherwise.
	FenceNotHeld *FenceNotHeld `json:"fenceNotHeld,omitempty"`
	// FencedBeat is when the first heartbeat since the fence arrived
	// (UTC), zero when none did. That one heartbeat may have left the host
	// before its power went off and reached the controller after the fence
	// was read back (a request in flight, or queued behind a busy
	// controller), so alone it proves nothing; the node agent sends its
	// next heartbeat only after that one was answered, so a second one was
	// sent after the fence and sets FenceNotHeld. Cleared with it.
	FencedBeat time.Time `json:"fencedBeat,omitzero"`
}

// FenceNotHeld records heartbeats from a fenced host (condition
// FenceFailed): the first and last one's times (UTC) and how many.
type FenceNotHeld struct {
	Since      time.Time `json:"since"`
	Last       time.Time `json:"last"`
	Heartbeats int64     `json:"heartbeats"`
}

// JoinLogEntry is one line of a host's join log (networks and storage
// pools applied, validation results).
type JoinLogEntry struct {
	Seq     uint64    `json:"seq"` // per host, assigned by AppendJoinLog
	At      time.Time `json:"at"`  // assigned by AppendJoinLog (UTC)
	Level   string    `json:"level,omitempty"`
	Step    string    `json:"step,omitempty"`
	Message string    `json:"message"`
}

// PutHost creates or replaces a host record. A zero JoinedAt is set to now.
// Errors: ErrInvalid.
func (s *Store) PutHost(h Host) (Host, error) {
	if err := checkName("host", h.Name); err != nil {
		return Host{}, fmt.Errorf("state: put host: %w", err)
	}
	if h.JoinedAt.IsZero() {
		h.JoinedAt = s.nowUTC()
	}
	err := s.update(func(tx kvTx) error { return putJSON(tx.Bucket(bucketHosts), h.Name, &h) })
	if err != nil {
		return Host{}, fmt.Errorf("state: put host %s: %w", h.Name, err)
	}
	return h, nil
}

// Host returns the named host, or ErrNotFound.
func (s *Store) Host(name string) (Host, error) {
	var h Host
	err := s.view(func(tx kvTx) error { return getJSON(tx.Bucket(bucketHosts), name, &h) })
	if err != nil {
		return Host{}, fmt.Errorf("state: get host %s: %w", name, err)
	}
	return h, nil
}

// Hosts lists every host ordered by name.
func (s *Store) Hosts() ([]Host, error) {
	var out []Host
	err := s.view(func(tx kvTx) error {
		return tx.Bucket(bucketHosts).ForEach(func(k, v []byte) error {
			var h Host
			if err := json.Unmarshal(v, &h); err != nil {
				return fmt.Errorf("decode host %s: %w", k, err)
			}
			out = append(out, h)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("state: list hosts: %w", err)
	}
	return out, nil
}

// AppendJoinLog appends e to the named host's join log, assigning Seq and
// At. The host need not exist yet (logging starts before the record).
func (s *Store) AppendJoinLog(host string, e JoinLogEntry) (JoinLogEntry, error) {
	if err := checkName("host", host); err != nil {
		return JoinLogEntry{}, fmt.Errorf("state: append join log: %w", err)
	}
	err := s.update(func(tx kvTx) error {
		b, err := tx.Bucket(bucketJoinLogs).CreateBucketIfNotExists([]byte(host))
		if err != nil {
			return err
		}
		seq, err := b.NextSequence()
		if err != nil {
			return err
		}
		e.Seq, e.At = seq, s.nowUTC()
		data, err := json.Marshal(&e)
		if err != nil {
			return err
		}
		return b.Put(u64(seq), data)
	})
	if err != nil {
		return JoinLogEntry{}, fmt.Errorf("state: append join log %s: %w", host, err)
	}
	return e, nil
}

// JoinLog returns the named host's join log in order (empty if none).
func (s *Store) JoinLog(host string) ([]JoinLogEntry, error) {
	var out []JoinLogEntry
	err := s.view(func(tx kvTx) error {
		b := tx.Bucket(bucketJoinLogs).Bucket([]byte(host))
		if b == nil {
			return nil
		}
		return b.ForEach(func(_, v []byte) error {
			var e JoinLogEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return err
			}
			out = append(out, e)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("state: join log %s: %w", host, err)
	}
	return out, nil
}

// Host join statuses set by the controller when the server under a host
// goes away (ForgetHostsOf): the disk was wiped on release, or the server
// was retired.
const (
	HostReleased = "released"
	HostRetired  = "retired"
)

// ForgetHostsOf marks every host running on server with status
// (HostReleased or HostRetired) and reason, and forgets its node
// certificate's fingerprint, so the join listener refuses that node's
// certificate from then on (a wiped or retired machine's identity must not
// come back); a new deploy joins afresh. It records one EventHostForgotten
// event per host changed and returns their names, all in one transaction.
// Hosts already in status are left alone. A lifecycle move that gives the
// server back does the same in its own transaction (Move.ForgetHosts).
// Errors: ErrInvalid (another status), the store's.
func (s *Store) ForgetHostsOf(server, status, reason string) ([]string, error) {
	if status != HostReleased && status != HostRetired {
		return nil, fmt.Errorf("state: forget hosts of %s: status %q: %w", server, status, ErrInvalid)
	}
	var done []string
	err := s.update(func(tx kvTx) error {
		var err error
		done, err = s.forgetHostsTx(tx, server, status, reason)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("state: forget hosts of %s: %w", server, err)
	}
	return done, nil
}

// forgetHostsTx is ForgetHostsOf inside tx.
func (s *Store) forgetHostsTx(tx kvTx, server, status, reason string) ([]string, error) {
	b := tx.Bucket(bucketHosts)
	var hosts []Host
	if err := b.ForEach(func(k, v []byte) error {
		var h Host
		if err := json.Unmarshal(v, &h); err != nil {
			return fmt.Errorf("decode host %s: %w", k, err)
		}
		if h.Server == server && h.JoinStatus != status {
			hosts = append(hosts, h)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	var done []string
	for _, h := range hosts {
		h.JoinStatus, h.JoinReason, h.CertFingerprint = status, reason, ""
		h.Lost = nil // no heartbeats are expected from it any more
		if err := putJSON(b, h.Name, &h); err != nil {
			return nil, err
		}
		e := Event{Server: server, Kind: EventHostForgotten, Message: "host " + h.Name + " " + status + ": " + reason}
		if err := s.appendEvent(tx, &e); err != nil {
			return nil, err
		}
		done = append(done, h.Name)
	}
	return done, nil
}
