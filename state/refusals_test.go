package state_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/state"
)

// TestRefusalPacing (a 3 s interval, long enough that the 1,000 calls fit in
// one window under -race on a loaded machine): 1,000 refusals of a used token write one event at
// once and, when the interval ends (the store's own timer), one summary
// counting the other 999; the refused requests themselves commit nothing
// (no page write: before, each was a commit with an fsync and a planner
// wake). A quiet interval ends the window, so the next refusal is written
// at once again; Close writes what is pending.
func TestRefusalPacing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := state.Open(path, state.Options{RefusalSummaryEvery: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.CreateServer(state.Server{Name: "r1-n01", BootMAC: "52:54:00:00:01:01"}); err != nil {
		t.Fatal(err)
	}
	value, _, err := s.IssueToken(state.TokenSpec{Purpose: state.PurposeReport, Server: "r1-n01", MAC: "52:54:00:00:01:01"})
	if err != nil {
		t.Fatal(err)
	}
	claim := state.TokenClaim{Purpose: state.PurposeReport, Server: "r1-n01"}
	if _, err := s.ConsumeToken(value, claim); err != nil {
		t.Fatal(err)
	}
	refusals := func() []state.Event {
		var out []state.Event
		for _, e := range allEvents(t, s, state.EventQuery{Server: "r1-n01"}) {
			if e.Kind == state.EventTokenRefused {
				out = append(out, e)
			}
		}
		return out
	}
	wait := func(n int) []state.Event {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if got := refusals(); len(got) >= n {
				return got
			}
		}
		t.Fatalf("refusal events = %d, want %d within 10 s", len(refusals()), n)
		return nil
	}

	// The first refusal is written at once: measure its cost, then the
	// flood's.
	if _, err := s.ConsumeToken(value, claim); !errors.Is(err, state.ErrTokenUsed) {
		t.Fatalf("second use: %v, want ErrTokenUsed", err)
	}
	if got := refusals(); len(got) != 1 {
		t.Fatalf("after the first refusal: %d events, want 1 at once", len(got))
	}
	w0 := s.Writes()
	for range 999 {
		if _, err := s.ConsumeToken(value, claim); !errors.Is(err, state.ErrTokenUsed) {
			t.Fatalf("refusal: %v", err)
		}
	}
	if n := s.Writes() - w0; n != 0 {
		t.Errorf("999 refused requests made %d page writes, want 0", n)
	}
	got := wait(2)
	if len(got) != 2 || !strings.Contains(got[1].Message, "999 more requests refused within 3s: token_used 999") {
		last := ""
		if len(got) > 0 {
			last = got[len(got)-1].Message
		}
		t.Errorf("after the interval: %d events (last %q), want the first and one summary of 999", len(got), last)
	}
	if c := s.RefusalCounts()[state.RefusalTokenUsed]; c != 1000 {
		t.Errorf("RefusalCounts[token_used] = %d, want 1000", c)
	}

	// Quiet for an interval: the next refusal is written at once again.
	time.Sleep(3500 * time.Millisecond)
	if got := refusals(); len(got) != 2 {
		t.Fatalf("a quiet interval wrote %d events, want none", len(got)-2)
	}
	_, _ = s.ConsumeToken(value, claim)
	if got := refusals(); len(got) != 3 {
		t.Fatalf("a refusal after a quiet interval: %d events, want 3 (written at once)", len(got))
	}
	// One more inside the window: Close writes its summary.
	_, _ = s.ConsumeToken(value, claim)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := state.Open(path, state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	s = s2
	if got := refusals(); len(got) != 4 || !strings.Contains(got[3].Message, "1 more requests refused") {
		t.Errorf("after Close: %d events, want 4 with the pending summary", len(got))
	}
}
