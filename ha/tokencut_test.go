package ha

import (
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/machina-metal/machina/internal/etcdtest"
	"github.com/machina-metal/machina/state"
)

// TestTokenCheckCutOffEtcd: a controller cut off etcd must not refuse a
// machine's valid token as unknown (HTTP 403, which the agent does not
// retry): the check fails with the store's error instead (503 at the API,
// retried, and answered by the new leader). Failed before the fix in
// state's tokenKnown, which read a failed etcd Get as "no such token";
// found by lab/sim's TestHATwoControllersFailover.
func TestTokenCheckCutOffEtcd(t *testing.T) {
	cl := etcdtest.Start(t, etcdtest.Options{Members: 1})
	px := etcdtest.NewProxy(t, cl.Member(0).ClientURL)
	cfg := cl.Config()
	cfg.Endpoints = []string{px.URL()}
	c, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	st, err := state.OpenEtcd(state.EtcdConfig{Client: c, Prefix: "/site/", RequestTimeout: time.Second}, state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if _, err := st.CreateServer(state.Server{Name: "r1-n01", BootMAC: "52:54:00:00:01:01"}); err != nil {
		t.Fatal(err)
	}
	value, _, err := st.IssueToken(state.TokenSpec{Purpose: state.PurposeReport, Server: "r1-n01"})
	if err != nil {
		t.Fatal(err)
	}
	px.Partition()
	_, err = st.CheckToken(value, state.TokenClaim{Purpose: state.PurposeReport})
	if err == nil || errors.Is(err, state.ErrTokenUnknown) {
		t.Fatalf("CheckToken cut off etcd = %v, want the store's error, not ErrTokenUnknown", err)
	}
	if _, err := st.PeekToken(value, state.TokenClaim{Purpose: state.PurposeReport}); err == nil || errors.Is(err, state.ErrTokenUnknown) {
		t.Fatalf("PeekToken cut off etcd = %v, want the store's error, not ErrTokenUnknown", err)
	}
	_, _, _, err = st.UseToken(value, state.TokenUse{Claim: state.TokenClaim{Purpose: state.PurposeReport, Server: "r1-n01"},
		Effect: func(*state.Tx, state.Token) (state.Answer, error) { return state.Answer{}, nil }})
	if err == nil || errors.Is(err, state.ErrTokenUnknown) || errors.Is(err, state.ErrTokenUsed) || errors.Is(err, state.ErrTokenMismatch) {
		t.Fatalf("UseToken cut off etcd = %v, want the store's error, not a token refusal", err)
	}
	if n := st.UnknownTokenRefusals(); n != 0 {
		t.Fatalf("UnknownTokenRefusals = %d while cut off, want 0", n)
	}
	px.Heal()
	if _, err := st.CheckToken(value, state.TokenClaim{Purpose: state.PurposeReport}); err != nil {
		t.Fatalf("CheckToken after the heal = %v", err)
	}
}
