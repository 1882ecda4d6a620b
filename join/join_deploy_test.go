package join_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/netip"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/join/node"
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

// TestJoinRefusalsPaced: 200 joins with a real enrolment token bound to
// a deploy not yet done (409) and 200 with a used token (401), a bounded
// flood on loopback, write one event at once per kind of refusal and one
// summary per interval, and every refusal is counted (before the fix
// each used-token refusal appended an event and each not-deployed one
// logged a Warn line, per request).
func TestJoinRefusalsPaced(t *testing.T) {
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
	bound := f.token(t, v1.EnrolmentRequest{Host: "r1-n05", Server: "r1-n05", Deploy: "aaaaaaaaaaaa"})
	plain := f.token(t, v1.EnrolmentRequest{Host: "hv9"})
	if code, e := postJoin(t, f, v1.JoinRequest{Token: plain.Token, CSR: csrPEM(t, key), Facts: facts("hv9")}); code != 200 {
		t.Fatalf("first join = %d %+v", code, e)
	}
	countRefused := func() int {
		evs, err := f.store.Events(state.EventQuery{Limit: 10000})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range evs {
			if e.Kind == state.EventTokenRefused {
				n++
			}
		}
		return n
	}
	e0 := countRefused()
	csr := csrPEM(t, key)
	// One client, kept-alive connections: the join listener caps 64 open
	// connections per address.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: node.PinnedTLS(f.ca.Fingerprint(), "127.0.0.1")}}
	defer hc.CloseIdleConnections()
	post := func(req v1.JoinRequest) (int, v1.Error) {
		data, _ := json.Marshal(req)
		r, err := hc.Post(f.url+"/hosts/join", "application/json", bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		var e v1.Error
		_ = json.NewDecoder(r.Body).Decode(&e)
		return r.StatusCode, e
	}
	for i := range 200 {
		if code, e := post(v1.JoinRequest{Token: bound.Token, CSR: csr, Facts: facts("r1-n05")}); code != 409 {
			t.Fatalf("join %d while deploying = %d %+v, want 409", i, code, e)
		}
		if code, e := post(v1.JoinRequest{Token: plain.Token, CSR: csr, Facts: facts("hv9")}); code != 401 || e.Code != join.CodeTokenUsed {
			t.Fatalf("join %d with a used token = %d %+v, want 401 token_used", i, code, e)
		}
	}
	if n := countRefused() - e0; n != 2 {
		t.Errorf("400 refused joins wrote %d events at once, want 2 (one per server)", n)
	}
	if err := f.store.FlushRefusals(); err != nil {
		t.Fatal(err)
	}
	if n := countRefused() - e0; n != 4 {
		t.Errorf("after the interval: %d refusal events, want 4 (two summaries)", n)
	}
	if c := f.store.RefusalCounts(); c[state.RefusalTokenMismatch] != 200 || c[state.RefusalTokenUsed] != 200 {
		t.Errorf("RefusalCounts = %v, want 200 mismatch (not deployed), 200 used", c)
	}
}

// TestJoinFromDeclaredAddress: a deployed server whose OS came up on its
// declared network (a static address from networks.yaml) joins from that
// address, not from its DHCP lease; a join from an address that is
// neither the lease nor declared is refused (409, token not used). The
// request comes from 127.0.0.1; the lease is 10.99.0.100.
func TestJoinFromDeclaredAddress(t *testing.T) {
	for _, tc := range []struct {
		name     string
		declared []netip.Addr
		want     int
	}{
		{"undeclared", []netip.Addr{netip.MustParseAddr("10.98.100.21")}, 409},
		{"declared", []netip.Addr{netip.MustParseAddr("10.98.100.21"), netip.MustParseAddr("127.0.0.1")}, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startListenerWith(t, func(c *join.Config) {
				c.LeasedIP = func(string) (netip.Addr, bool) { return netip.MustParseAddr("10.99.0.100"), true }
				c.DeclaredIPs = func(server string) []netip.Addr {
					if server != "r1-n05" {
						return nil
					}
					return tc.declared
				}
			})
			if _, err := f.store.CreateServer(state.Server{Name: "r1-n05"}); err != nil {
				t.Fatal(err)
			}
			for _, to := range []state.Lifecycle{state.LifecycleCommissioning, state.LifecycleReady, state.LifecycleAllocated, state.LifecycleDeploying, state.LifecycleDeployed} {
				s, _ := f.store.Server("r1-n05")
				if _, err := f.store.Transition("r1-n05", s.Lifecycle, to, "test"); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := f.store.UpdateServer("r1-n05", func(s *state.Server) error {
				s.Deploy = &state.DeployRecord{ID: "aaaaaaaaaaaa", Verified: true}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			tok := f.token(t, v1.EnrolmentRequest{Host: "r1-n05", Server: "r1-n05", Deploy: "aaaaaaaaaaaa"})
			code, e := postJoin(t, f, v1.JoinRequest{Token: tok.Token, CSR: csrPEM(t, key), Facts: facts("r1-n05")})
			if code != tc.want {
				t.Fatalf("join from 127.0.0.1 = %d %+v, want %d", code, e, tc.want)
			}
			_, err := f.store.Host("r1-n05")
			if joined := err == nil; joined != (tc.want == 200) {
				t.Fatalf("host record after the join: %v, want joined %v", err, tc.want == 200)
			}
		})
	}
}
