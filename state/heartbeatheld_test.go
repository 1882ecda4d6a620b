package state_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/machina-metal/machina/state"
)

// heldHost opens a store with a joined host h1 last heard at the clock's
// now (and joined hosts h2 ... hN not heard yet, for more), and a gate in
// front of its writes.
func heldHost(t *testing.T, more ...int) (*state.Store, *clock, *state.WriteGate) {
	t.Helper()
	clk := newClock()
	s := openTest(t, state.Options{Now: clk.Now, NoSync: true})
	mustCreate(t, s, state.Server{Name: "s1", BootMAC: "52:54:00:00:00:01"})
	if _, err := s.PutHost(state.Host{Name: "h1", Server: "s1", CertFingerprint: "ab", JoinStatus: "joined", LastSeen: clk.Now()}); err != nil {
		t.Fatal(err)
	}
	for _, n := range more {
		for i := 2; i <= n; i++ {
			if _, err := s.PutHost(state.Host{Name: fmt.Sprintf("h%d", i), CertFingerprint: "ab", JoinStatus: "joined"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	g := state.HoldWrites(s)
	t.Cleanup(g.Open) // before the store's close
	return s, clk, g
}

type heartbeatOutcome struct {
	res state.HeartbeatResult
	err error
}

// TestHeartbeatWaitingForItsWriteIsNotLost: the host watch found h1's
// stored heartbeat older than the window and its MarkHostLost waits for
// the store's write path (busy with other writes); h1's heartbeat arrives
// within the window and queues behind it. MarkHostLost runs first and must
// see that the heartbeat arrived (ErrNotLost): liveness is decided by when
// a heartbeat arrived, not by when its write commits. Before heartbeats
// were noted at arrival the host was marked lost (EventHostLost) and then
// returned a moment later: a false HostLost, which with fence: auto powers
// a healthy hypervisor off.
func TestHeartbeatWaitingForItsWriteIsNotLost(t *testing.T) {
	s, clk, g := heldHost(t)
	const window = 90 * time.Second
	clk.Advance(window + time.Second) // h1's stored heartbeat is older than the window
	now := clk.Now()

	lost := make(chan error, 1)
	go func() { _, err := s.MarkHostLost("h1", now.Add(-window), now); lost <- err }()
	markRun := <-g.Entered // the host watch's write waits first

	beat := make(chan heartbeatOutcome, 1)
	arrived := now.Add(-time.Second) // within the window
	go func() {
		res, err := s.RecordHeartbeat("h1", arrived, state.Heartbeat{Uptime: time.Hour})
		beat <- heartbeatOutcome{res, err}
	}()
	beatRun := <-g.Entered // the heartbeat's write waits behind it

	close(markRun)
	if err := <-lost; !errors.Is(err, state.ErrNotLost) {
		t.Errorf("MarkHostLost while a heartbeat of %s waits for its write = %v, want ErrNotLost", arrived.Format(time.RFC3339), err)
	}
	close(beatRun)
	out := <-beat
	if out.err != nil || out.res.Returned {
		t.Errorf("heartbeat = %+v, %v; want recorded, not a return", out.res, out.err)
	}
	h, err := s.Host("h1")
	if err != nil {
		t.Fatal(err)
	}
	if h.Lost != nil || !h.LastSeen.Equal(arrived) {
		t.Errorf("host: lost %+v, last seen %s; want not lost, last seen %s (the arrival)", h.Lost, h.LastSeen, arrived)
	}
	g.Open()
	evs, err := s.Events(state.EventQuery{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Kind == state.EventHostLost || e.Kind == state.EventHostReturned {
			t.Errorf("event %s %q: a host that heartbeated within the window was marked lost", e.Kind, e.Message)
		}
	}
}

// TestHostLostWhenHeartbeatsStop: a heartbeat waiting for its write
// shields its host only while it arrived within the window. A host whose
// heartbeats were written and then stopped is lost once the window has
// passed since the last one, not before; a host whose only waiting
// heartbeat arrived before the window is lost all the same (the silence
// since that heartbeat is real), and returns when that write lands.
func TestHostLostWhenHeartbeatsStop(t *testing.T) {
	s, clk, g := heldHost(t)
	const window = 90 * time.Second
	record := func(at time.Time) (chan struct{}, chan heartbeatOutcome) {
		out := make(chan heartbeatOutcome, 1)
		go func() {
			res, err := s.RecordHeartbeat("h1", at, state.Heartbeat{Uptime: time.Hour})
			out <- heartbeatOutcome{res, err}
		}()
		return <-g.Entered, out
	}
	type markOutcome struct {
		changed bool
		err     error
	}
	mark := func(now time.Time) (chan struct{}, chan markOutcome) {
		out := make(chan markOutcome, 1)
		go func() {
			changed, err := s.MarkHostLost("h1", now.Add(-window), now)
			out <- markOutcome{changed, err}
		}()
		return <-g.Entered, out
	}

	// Written heartbeats, then silence.
	last := clk.Now().Add(10 * time.Second)
	run, beat := record(last)
	close(run)
	if out := <-beat; out.err != nil {
		t.Fatal(out.err)
	}
	run, lost := mark(last.Add(window - time.Millisecond))
	close(run)
	if out := <-lost; !errors.Is(out.err, state.ErrNotLost) {
		t.Fatalf("MarkHostLost within the window after the last heartbeat = %+v; want ErrNotLost", out)
	}
	run, lost = mark(last.Add(window + time.Millisecond))
	close(run)
	if out := <-lost; out.err != nil || !out.changed {
		t.Fatalf("MarkHostLost a window after the last written heartbeat = %+v; want marked lost", out)
	}
	run, beat = record(last.Add(2 * window))
	close(run)
	if out := <-beat; out.err != nil || !out.res.Returned {
		t.Fatalf("heartbeat after the loss = %+v; want a return", out)
	}

	// A waiting heartbeat that arrived before the window does not shield.
	arrived := last.Add(3 * window)
	beatRun, beat := record(arrived)
	markRun, lost := mark(arrived.Add(window + time.Second))
	close(markRun)
	if out := <-lost; out.err != nil || !out.changed {
		t.Fatalf("MarkHostLost a window after the waiting heartbeat's arrival = %+v; want marked lost", out)
	}
	close(beatRun)
	if out := <-beat; out.err != nil || !out.res.Returned {
		t.Fatalf("the waiting heartbeat, written after the loss = %+v; want a return", out)
	}
}

// TestHeartbeatsShareBoundedCommits: heartbeats that queue while one is
// being written share the next commits, at most 256 a commit: 600 hosts'
// heartbeats arriving while the first waits for the write path take four
// transactions (the first alone, then 256, 256 and 87), and each is
// recorded at its arrival.
func TestHeartbeatsShareBoundedCommits(t *testing.T) {
	const n = 600
	s, clk, g := heldHost(t, n)
	at := clk.Now().Add(time.Second)
	errs := make(chan error, n)
	beat := func(i int) {
		_, err := s.RecordHeartbeat(fmt.Sprintf("h%d", i+1), at.Add(time.Duration(i)*time.Millisecond), state.Heartbeat{})
		errs <- err
	}
	go beat(0)
	first := <-g.Entered
	for i := 1; i < n; i++ {
		go beat(i)
	}
	for deadline := time.Now().Add(30 * time.Second); state.QueuedHeartbeats(s) < n-1; {
		if time.Now().After(deadline) {
			t.Fatalf("%d heartbeats queued after 30 s, want %d", state.QueuedHeartbeats(s), n-1)
		}
		time.Sleep(time.Millisecond)
	}
	close(first)
	commits := 1
	for done := 0; done < n; {
		select {
		case run := <-g.Entered:
			commits++
			close(run)
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
			done++
		}
	}
	if commits != 4 {
		t.Errorf("%d heartbeats took %d commits, want 4 (1, 256, 256, 87)", n, commits)
	}
	for i := range n {
		h, err := s.Host(fmt.Sprintf("h%d", i+1))
		if err != nil {
			t.Fatal(err)
		}
		if want := at.Add(time.Duration(i) * time.Millisecond); !h.LastSeen.Equal(want) {
			t.Fatalf("%s last seen %s, want its arrival %s", h.Name, h.LastSeen, want)
		}
	}
}

// TestSteadyHeartbeatWakesNoPlanner: a heartbeat that only refreshes its
// host's liveness and uptimes wakes no Notify listener (the reconciler
// plans a pass per wake, and a fleet of 10,000 hosts heartbeats about 333
// times a second); a return from loss does.
func TestSteadyHeartbeatWakesNoPlanner(t *testing.T) {
	clk := newClock()
	s := openTest(t, state.Options{Now: clk.Now, NoSync: true})
	if _, err := s.PutHost(state.Host{Name: "h1", CertFingerprint: "ab", JoinStatus: "joined", LastSeen: clk.Now()}); err != nil {
		t.Fatal(err)
	}
	wake, stop := s.Notify()
	defer stop()
	select { // drain a wake of the writes above, if any
	case <-wake:
	default:
	}
	for i := range 3 {
		clk.Advance(30 * time.Second)
		if _, err := s.RecordHeartbeat("h1", clk.Now(), state.Heartbeat{Uptime: time.Hour + time.Duration(i)*30*time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-wake:
		t.Fatal("steady heartbeats woke a Notify listener")
	default:
	}
	clk.Advance(5 * time.Minute)
	if _, err := s.MarkHostLost("h1", clk.Now().Add(-90*time.Second), clk.Now()); err != nil {
		t.Fatal(err)
	}
	<-wake // the loss
	if res, err := s.RecordHeartbeat("h1", clk.Now(), state.Heartbeat{Uptime: time.Hour + 7*time.Minute}); err != nil || !res.Returned {
		t.Fatalf("heartbeat after the loss = %+v, %v; want a return", res, err)
	}
	select {
	case <-wake:
	default:
		t.Fatal("a host's return woke no Notify listener")
	}
}

// TestHeardNotesWakeNoPlanner: the LastHeard notes' flush wakes no Notify
// listener (a note only pushes a machine's silence later, so the
// reconciler has nothing new to plan from it); a server update does.
func TestHeardNotesWakeNoPlanner(t *testing.T) {
	clk := newClock()
	s := openTest(t, state.Options{Now: clk.Now, NoSync: true})
	mustCreate(t, s, state.Server{Name: "s1", BootMAC: "52:54:00:00:00:01"})
	wake, stop := s.Notify()
	defer stop()
	select {
	case <-wake:
	default:
	}
	s.NoteHeard("s1", "script fetch")
	if err := s.FlushHeard(); err != nil {
		t.Fatal(err)
	}
	if srv, err := s.Server("s1"); err != nil || srv.LastHeard != "script fetch" {
		t.Fatalf("server = %+v, %v; want the note written", srv, err)
	}
	select {
	case <-wake:
		t.Fatal("a LastHeard flush woke a Notify listener")
	default:
	}
	if _, err := s.UpdateServer("s1", func(srv *state.Server) error { srv.Stalled = "test"; return nil }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
	default:
		t.Fatal("a server update woke no Notify listener")
	}
}
