package state_test

import (
	"errors"
	"testing"
	"time"

	"github.com/machina-metal/machina/state"
)

// TestPrepareTakeToken: a prepared token is handed out once, works like an
// issued one, and is handed out only while it is still the server's live
// token; preparing never revokes a live token.
func TestPrepareTakeToken(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		if _, err := s.CreateServer(state.Server{Name: "n1", BootMAC: "52:54:00:00:01:01", Lifecycle: state.LifecycleCommissioning}); err != nil {
			t.Fatal(err)
		}
		spec := state.TokenSpec{Purpose: state.PurposeReport, Server: "n1", MAC: "52:54:00:00:01:01", TTL: 30 * time.Minute}
		ok, err := s.PrepareToken(spec)
		if err != nil || !ok {
			t.Fatalf("PrepareToken = %v, %v; want prepared", ok, err)
		}
		// A second prepare while that token is live mints nothing.
		if ok, err := s.PrepareToken(spec); err != nil || ok {
			t.Fatalf("second PrepareToken = %v, %v; want not prepared", ok, err)
		}
		if _, ok, _ := s.TakeToken("n1", state.PurposeReport, "52-54-00-00-01-02", 0, ""); ok {
			t.Fatal("TakeToken for another MAC handed the token out")
		}
		// The refused take above forgot it: prepare again after revoking.
		if _, err := s.RevokeTokens("n1", state.PurposeReport); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.PrepareToken(spec); err != nil || !ok {
			t.Fatalf("PrepareToken after revoke = %v, %v", ok, err)
		}
		if _, ok, _ := s.TakeToken("n1", state.PurposeReport, "", time.Hour, ""); ok {
			t.Fatal("TakeToken with minLeft above the token's life handed it out")
		}
		if ok, _ := s.PrepareToken(spec); ok {
			t.Fatal("prepared over a live token")
		}
		// Live but forgotten (the take above): a script request would
		// Issue now. Revoke and prepare once more for the good path.
		if _, err := s.RevokeTokens("n1", state.PurposeReport); err != nil {
			t.Fatal(err)
		}
		if ok, _ := s.PrepareToken(spec); !ok {
			t.Fatal("not prepared")
		}
		v, ok, err := s.TakeToken("n1", state.PurposeReport, "52-54-00-00-01-01", 15*time.Minute, "boot script fetched (commission)")
		if err != nil || !ok || v == "" {
			t.Fatalf("TakeToken = %q, %v, %v", v, ok, err)
		}
		if _, ok, _ := s.TakeToken("n1", state.PurposeReport, "", 0, ""); ok {
			t.Fatal("a prepared token was handed out twice")
		}
		if err := s.FlushHeard(); err != nil {
			t.Fatal(err)
		}
		if srv, _ := s.Server("n1"); srv.LastHeard != "boot script fetched (commission)" {
			t.Errorf("LastHeard = %q", srv.LastHeard)
		}
		if _, err := s.ConsumeToken(v, state.TokenClaim{Purpose: state.PurposeReport, Server: "n1", MAC: "52:54:00:00:01:01"}); err != nil {
			t.Fatalf("the taken token does not work: %v", err)
		}
		// Used: the server has no live report token, so the next
		// prepare mints.
		if ok, _ := s.PrepareToken(spec); !ok {
			t.Fatal("not prepared after the live token was used")
		}
		// Replaced by an inline mint (a script request that found nothing
		// to take, e.g. on another controller): the prepared value is
		// dead and must not be handed out.
		if _, _, err := s.IssueToken(spec); err != nil {
			t.Fatal(err)
		}
		if _, ok, _ := s.TakeToken("n1", state.PurposeReport, "", 0, ""); ok {
			t.Fatal("handed out a prepared token that IssueToken revoked")
		}
	})
}

// TestPrepareNeverRevokes: a token a machine holds stays valid when the
// executor prepares again (a step resumed after a restart).
func TestPrepareNeverRevokes(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		spec := state.TokenSpec{Purpose: state.PurposePlan, Server: "n2", MAC: "52:54:00:00:02:01"}
		held, _, err := s.IssueToken(spec)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := s.PrepareToken(spec); err != nil || ok {
			t.Fatalf("PrepareToken over a held token = %v, %v", ok, err)
		}
		if _, err := s.ConsumeToken(held, state.TokenClaim{Purpose: state.PurposePlan, Server: "n2"}); err != nil {
			t.Fatalf("held token refused after a prepare: %v", err)
		}
		if _, err := s.PrepareToken(state.TokenSpec{Purpose: "bogus", Server: "n2"}); !errors.Is(err, state.ErrInvalid) {
			t.Errorf("bad purpose: %v, want ErrInvalid", err)
		}
	})
}
