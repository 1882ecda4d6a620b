package join_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/state"
)

// TestJoinBoundToVerifiedDeploy: an enrolment token bound to a deploy is
// refused (409, not used) while its server is still deploying, or when
// the server's verified deploy is another one; it is accepted once that
// deploy's done was verified. Before the fix a machine that knew only the
// MAC joined with the plan's token while its server was deploying with
// nothing written, and the host showed online and joined.
func TestJoinBoundToVerifiedDeploy(t *testing.T) {
	f := startListener(t, "")
	if _, err := f.store.CreateServer(state.Server{Name: "r1-n05"}); err != nil {
		t.Fatal(err)
	}
	for _, to := range []state.Lifecycle{state.LifecycleCommissioning, state.LifecycleReady, state.LifecycleAllocated, state.LifecycleDeploying} {
		s, _ := f.store.Server("r1-n05")
		if _, err := f.store.Transition("r1-n05", s.Lifecycle, to, "test"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.store.UpdateServer("r1-n05", func(s *state.Server) error {
		s.Deploy = &state.DeployRecord{ID: "aaaaaaaaaaaa"}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tok := f.token(t, v1.EnrolmentRequest{Host: "r1-n05", Server: "r1-n05", Deploy: "aaaaaaaaaaaa"})
	req := v1.JoinRequest{Token: tok.Token, CSR: csrPEM(t, key), Facts: facts("r1-n05")}
	if code, e := postJoin(t, f, req); code != 409 || e.Code != join.CodeNotDeployed {
		t.Fatalf("join while deploying = %d %+v, want 409 not_deployed", code, e)
	}
	if _, err := f.store.Host("r1-n05"); err == nil {
		t.Fatal("a host record exists after the refused join")
	}
	if _, err := f.store.Transition("r1-n05", state.LifecycleDeploying, state.LifecycleDeployed, "done"); err != nil {
		t.Fatal(err)
	}
	if code, e := postJoin(t, f, req); code != 409 {
		t.Fatalf("join after an unverified deploy = %d %+v, want 409", code, e)
	}
	other := f.token(t, v1.EnrolmentRequest{Host: "r1-n05", Server: "r1-n05", Deploy: "bbbbbbbbbbbb"})
	if _, err := f.store.UpdateServer("r1-n05", func(s *state.Server) error { s.Deploy.Verified = true; return nil }); err != nil {
		t.Fatal(err)
	}
	if code, _ := postJoin(t, f, v1.JoinRequest{Token: other.Token, CSR: csrPEM(t, key), Facts: facts("r1-n05")}); code != 409 {
		t.Fatalf("join with another deploy's token = %d, want 409", code)
	}
	if code, e := postJoin(t, f, req); code != 200 {
		t.Fatalf("join after the verified done = %d %+v, want 200 (the refusals used nothing)", code, e)
	}
}
