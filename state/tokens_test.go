package state_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/machina-metal/machina/state"
)

func TestConsumeTokenRace32(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		value, _, err := s.IssueToken(state.TokenSpec{Purpose: state.PurposeReport, Server: "r1-n01", MAC: "52:54:00:00:01:01"})
		if err != nil {
			t.Fatal(err)
		}
		const n = 32
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, errs[i] = s.ConsumeToken(value, state.TokenClaim{Purpose: state.PurposeReport, Server: "r1-n01", MAC: "52-54-00-00-01-01"})
			}()
		}
		close(start)
		wg.Wait()
		wins := 0
		for i, err := range errs {
			switch {
			case err == nil:
				wins++
			case !errors.Is(err, state.ErrTokenUsed):
				t.Errorf("consumer %d: %v, want ErrTokenUsed", i, err)
			}
		}
		if wins != 1 {
			t.Fatalf("%d consumers succeeded, want exactly 1", wins)
		}
		// Refusals are paced (refusals.go): the first is written at once,
		// the other 30 in one summary event; all 31 are counted.
		if err := s.FlushRefusals(); err != nil {
			t.Fatal(err)
		}
		var refused []string
		for _, e := range allEvents(t, s, state.EventQuery{Server: "r1-n01"}) {
			if e.Kind == state.EventTokenRefused {
				refused = append(refused, e.Message)
				if strings.Contains(e.Message, value) {
					t.Errorf("event leaks the token value: %q", e.Message)
				}
			}
		}
		if len(refused) != 2 || !strings.Contains(refused[1], fmt.Sprintf("%d more requests refused", n-2)) {
			t.Errorf("refusal events = %q, want the first and a summary of %d more", refused, n-2)
		}
		if got := s.RefusalCounts()[state.RefusalTokenUsed]; got != n-1 {
			t.Errorf("RefusalCounts[token_used] = %d, want %d", got, n-1)
		}
	})
}

func TestTokenRefusals(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		c := newClock()
		s := openTest(t, state.Options{Now: c.Now})
		issue := func(spec state.TokenSpec) string {
			t.Helper()
			v, tok, err := s.IssueToken(spec)
			if err != nil {
				t.Fatalf("IssueToken(%+v) = %v", spec, err)
			}
			if len(v) != 43 || tok.ID == "" || !tok.ExpiresAt.After(tok.IssuedAt) {
				t.Fatalf("IssueToken = %q, %+v", v, tok)
			}
			return v
		}
		boot := issue(state.TokenSpec{Purpose: state.PurposeBoot, Server: "n1", MAC: "52:54:00:00:00:01", TTL: time.Minute})
		claim := state.TokenClaim{Purpose: state.PurposeBoot, Server: "n1", MAC: "52:54:00:00:00:01"}
		cases := []struct {
			name  string
			value string
			claim state.TokenClaim
			want  error
		}{
			{"unknown", "not-a-token", claim, state.ErrTokenUnknown},
			{"wrong purpose", boot, state.TokenClaim{Purpose: state.PurposePlan, Server: "n1"}, state.ErrTokenMismatch},
			{"wrong server", boot, state.TokenClaim{Purpose: state.PurposeBoot, Server: "n2"}, state.ErrTokenMismatch},
			{"wrong mac", boot, state.TokenClaim{Purpose: state.PurposeBoot, MAC: "52:54:00:00:00:02"}, state.ErrTokenMismatch},
			{"accepted", boot, claim, nil},
			{"reused", boot, claim, state.ErrTokenUsed},
		}
		for _, tc := range cases {
			_, err := s.ConsumeToken(tc.value, tc.claim)
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Errorf("%s: ConsumeToken = %v, want %v", tc.name, err, tc.want)
			}
		}
		expiring := issue(state.TokenSpec{Purpose: state.PurposePlan, Server: "n1", TTL: time.Minute})
		c.Advance(time.Minute)
		if _, err := s.ConsumeToken(expiring, state.TokenClaim{Purpose: state.PurposePlan}); !errors.Is(err, state.ErrTokenExpired) {
			t.Errorf("expired: %v, want ErrTokenExpired", err)
		}
		// Every refusal of a known token is counted and paced: the first one
		// an event at once, the other four one summary event; the unknown
		// value is counted, with no write.
		if err := s.FlushRefusals(); err != nil {
			t.Fatal(err)
		}
		var refusals []string
		for _, e := range allEvents(t, s, state.EventQuery{}) {
			if e.Kind == state.EventTokenRefused {
				refusals = append(refusals, e.Message)
			}
		}
		if len(refusals) != 2 || !strings.Contains(refusals[0], "token not valid for this request") ||
			!strings.Contains(refusals[1], "4 more requests refused within 1m0s: token_expired 1, token_used 1, token_mismatch 2") {
			t.Errorf("refusal events = %q, want the first and a summary of 4 more", refusals)
		}
		if got := s.RefusalCounts(); got[state.RefusalTokenMismatch] != 3 || got[state.RefusalTokenUsed] != 1 || got[state.RefusalTokenExpired] != 1 {
			t.Errorf("RefusalCounts = %v, want 3 mismatch, 1 used, 1 expired", got)
		}
		if n := s.UnknownTokenRefusals(); n != 1 {
			t.Errorf("UnknownTokenRefusals = %d, want 1", n)
		}
		// Reusable tokens are accepted until expiry.
		img := issue(state.TokenSpec{Purpose: state.PurposeImage, Server: "n1", Reusable: true, TTL: time.Hour})
		for i := range 3 {
			tok, err := s.ConsumeToken(img, state.TokenClaim{Purpose: state.PurposeImage, Server: "n1"})
			if err != nil || tok.Uses != i+1 {
				t.Errorf("reusable use %d: %+v, %v", i, tok, err)
			}
		}
		c.Advance(2 * time.Hour)
		res, err := s.Prune()
		if err != nil || res.Tokens != 3 {
			t.Errorf("Prune = %+v, %v; want 3 tokens", res, err)
		}
		if _, err := s.ConsumeToken(img, state.TokenClaim{Purpose: state.PurposeImage}); !errors.Is(err, state.ErrTokenUnknown) {
			t.Errorf("pruned token: %v", err)
		}
		if _, _, err := s.IssueToken(state.TokenSpec{Purpose: "admin", Server: "n1"}); !errors.Is(err, state.ErrInvalid) {
			t.Errorf("bad purpose: %v", err)
		}
		if _, _, err := s.IssueToken(state.TokenSpec{Purpose: state.PurposeJoin, Server: "../etc"}); !errors.Is(err, state.ErrInvalid) {
			t.Errorf("bad server: %v", err)
		}
	})
}

func TestRevokeTokens(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		a, _, _ := s.IssueToken(state.TokenSpec{Purpose: state.PurposeBoot, Server: "n1"})
		b, _, _ := s.IssueToken(state.TokenSpec{Purpose: state.PurposeReport, Server: "n1"})
		other, _, _ := s.IssueToken(state.TokenSpec{Purpose: state.PurposeBoot, Server: "n2"})
		n, err := s.RevokeTokens("n1", state.PurposeBoot)
		if err != nil || n != 1 {
			t.Fatalf("RevokeTokens = %d, %v", n, err)
		}
		if _, err := s.ConsumeToken(a, state.TokenClaim{Purpose: state.PurposeBoot}); !errors.Is(err, state.ErrTokenUnknown) {
			t.Errorf("revoked: %v", err)
		}
		if _, err := s.ConsumeToken(b, state.TokenClaim{Purpose: state.PurposeReport}); err != nil {
			t.Errorf("other purpose: %v", err)
		}
		if _, err := s.ConsumeToken(other, state.TokenClaim{Purpose: state.PurposeBoot}); err != nil {
			t.Errorf("other server: %v", err)
		}
	})
}

func TestTokensStoredHashed(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state.db")
		s, err := openEngine(t, path, state.Options{})
		if err != nil {
			t.Fatal(err)
		}
		boot, _, _ := s.IssueToken(state.TokenSpec{Purpose: state.PurposeBoot, Server: "n1"})
		admin, _, err := s.CreateAdminToken("ops", state.ActorLocal)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		raw := rawDump(t, path)
		for _, v := range []string{boot, admin} {
			if strings.Contains(string(raw), v) {
				t.Errorf("state file contains a token value")
			}
		}
	})
}

func TestAdminTokens(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		v, tok, err := s.CreateAdminToken("ops", state.ActorLocal)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(v, state.AdminTokenPrefix) || tok.Name != "ops" {
			t.Errorf("CreateAdminToken = %q, %+v", v, tok)
		}
		if _, _, err := s.CreateAdminToken("ops", state.ActorLocal); !errors.Is(err, state.ErrExists) {
			t.Errorf("duplicate: %v", err)
		}
		if _, _, err := s.CreateAdminToken("Ops!", state.ActorLocal); !errors.Is(err, state.ErrInvalid) {
			t.Errorf("bad name: %v", err)
		}
		got, err := s.AuthenticateAdmin(v)
		if err != nil || got.Name != "ops" {
			t.Errorf("AuthenticateAdmin = %+v, %v", got, err)
		}
		if _, err := s.AuthenticateAdmin(v + "x"); !errors.Is(err, state.ErrTokenUnknown) {
			t.Errorf("wrong value: %v", err)
		}
		list, _ := s.AdminTokens()
		if len(list) != 1 || list[0].Name != "ops" {
			t.Errorf("AdminTokens = %+v", list)
		}
		if err := s.RevokeAdminToken("ops", "test"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.AuthenticateAdmin(v); !errors.Is(err, state.ErrTokenUnknown) {
			t.Errorf("revoked: %v", err)
		}
		if err := s.RevokeAdminToken("ops", "test"); !errors.Is(err, state.ErrNotFound) {
			t.Errorf("revoke twice: %v", err)
		}
	})
}
