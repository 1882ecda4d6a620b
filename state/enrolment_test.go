package state_test

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/state"
)

func TestEnrolmentTokenLifecycle(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		clk := newClock()
		s := openTest(t, state.Options{Now: clk.Now})
		payload := json.RawMessage(`{"site":"lab1"}`)
		val, rec, err := s.IssueEnrolmentToken(time.Minute, payload, "ops")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(val, "mj_") || len(rec.ID) != 12 || strings.Contains(val, rec.ID) {
			t.Fatalf("token %q id %q", val, rec.ID)
		}
		// Concurrent consumers: exactly one wins.
		var wg sync.WaitGroup
		var mu sync.Mutex
		wins, used := 0, 0
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, err := s.ConsumeEnrolmentToken(val, "hv1")
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					wins++
					if string(got.Payload) != string(payload) || got.UsedBy != "hv1" {
						t.Errorf("consumed %+v", got)
					}
				case errors.Is(err, state.ErrTokenUsed):
					used++
				default:
					t.Errorf("consume: %v", err)
				}
			}()
		}
		wg.Wait()
		if wins != 1 || used != 15 {
			t.Fatalf("wins %d used %d, want 1 and 15", wins, used)
		}
		val2, _, _ := s.IssueEnrolmentToken(time.Minute, nil, "ops")
		clk.Advance(time.Minute)
		if _, err := s.ConsumeEnrolmentToken(val2, "hv2"); !errors.Is(err, state.ErrTokenExpired) {
			t.Fatalf("expired = %v", err)
		}
		if _, err := s.ConsumeEnrolmentToken("mj_nope", "hv3"); !errors.Is(err, state.ErrTokenUnknown) {
			t.Fatalf("unknown = %v", err)
		}
		// Refusals are counted and paced: the first an event at once, the
		// other 16 one summary; events name the token ID, never the value.
		if err := s.FlushRefusals(); err != nil {
			t.Fatal(err)
		}
		evs := allEvents(t, s, state.EventQuery{})
		var refused []string
		for _, e := range evs {
			if e.Kind == state.EventTokenRefused {
				refused = append(refused, e.Message)
				if strings.Contains(e.Message, val) || strings.Contains(e.Message, val2) {
					t.Fatalf("event leaks a token value: %q", e.Message)
				}
			}
		}
		if len(refused) != 2 || !strings.Contains(refused[1], "16 more requests refused") {
			t.Fatalf("refusal events %q, want the first and a summary of 16 more", refused)
		}
		if got := s.RefusalCounts(); got[state.RefusalTokenUsed] != 15 || got[state.RefusalTokenExpired] != 1 || got[state.RefusalTokenUnknown] != 1 {
			t.Errorf("RefusalCounts = %v, want 15 used, 1 expired, 1 unknown", got)
		}
		// Expired more than a day ago: pruned by the next issue.
		clk.Advance(25 * time.Hour)
		if _, _, err := s.IssueEnrolmentToken(time.Minute, nil, "ops"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ConsumeEnrolmentToken(val2, "hv2"); !errors.Is(err, state.ErrTokenUnknown) {
			t.Fatalf("pruned token = %v, want unknown", err)
		}
		for _, bad := range []struct {
			ttl time.Duration
			p   string
		}{{0, ""}, {time.Minute, "{not json"}} {
			if _, _, err := s.IssueEnrolmentToken(bad.ttl, json.RawMessage(bad.p), "ops"); !errors.Is(err, state.ErrInvalid) {
				t.Errorf("IssueEnrolmentToken(%v, %q) = %v, want ErrInvalid", bad.ttl, bad.p, err)
			}
		}
	})
}

func TestCARecordSealedAndResealed(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state.db")
		s, err := openEngine(t, path, state.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.CA(); !errors.Is(err, state.ErrNotFound) {
			t.Fatalf("CA() before PutCA = %v", err)
		}
		rec, err := s.PutCA(state.CARecord{CertDER: []byte("cert"), KeyDER: []byte("key")})
		if err != nil || rec.Sealed || string(rec.KeyDER) != "key" {
			t.Fatalf("PutCA without master key = %+v, %v", rec, err)
		}
		// A second PutCA keeps the first CA (first start wins).
		rec, _ = s.PutCA(state.CARecord{CertDER: []byte("cert2"), KeyDER: []byte("key2")})
		if string(rec.CertDER) != "cert" {
			t.Fatalf("second PutCA replaced the CA: %q", rec.CertDER)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		// Opened with a master key, the unsealed key is sealed on read.
		s2, err := openEngine(t, path, state.Options{MasterKey: []byte("0123456789abcdef")})
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		rec, err = s2.CA()
		if err != nil || !rec.Sealed || string(rec.KeyDER) != "key" {
			t.Fatalf("CA() with master key = %+v, %v; want sealed key", rec, err)
		}
		if err := s2.Close(); err != nil {
			t.Fatal(err)
		}
		s3, err := openEngine(t, path, state.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s3.Close()
		if _, err := s3.CA(); !errors.Is(err, state.ErrMasterKeyRequired) {
			t.Fatalf("sealed CA without master key = %v, want ErrMasterKeyRequired", err)
		}
	})
}

// TestEnrolmentPruneHourly: an issue prunes tokens expired more than a day
// ago at most once an hour (store clock): a token that became prunable
// within the hour after a prune is kept (reported expired, not unknown)
// until the first issue an hour after that prune. Before, every issue
// decoded every stored token, about n²/2 decodes for a wave of n deploys.
func TestEnrolmentPruneHourly(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		clk := newClock()
		s := openTest(t, state.Options{Now: clk.Now})
		issue := func(ttl time.Duration) string {
			t.Helper()
			v, _, err := s.IssueEnrolmentToken(ttl, nil, "ops")
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		early := issue(time.Minute) // first issue: prunes (nothing yet)
		later := issue(time.Hour)
		clk.Advance(24*time.Hour + 2*time.Minute)
		issue(time.Minute) // over an hour since the last prune: prunes early
		if _, err := s.ConsumeEnrolmentToken(early, "h1"); !errors.Is(err, state.ErrTokenUnknown) {
			t.Fatalf("token expired 24 h 1 min ago, after a due prune: %v, want unknown", err)
		}
		clk.Advance(59 * time.Minute) // later expired 24 h 1 min ago now
		issue(time.Minute)            // 59 min after the last prune: none
		if _, err := s.ConsumeEnrolmentToken(later, "h2"); !errors.Is(err, state.ErrTokenExpired) {
			t.Fatalf("token prunable since 1 min, 59 min after a prune: %v, want expired (kept)", err)
		}
		clk.Advance(2 * time.Minute)
		issue(time.Minute) // 61 min after the last prune: prunes later
		if _, err := s.ConsumeEnrolmentToken(later, "h2"); !errors.Is(err, state.ErrTokenUnknown) {
			t.Fatalf("after the next due prune: %v, want unknown", err)
		}
	})
}
