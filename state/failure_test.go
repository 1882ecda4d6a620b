package state

import (
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// TestUpdateServerWithEvent: the record and its event land together, or
// neither does (fn's error, an unknown server).
func TestUpdateServerWithEvent(t *testing.T) {
	st, err := Open(filepath.Join(t.TempDir(), "state.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.CreateServer(Server{Name: "s1", BootMAC: "52:54:00:25:04:01"}); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	srv, ev, err := st.UpdateServerWithEvent("s1", func(s *Server) (Event, error) {
		s.LastError, s.Failures, s.RetryAt = "power-on: refused", s.Failures+1, at
		return Event{Kind: "action.failed", Message: "power-on: refused"}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if srv.Failures != 1 || !srv.RetryAt.Equal(at) || ev.Server != "s1" || ev.Seq == 0 {
		t.Errorf("record %+v event %+v", srv, ev)
	}
	evs, _ := st.Events(EventQuery{Server: "s1"})
	n := len(evs)
	if n == 0 || evs[n-1].Kind != "action.failed" {
		t.Fatalf("events %+v, want the action.failed last", evs)
	}
	boom := errors.New("boom")
	if _, _, err := st.UpdateServerWithEvent("s1", func(s *Server) (Event, error) {
		s.Failures = 99
		return Event{Kind: "action.failed"}, boom
	}); !errors.Is(err, boom) {
		t.Errorf("fn error: %v", err)
	}
	if _, _, err := st.UpdateServerWithEvent("nope", func(*Server) (Event, error) { return Event{Kind: "x"}, nil }); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown server: %v, want ErrNotFound", err)
	}
	s, _ := st.Server("s1")
	evs, _ = st.Events(EventQuery{Server: "s1"})
	if s.Failures != 1 || len(evs) != n {
		t.Errorf("after the refused updates: failures %d, %d events (want 1 and %d): half-applied", s.Failures, len(evs), n)
	}
	// The fields survive a reopen of the file (a restart).
	path := st.Path()
	st.Close()
	st2, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	if s, _ := st2.Server("s1"); s.Failures != 1 || !s.RetryAt.Equal(at) {
		t.Errorf("after reopen: failures %d retry %v", s.Failures, s.RetryAt)
	}
}
