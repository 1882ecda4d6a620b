package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Host liveness and fencing events. Server is the host's
// server when known; Message names the host.
const (
	EventHostLost           EventKind = "host.lost"            // MarkHostLost: no heartbeat for the lost window
	EventHostReturned       EventKind = "host.returned"        // Heartbeat: a lost host heartbeats again
	EventHostRebooted       EventKind = "host.rebooted"        // Heartbeat: the host's uptime restarted
	EventHostAgentRestarted EventKind = "host.agent_restarted" // Heartbeat: the node agent restarted (or changed version) on the same boot
	EventHostLostPower      EventKind = "host.lost_power"      // RecordLostPower: the lost host's server power as its BMC reads it
	EventHostFenced         EventKind = "host.fenced"          // FenceServer: powered off and read back off (Actor, Message: why)
	EventHostFenceFailed    EventKind = "host.fence_failed"    // a fence attempt that did not read back off, or a fenced host that heartbeats (the fence did not hold)
	EventHostFenceHeld      EventKind = "host.fence_held"      // auto-fence held by the safety brake
	EventHostUnfenced       EventKind = "host.unfenced"        // UnfenceServer: an operator cleared the fence
	// EventHostHeartbeatLimited: a host heartbeated faster than its
	// per-host limit and was answered 429 (RecordRefusal, paced).
	EventHostHeartbeatLimited EventKind = "host.heartbeat_limited"
)

// HostLoss is a host that stopped heartbeating (condition HostLost).
type HostLoss struct {
	// Since is the last heartbeat before the silence (UTC).
	Since time.Time `json:"since"`
	// Detected is when the controller marked the host lost (UTC).
	Detected time.Time `json:"detected"`
	// Power is the host's server power as its BMC read it after the loss
	// ("powered_on", "powered_off"), "" until read; PowerError says why
	// it could not be read.
	Power      Power     `json:"power,omitempty"`
	PowerAt    time.Time `json:"powerAt,omitzero"`
	PowerError string    `json:"powerError,omitempty"`
}

// Fencing records that a server was fenced: powered off and read back
// off, through its BMC or a separate fencing device. While set, the
// reconciler never powers the server on (an operator clears it with
// UnfenceServer).
type Fencing struct {
	At     time.Time `json:"at"`
	Actor  string    `json:"actor"`  // admin token name, or ActorController for auto-fence
	Reason string    `json:"reason"` // the operator's reason, or the auto-fence's
	Host   string    `json:"host,omitempty"`
	// Device says what powered it off: "bmc" or "fence ipmi ADDRESS" /
	// "fence redfish ADDRESS".
	Device string `json:"device"`
	Auto   bool   `json:"auto,omitempty"`
}

// Heartbeat is what one node heartbeat says: how long the host has been
// up and the node agent running, and the agent's version. Zero values
// come from older agents.
type Heartbeat struct {
	Uptime      time.Duration
	AgentUptime time.Duration
	// AgentStarted is the agent process's start by the host's clock
	// (fixed per process): another value is another process.
	AgentStarted time.Time
	AgentVersion string
}

// HeartbeatResult says what a heartbeat changed.
type HeartbeatResult struct {
	Returned       bool          // the host was lost and is back
	LostFor        time.Duration // how long it was silent, when Returned
	Rebooted       bool          // its uptime restarted since the last heartbeat
	AgentRestarted bool          // same boot, the node agent restarted
	OldVersion     string        // the agent version before, when it changed
	// FenceNotHeld: the host is fenced (its power read back off) and
	// heartbeats all the same; nothing else of the heartbeat was
	// recorded. FenceNotHeldFirst: the first such heartbeat since the
	// fence, the one that wrote the EventHostFenceFailed.
	FenceNotHeld      bool
	FenceNotHeldFirst bool
	// FencedBeat: the heartbeat came from a fenced host (whether or not it
	// proved the fence did not hold: the first one since the fence may
	// have been in flight, see Host.FencedBeat).
	FencedBeat bool
	// Summarised: the reboot or agent restart was counted into the host's
	// paced summary (another was written in this interval), not written
	// as its own event: the caller logs nothing for it either.
	Summarised bool
}

// bootSlack is how far two estimates of one boot (or agent start) time may
// differ before they count as two: heartbeats' request latency and
// /proc/uptime's rounding stay far below it.
const bootSlack = 15 * time.Second

// RecordHeartbeat records a heartbeat of host that arrived at now:
// LastSeen, the boot and agent start times (now minus the uptimes) and the
// agent version. It clears the host's loss (EventHostReturned) and writes
// EventHostRebooted when the boot time moved, or EventHostAgentRestarted
// when only the agent's start (or its version) did; all in one
// transaction, which it returns after.
//
// now is when the heartbeat arrived (the join listener stamps it at
// receipt), and liveness is decided from it, not from when the write
// commits: from the call until its write commits or fails, MarkHostLost
// counts the host as heard at now (a heartbeat waiting behind other
// writes is not a silence). Heartbeats have their own write path: on bbolt
// concurrent heartbeats share commits (group commit, at most
// heartbeatGroup per commit, never with other writes); on etcd, whose
// engine serialises the process's writes in bounded shared transactions,
// they queue with the others. A heartbeat that changes only the
// host's liveness and uptimes wakes no Notify listener (the reconciler
// plans nothing from it); a return, a reboot, an agent restart or a
// fenced host's heartbeat does.
//
// A heartbeat from a fenced host is not a return. The first one since
// the fence is only noted (Host.FencedBeat): it may have left the host
// before its power went off. From the second one on the fence did not
// hold: it sets the host's FenceNotHeld condition (counting the first;
// the second writes an EventHostFenceFailed, the condition counts the
// rest). Either way it sets LastSeen, keeps the fence and any loss as
// they were, and records nothing else of the heartbeat (res.FencedBeat,
// res.FenceNotHeld).
//
// Reboots and agent restarts are machine-reported anomalies, paced per
// host and kind (anomalies.go): only the first of an interval is written
// with the heartbeat, the rest go into the interval's summary event
// (res.Summarised). Errors: ErrNotFound.
func (s *Store) RecordHeartbeat(host string, now time.Time, hb Heartbeat) (HeartbeatResult, error) {
	var res HeartbeatResult
	var paced []pacedAnomaly
	now = now.UTC()
	s.arrivals.note(host, now)
	defer s.arrivals.written(host, now)
	err := s.writeHeartbeat(func(tx kvTx) error {
		res = HeartbeatResult{} // fn may run again (etcd retries a conflicting transaction, a group commit reruns)
		paced = paced[:0]
		b := tx.Bucket(bucketHosts)
		var h Host
		if err := getJSON(b, host, &h); err != nil {
			return err
		}
		var evs []Event
		if h.Fenced != nil {
			evs = fenceNotHeld(&h, host, now, &res)
		} else {
			evs = observeHeartbeat(&h, host, now, hb, &res)
		}
		h.LastSeen = now
		for i := range evs {
			if k := evs[i].Kind; k == EventHostRebooted || k == EventHostAgentRestarted {
				key := refusalKey{server: h.Server, kind: k, host: host}
				a := pacedAnomaly{key: key, message: evs[i].Message, written: !s.anomalies.hot(key)}
				paced = append(paced, a)
				if !a.written {
					res.Summarised = true
					continue
				}
			}
			if err := s.appendEvent(tx, &evs[i]); err != nil {
				return err
			}
		}
		return putJSON(b, host, &h)
	})
	if err != nil {
		return HeartbeatResult{}, fmt.Errorf("state: heartbeat %s: %w", host, err)
	}
	if res.Returned || res.Rebooted || res.AgentRestarted || res.FencedBeat {
		s.wake()
	}
	s.settleAnomalies(paced)
	if res.FenceNotHeld {
		s.countAnomaly(EventHostFenceFailed)
	}
	return res, nil
}

// heartbeatGroup bounds the heartbeats one bbolt commit takes (a fleet of
// 10,000 hosts at a 30 s interval sends about 333 a second).
const heartbeatGroup = 256

// writeHeartbeat commits fn on the heartbeats' own path: their group
// committer on bbolt, the engine's update on etcd. It wakes no
// Notify listener (RecordHeartbeat does when the heartbeat changed more
// than liveness). fn may run more than once.
func (s *Store) writeHeartbeat(fn func(tx kvTx) error) error {
	if s.beats != nil {
		return s.beats.run(fn)
	}
	return s.eng.update(fn)
}

// beatArrivals holds, per host, when its latest heartbeat arrived, from
// RecordHeartbeat's call until that heartbeat's write committed or failed:
// what MarkHostLost counts on top of the stored LastSeen.
type beatArrivals struct {
	mu sync.Mutex
	m  map[string]time.Time
}

// note records that a heartbeat of host arrived at at (the latest wins).
func (a *beatArrivals) note(host string, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = map[string]time.Time{}
	}
	if cur, ok := a.m[host]; !ok || at.After(cur) {
		a.m[host] = at
	}
}

// written forgets the arrival at at of host once its write is done,
// unless a later heartbeat arrived meanwhile.
func (a *beatArrivals) written(host string, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if cur, ok := a.m[host]; ok && !cur.After(at) {
		delete(a.m, host)
	}
}

// pending returns when host's latest heartbeat not yet written arrived.
func (a *beatArrivals) pending(host string) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	at, ok := a.m[host]
	return at, ok
}

// fenceNotHeld records a heartbeat of the fenced host h (named host) at
// now: the first since the fence in Host.FencedBeat only (it may have been
// in flight), the later ones on its FenceNotHeld condition; it returns the
// EventHostFenceFailed of the second one since the fence. Nothing else of
// the heartbeat is recorded: the fence and any loss stay.
func fenceNotHeld(h *Host, host string, now time.Time, res *HeartbeatResult) []Event {
	f := h.Fenced
	res.FencedBeat = true
	if h.FenceNotHeld == nil && h.FencedBeat.IsZero() {
		h.FencedBeat = now // perhaps in flight at the fence: wait for the next
		return nil
	}
	res.FenceNotHeld = true
	var evs []Event
	if h.FenceNotHeld == nil {
		res.FenceNotHeldFirst = true
		h.FenceNotHeld = &FenceNotHeld{Since: h.FencedBeat, Heartbeats: 1}
		evs = append(evs, Event{Server: h.Server, Kind: EventHostFenceFailed, Actor: ActorController,
			Message: fmt.Sprintf("host %s heartbeats while fenced (fenced %s by %s through %s, power read back off): the fence did not hold; "+
				"the host runs, check its power and the fencing device before unfencing", host, f.At.Format(time.RFC3339), f.Actor, f.Device)})
	}
	h.FenceNotHeld.Last = now
	h.FenceNotHeld.Heartbeats++ // the condition, not more events, carries the rest
	return evs
}

// observeHeartbeat applies heartbeat hb of host h (named host) at now:
// a return from loss, the boot and agent start times, the agent version;
// it returns the events of what changed (returned, rebooted, agent
// restarted).
func observeHeartbeat(h *Host, host string, now time.Time, hb Heartbeat, res *HeartbeatResult) []Event {
	var evs []Event
	if h.Lost != nil {
		res.Returned, res.LostFor = true, now.Sub(h.Lost.Since)
		evs = append(evs, Event{Server: h.Server, Kind: EventHostReturned,
			Message: fmt.Sprintf("host %s heartbeats again after %s of silence", host, res.LostFor.Round(time.Second))})
		h.Lost = nil
	}
	// Uptimes are monotonic within a boot and within an agent
	// process: one smaller than the last heartbeat's is a reboot (or
	// an agent restart) whatever the clocks say. A boot time that
	// moved later also is (a host silent for longer than it was up).
	if hb.Uptime > 0 {
		boot := now.Add(-hb.Uptime).Truncate(time.Second)
		if h.Uptime > 0 && (hb.Uptime < h.Uptime || (!h.BootedAt.IsZero() && boot.Sub(h.BootedAt) > bootSlack)) {
			res.Rebooted = true
			evs = append(evs, Event{Server: h.Server, Kind: EventHostRebooted,
				Message: fmt.Sprintf("host %s rebooted: up since %s (was up since %s)", host, boot.Format(time.RFC3339), h.BootedAt.Format(time.RFC3339))})
		}
		h.BootedAt, h.Uptime = boot, hb.Uptime
	}
	if hb.AgentUptime > 0 {
		start := now.Add(-hb.AgentUptime).Truncate(time.Second)
		moved := h.AgentUptime > 0 && (hb.AgentUptime < h.AgentUptime || (!h.AgentStartedAt.IsZero() && start.Sub(h.AgentStartedAt) > bootSlack))
		moved = moved || (!h.AgentProcessStart.IsZero() && !hb.AgentStarted.IsZero() && !hb.AgentStarted.Equal(h.AgentProcessStart))
		changed := h.AgentVersion != "" && hb.AgentVersion != "" && hb.AgentVersion != h.AgentVersion
		if !res.Rebooted && (moved || changed) {
			res.AgentRestarted = true
			msg := fmt.Sprintf("host %s: node agent restarted on the same boot (up since %s)", host, h.BootedAt.Format(time.RFC3339))
			if changed {
				res.OldVersion = h.AgentVersion
				msg += fmt.Sprintf(", version %s → %s", h.AgentVersion, hb.AgentVersion)
			}
			evs = append(evs, Event{Server: h.Server, Kind: EventHostAgentRestarted, Message: msg})
		}
		h.AgentStartedAt, h.AgentUptime = start, hb.AgentUptime
	}
	if !hb.AgentStarted.IsZero() {
		h.AgentProcessStart = hb.AgentStarted.UTC()
	}
	if hb.AgentVersion != "" {
		h.AgentVersion = hb.AgentVersion
	}
	return evs
}

// ErrNotLost is returned by MarkHostLost when the host heartbeated after
// the cutoff (it is not lost), and by RecordLostPower when it is not lost.
var ErrNotLost = errors.New("host is not lost")

// MarkHostLost marks host lost at now if its last heartbeat arrived before
// cutoff (compare-and-set: a heartbeat that lands first wins, ErrNotLost),
// writing EventHostLost. The last heartbeat is the later of the stored
// LastSeen and a heartbeat that arrived and is still being written
// (RecordHeartbeat): a host whose heartbeat waits behind other writes is
// not lost. A host already lost is left alone (nil, changed false).
// Errors: ErrNotFound, ErrNotLost.
func (s *Store) MarkHostLost(host string, cutoff, now time.Time) (changed bool, err error) {
	err = s.update(func(tx kvTx) error {
		changed = false // fn may run again (etcd retries a conflicting transaction)
		b := tx.Bucket(bucketHosts)
		var h Host
		if err := getJSON(b, host, &h); err != nil {
			return err
		}
		if h.Lost != nil {
			return nil
		}
		if !h.LastSeen.Before(cutoff) {
			return ErrNotLost
		}
		if at, ok := s.arrivals.pending(host); ok && !at.Before(cutoff) {
			return ErrNotLost // arrived in time, its write queued behind others
		}
		since := h.LastSeen
		if since.IsZero() {
			since = h.JoinedAt
		}
		h.Lost = &HostLoss{Since: since.UTC(), Detected: now.UTC()}
		changed = true
		e := Event{Server: h.Server, Kind: EventHostLost,
			Message: fmt.Sprintf("host %s lost: no heartbeat since %s (%s)", host, since.UTC().Format(time.RFC3339), now.Sub(since).Round(time.Second))}
		if err := s.appendEvent(tx, &e); err != nil {
			return err
		}
		return putJSON(b, host, &h)
	})
	if err != nil {
		return false, fmt.Errorf("state: mark host %s lost: %w", host, err)
	}
	return changed, nil
}

// RecordLostPower records the power of a lost host's server as read at
// at (p "" with readErr set when the read failed), writing
// EventHostLostPower when it changed ("lost, powered on"). Errors:
// ErrNotFound, ErrNotLost.
func (s *Store) RecordLostPower(host string, at time.Time, p Power, readErr string) error {
	err := s.update(func(tx kvTx) error {
		b := tx.Bucket(bucketHosts)
		var h Host
		if err := getJSON(b, host, &h); err != nil {
			return err
		}
		if h.Lost == nil {
			return ErrNotLost
		}
		was, wasErr := h.Lost.Power, h.Lost.PowerError
		h.Lost.Power, h.Lost.PowerAt, h.Lost.PowerError = p, at.UTC(), readErr
		if p != was || (p == "" && readErr != wasErr) {
			e := Event{Server: h.Server, Kind: EventHostLostPower, Power: p, Message: "host " + host + " " + h.Lost.Describe()}
			if err := s.appendEvent(tx, &e); err != nil {
				return err
			}
		}
		return putJSON(b, host, &h)
	})
	if err != nil {
		return fmt.Errorf("state: record lost host %s power: %w", host, err)
	}
	return nil
}

// Describe renders the loss for people: "lost, powered on", "lost,
// powered off", "lost, power unknown (why)" or "lost, power not read yet".
func (l *HostLoss) Describe() string {
	switch {
	case l == nil:
		return ""
	case l.Power == PowerOn:
		return "lost, powered on"
	case l.Power == PowerOff:
		return "lost, powered off"
	case l.PowerError != "":
		return "lost, power unknown (" + l.PowerError + ")"
	}
	return "lost, power not read yet"
}

// FenceServer records that server was fenced (f), on the server and on
// every host running on it, with an EventHostFenced naming the actor and
// the reason, in one transaction. The server's power is recorded off.
// Errors: ErrNotFound, ErrInvalid (no actor or reason).
func (s *Store) FenceServer(server string, f Fencing) (Server, error) {
	if f.Actor == "" || f.Reason == "" {
		return Server{}, fmt.Errorf("state: fence %s: actor and reason are required: %w", server, ErrInvalid)
	}
	f.At = s.nowUTC()
	var out Server
	err := s.update(func(tx kvTx) error {
		b := tx.Bucket(bucketServers)
		var srv Server
		if err := getJSON(b, server, &srv); err != nil {
			return err
		}
		srv.Fenced = &f
		srv.Power = PowerStatus{State: PowerOff, Source: PowerSourceBMC, At: f.At}
		srv.Revision++
		srv.UpdatedAt = f.At
		if err := s.putServer(b, server, &srv); err != nil {
			return err
		}
		out = srv
		if err := s.setHostsFenced(tx, server, &f); err != nil {
			return err
		}
		how := "by " + f.Actor
		if f.Auto {
			how = "automatically"
		}
		e := Event{Server: server, Kind: EventHostFenced, Actor: f.Actor, Power: PowerOff,
			Message: fmt.Sprintf("host %s fenced %s through %s, power read back off: %s", orServer(f.Host, server), how, f.Device, f.Reason)}
		return s.appendEvent(tx, &e)
	})
	if err != nil {
		return Server{}, fmt.Errorf("state: fence %s: %w", server, err)
	}
	return out, nil
}

// UnfenceServer clears server's fence (the reconciler may power it on
// again), on the server and its hosts, with an EventHostUnfenced. A server
// not fenced is left alone (changed false). Errors: ErrNotFound,
// ErrInvalid (no actor or reason).
func (s *Store) UnfenceServer(server, actor, reason string) (changed bool, err error) {
	if actor == "" || reason == "" {
		return false, fmt.Errorf("state: unfence %s: actor and reason are required: %w", server, ErrInvalid)
	}
	err = s.update(func(tx kvTx) error {
		changed = false // fn may run again (etcd retries a conflicting transaction)
		b := tx.Bucket(bucketServers)
		var srv Server
		if err := getJSON(b, server, &srv); err != nil {
			return err
		}
		if srv.Fenced == nil {
			return nil
		}
		was := srv.Fenced
		srv.Fenced = nil
		srv.Revision++
		srv.UpdatedAt = s.nowUTC()
		if err := s.putServer(b, server, &srv); err != nil {
			return err
		}
		changed = true
		if err := s.setHostsFenced(tx, server, nil); err != nil {
			return err
		}
		e := Event{Server: server, Kind: EventHostUnfenced, Actor: actor,
			Message: fmt.Sprintf("host %s unfenced by %s (fenced %s by %s): %s", orServer(was.Host, server), actor, was.At.Format(time.RFC3339), was.Actor, reason)}
		return s.appendEvent(tx, &e)
	})
	if err != nil {
		return false, fmt.Errorf("state: unfence %s: %w", server, err)
	}
	return changed, nil
}

func (s *Store) setHostsFenced(tx kvTx, server string, f *Fencing) error {
	b := tx.Bucket(bucketHosts)
	var names []string
	if err := b.ForEach(func(k, v []byte) error {
		var h Host
		if err := json.Unmarshal(v, &h); err != nil {
			return err
		}
		if h.Server == server {
			names = append(names, h.Name)
		}
		return nil
	}); err != nil {
		return err
	}
	for _, n := range names {
		var h Host
		if err := getJSON(b, n, &h); err != nil {
			return err
		}
		h.Fenced = f
		h.FenceNotHeld, h.FencedBeat = nil, time.Time{} // a new fence is read back again; an unfence ends the question
		if err := putJSON(b, n, &h); err != nil {
			return err
		}
	}
	return nil
}

func orServer(host, server string) string {
	if host != "" {
		return host
	}
	return "on server " + server
}
