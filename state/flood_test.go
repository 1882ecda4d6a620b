package state_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/state"
)

// TestHeartbeatFloodKeepsAuditAndHistory: a joined host that reports a
// reboot on every heartbeat (its uptime goes backwards each time) cannot
// push the audit events (a secret set, an admin token created, moves
// made through the API by a person) nor a server's lifecycle history out
// of the event log: the anomalies are paced per host and kind (the first
// written, the rest summarised when the interval ends), and audit events
// are kept apart under their own retention. Both engines.
//
// Before the pacing and the audit log, every one of the 1,000 heartbeats
// wrote a host.rebooted event into a log capped at 100: nothing else
// survived.
func TestHeartbeatFloodKeepsAuditAndHistory(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		clk := newClock()
		s := openTest(t, state.Options{Now: clk.Now, NoSync: true, Retention: state.Retention{MaxEvents: 100}})
		// Audit: what people did.
		if _, err := s.PutSecret("bmc-default", state.Credential{Username: "admin", Password: "pw"}, "alice"); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.CreateAdminToken("ci", "alice"); err != nil {
			t.Fatal(err)
		}
		mustCreate(t, s, state.Server{Name: "web1"})
		for _, m := range []state.Move{{From: state.LifecycleNew, To: state.LifecycleCommissioning}, {From: state.LifecycleCommissioning, To: state.LifecycleReady}} {
			m.Server = "web1" // the controller's moves: machine history
			if _, err := s.Apply(m); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.Apply(state.Move{Server: "web1", From: state.LifecycleReady, To: state.LifecycleRetired, Actor: "bob", Reason: "decommissioned"}); err != nil {
			t.Fatal(err)
		}
		before := allEvents(t, s, state.EventQuery{})
		history := allEvents(t, s, state.EventQuery{Server: "web1"})

		mustCreate(t, s, state.Server{Name: "hv"})
		if _, err := s.PutHost(state.Host{Name: "hv1", Server: "hv", CertFingerprint: "fp", JoinStatus: "joined"}); err != nil {
			t.Fatal(err)
		}
		const beats = 1000
		rebooted := 0
		for i := range beats {
			clk.Advance(10 * time.Millisecond)
			up := time.Duration(beats-i) * time.Second // backwards every time
			res, err := s.RecordHeartbeat("hv1", clk.Now(), state.Heartbeat{Uptime: up, AgentUptime: up})
			if err != nil {
				t.Fatal(err)
			}
			if res.Rebooted {
				rebooted++
			}
		}
		if rebooted != beats-1 {
			t.Fatalf("%d heartbeats read as reboots, want %d (every one after the first)", rebooted, beats-1)
		}
		if err := s.FlushAnomalies(); err != nil {
			t.Fatal(err)
		}
		after := allEvents(t, s, state.EventQuery{})
		var flood []state.Event
		for _, e := range after {
			if e.Seq > before[len(before)-1].Seq && e.Kind == state.EventHostRebooted {
				flood = append(flood, e)
			}
		}
		// One written at once, one summary at the flush (more only if the
		// one-minute interval ended during the loop).
		if len(flood) < 2 || len(flood) > 4 {
			t.Errorf("%d host.rebooted events for %d reboots, want 2 (the first, then one summary)", len(flood), beats-1)
		}
		if got := flood[len(flood)-1].Message; len(flood) == 2 && !strings.Contains(got, fmt.Sprintf("%d more", beats-2)) {
			t.Errorf("summary %q does not count the %d held reboots", got, beats-2)
		}
		if n := s.AnomalyCounts()[state.EventHostRebooted]; n != beats-1 {
			t.Errorf("AnomalyCounts[host.rebooted] = %d, want %d", n, beats-1)
		}
		for _, e := range before {
			if !hasSeq(after, e.Seq) {
				t.Errorf("event lost to the flood: %+v", e)
			}
		}
		if got := allEvents(t, s, state.EventQuery{Server: "web1"}); len(got) != len(history) {
			t.Errorf("web1's history after the flood = %d events, want its %d", len(got), len(history))
		}
		// Ascending Seq across both logs.
		for i := 1; i < len(after); i++ {
			if after[i].Seq <= after[i-1].Seq {
				t.Fatalf("events out of order at %d: %d after %d", i, after[i].Seq, after[i-1].Seq)
			}
		}
	})
}

// TestAuditEventsOutliveMachineEvents: audit events (a person or an admin
// token acted) have their own retention: machine and controller events
// past Retention.MaxEvents evict only their own kind, the audit log keeps
// MaxAuditEvents, and Events still shows both merged in Seq order, for
// the whole log and for one server. Both engines.
func TestAuditEventsOutliveMachineEvents(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{NoSync: true, Retention: state.Retention{MaxEvents: 20, MaxPerServer: 10, MaxAuditEvents: 5}})
		mustCreate(t, s, state.Server{Name: "n1"})
		var audit []uint64
		for i := range 7 {
			e, err := s.AppendEvent(state.Event{Server: "n1", Actor: "ops", Message: fmt.Sprintf("by hand %d", i)})
			if err != nil {
				t.Fatal(err)
			}
			audit = append(audit, e.Seq)
			for j := range 10 {
				if _, err := s.AppendEvent(state.Event{Server: "n1", Actor: state.ActorController, Message: fmt.Sprintf("machine %d.%d", i, j)}); err != nil {
					t.Fatal(err)
				}
			}
		}
		all := allEvents(t, s, state.EventQuery{})
		mine := allEvents(t, s, state.EventQuery{Server: "n1"})
		for _, got := range [][]state.Event{all, mine} {
			var a []uint64
			machine := 0
			for i, e := range got {
				if i > 0 && e.Seq <= got[i-1].Seq {
					t.Fatalf("not in Seq order: %d after %d", e.Seq, got[i-1].Seq)
				}
				if e.IsAudit() {
					a = append(a, e.Seq)
				} else {
					machine++
				}
			}
			if fmt.Sprint(a) != fmt.Sprint(audit[2:]) {
				t.Errorf("audit events %v, want the newest 5 %v", a, audit[2:])
			}
			if machine != 10 { // MaxPerServer bounds n1's machine events below MaxEvents
				t.Errorf("%d machine events, want 10 (MaxPerServer)", machine)
			}
		}
	})
}

func hasSeq(evs []state.Event, seq uint64) bool {
	for _, e := range evs {
		if e.Seq == seq {
			return true
		}
	}
	return false
}

// TestOpenMovesLegacyAuditEvents: audit events a build before the audit
// log stored in the shared log are moved to the audit log at the next
// Open (once; both engines), with their Seq, so later machine events
// cannot evict them either; machine events stay where they were.
func TestOpenMovesLegacyAuditEvents(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state.db")
		s, err := openEngine(t, path, state.Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		mustCreate(t, s, state.Server{Name: "n1"})
		var legacy []state.Event
		for i := range 20 { // more than one transaction of the move
			e, err := state.PutLegacyEvent(s, state.Event{Server: "n1", Kind: state.EventTransition, Actor: "ops", Message: fmt.Sprintf("by hand %d", i)})
			if err != nil {
				t.Fatal(err)
			}
			legacy = append(legacy, e)
			if _, err := state.PutLegacyEvent(s, state.Event{Server: "n1", Actor: state.ActorController, Message: "machine"}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = openAt(t, path, state.Options{NoSync: true, Retention: state.Retention{MaxEvents: 5}})
		for range 30 {
			if _, err := s.AppendEvent(state.Event{Server: "n1", Actor: state.ActorController, Message: "after"}); err != nil {
				t.Fatal(err)
			}
		}
		got := allEvents(t, s, state.EventQuery{Server: "n1"})
		for _, e := range legacy {
			if !hasSeq(got, e.Seq) {
				t.Errorf("legacy audit event %d (%s) evicted: it was not moved to the audit log", e.Seq, e.Message)
			}
		}
		if len(got) != len(legacy)+5 {
			t.Errorf("%d events of n1, want the %d audit events and 5 machine events (MaxEvents)", len(got), len(legacy))
		}
	})
}
