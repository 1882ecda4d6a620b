package state_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/machina-metal/machina/state"
)

// TestIssueRevokesPrevious: one live token per purpose per server. Before
// the fix every issued token stayed valid until it expired.
func TestIssueRevokesPrevious(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		a, _, _ := s.IssueToken(state.TokenSpec{Purpose: state.PurposePlan, Server: "r1-n01"})
		other, _, _ := s.IssueToken(state.TokenSpec{Purpose: state.PurposeReport, Server: "r1-n01"})
		b, _, _ := s.IssueToken(state.TokenSpec{Purpose: state.PurposePlan, Server: "r1-n01"})
		if _, err := s.CheckToken(a, state.TokenClaim{Purpose: state.PurposePlan}); !errors.Is(err, state.ErrTokenUnknown) {
			t.Errorf("first plan token after a second was issued: %v, want ErrTokenUnknown", err)
		}
		for _, tc := range []struct {
			v string
			p state.Purpose
		}{{b, state.PurposePlan}, {other, state.PurposeReport}} {
			if _, err := s.CheckToken(tc.v, state.TokenClaim{Purpose: tc.p}); err != nil {
				t.Errorf("%s token: %v, want live", tc.p, err)
			}
		}
	})
}

// TestUseTokenExactlyOnce: 16 concurrent identical requests run the effect
// once and all get its answer; a request with another fingerprint is
// refused; an effect error consumes nothing.
func TestUseTokenExactlyOnce(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		if _, err := s.CreateServer(state.Server{Name: "r1-n01"}); err != nil {
			t.Fatal(err)
		}
		v, _, _ := s.IssueToken(state.TokenSpec{Purpose: state.PurposeDone, Server: "r1-n01"})
		claim := state.TokenClaim{Purpose: state.PurposeDone}
		fp := state.RequestFingerprint([]byte("10.0.0.5"), []byte("body"))

		// An effect that fails consumes nothing.
		_, _, _, err := s.UseToken(v, state.TokenUse{Claim: claim, Request: fp, Effect: func(*state.Tx, state.Token) (state.Answer, error) {
			return state.Answer{}, errors.New("boom")
		}})
		if err == nil || err.Error() != "boom" {
			t.Fatalf("failing effect: %v", err)
		}
		var runs int
		var mu sync.Mutex
		var wg sync.WaitGroup
		answers := make([]state.Answer, 16)
		errs := make([]error, 16)
		for i := range answers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, answers[i], _, errs[i] = s.UseToken(v, state.TokenUse{Claim: claim, Request: fp, Effect: func(tx *state.Tx, tok state.Token) (state.Answer, error) {
					mu.Lock()
					runs++
					mu.Unlock()
					_, err := tx.UpdateServer(tok.Server, func(srv *state.Server) error { srv.LastError = "x"; return nil })
					return state.Answer{Status: 200, Body: []byte(`{"n":1}`)}, err
				}})
			}()
		}
		wg.Wait()
		if runs != 1 {
			t.Errorf("effect ran %d times, want 1", runs)
		}
		for i := range answers {
			if errs[i] != nil || answers[i].Status != 200 || string(answers[i].Body) != `{"n":1}` {
				t.Errorf("request %d: %v %+v, want the one answer", i, errs[i], answers[i])
			}
		}
		other := state.RequestFingerprint([]byte("10.0.0.6"), []byte("body"))
		if _, _, _, err := s.UseToken(v, state.TokenUse{Claim: claim, Request: other, Effect: func(*state.Tx, state.Token) (state.Answer, error) {
			t.Error("effect ran for another requester")
			return state.Answer{}, nil
		}}); !errors.Is(err, state.ErrTokenUsed) {
			t.Errorf("another requester: %v, want ErrTokenUsed", err)
		}
	})
}
