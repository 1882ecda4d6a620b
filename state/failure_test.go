package state_test

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/machina-metal/machina/state"
)

// TestUpdateServerWithEvent: the record and its event land together, or
// neither does (fn's error, an unknown server), on both engines; the
// fields survive a reopen of the site (a restart).
func TestUpdateServerWithEvent(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state.db")
		st, err := openEngine(t, path, state.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.CreateServer(state.Server{Name: "s1", BootMAC: "52:54:00:25:04:01"}); err != nil {
			t.Fatal(err)
		}
		at := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
		srv, ev, err := st.UpdateServerWithEvent("s1", func(s *state.Server) (state.Event, error) {
			s.LastError, s.Failures, s.RetryAt = "power-on: refused", s.Failures+1, at
			return state.Event{Kind: "action.failed", Message: "power-on: refused"}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if srv.Failures != 1 || !srv.RetryAt.Equal(at) || ev.Server != "s1" || ev.Seq == 0 {
			t.Errorf("record %+v event %+v", srv, ev)
		}
		evs, _ := st.Events(state.EventQuery{Server: "s1"})
		n := len(evs)
		if n == 0 || evs[n-1].Kind != "action.failed" {
			t.Fatalf("events %+v, want the action.failed last", evs)
		}
		boom := errors.New("boom")
		if _, _, err := st.UpdateServerWithEvent("s1", func(s *state.Server) (state.Event, error) {
			s.Failures = 99
			return state.Event{Kind: "action.failed"}, boom
		}); !errors.Is(err, boom) {
			t.Errorf("fn error: %v", err)
		}
		if _, _, err := st.UpdateServerWithEvent("nope", func(*state.Server) (state.Event, error) { return state.Event{Kind: "x"}, nil }); !errors.Is(err, state.ErrNotFound) {
			t.Errorf("unknown server: %v, want ErrNotFound", err)
		}
		s, _ := st.Server("s1")
		evs, _ = st.Events(state.EventQuery{Server: "s1"})
		if s.Failures != 1 || len(evs) != n {
			t.Errorf("after the refused updates: failures %d, %d events (want 1 and %d): half-applied", s.Failures, len(evs), n)
		}
		st.Close()
		st2 := openAt(t, path, state.Options{}) // checked at cleanup
		if s, _ := st2.Server("s1"); s.Failures != 1 || !s.RetryAt.Equal(at) {
			t.Errorf("after reopen: failures %d retry %v", s.Failures, s.RetryAt)
		}
	})
}
