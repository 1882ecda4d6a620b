package state_test

import (
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/state"
)

// clock is a settable fake clock for Options.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// openTest opens a store in t.TempDir(); cleanup closes it after running
// bbolt's consistency check (as bbolt's btesting does).
func openTest(t testing.TB, opts state.Options) *state.Store {
	t.Helper()
	return openAt(t, filepath.Join(t.TempDir(), "state.db"), opts)
}

func openAt(t testing.TB, path string, opts state.Options) *state.Store {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	s, err := openEngine(t, path, opts)
	if err != nil {
		t.Fatalf("Open(%s) = %v", path, err)
	}
	t.Cleanup(func() {
		if err := s.Check(); err != nil {
			t.Errorf("integrity check: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func mustCreate(t testing.TB, s *state.Store, srv state.Server) state.Server {
	t.Helper()
	got, err := s.CreateServer(srv)
	if err != nil {
		t.Fatalf("CreateServer(%s) = %v", srv.Name, err)
	}
	return got
}

// allEvents pages through every event matching q.
func allEvents(t testing.TB, s *state.Store, q state.EventQuery) []state.Event {
	t.Helper()
	var out []state.Event
	for {
		page, err := s.Events(q)
		if err != nil {
			t.Fatalf("Events(%+v) = %v", q, err)
		}
		if len(page) == 0 {
			return out
		}
		out = append(out, page...)
		q.After = page[len(page)-1].Seq
	}
}
