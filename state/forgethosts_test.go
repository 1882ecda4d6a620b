package state_test

import (
	"errors"
	"testing"

	"github.com/machina-metal/machina/state"
)

// TestMoveForgetsHostsInItsTransaction: a Move with ForgetHosts gives the
// server back and forgets its hosts (status, no fingerprint, an
// EventHostForgotten after the move's event) in one transaction, on both
// engines; hosts of other servers are untouched; an unknown status is
// refused with nothing written.
func TestMoveForgetsHostsInItsTransaction(t *testing.T) {
	eachEngine(t, func(t *testing.T) {
		s := openTest(t, state.Options{})
		for _, name := range []string{"a", "b"} {
			mustCreate(t, s, state.Server{Name: name, Lifecycle: state.LifecycleDeployed})
			if _, err := s.PutHost(state.Host{Name: "h-" + name, Server: name, CertFingerprint: "fp", JoinStatus: "joined"}); err != nil {
				t.Fatal(err)
			}
		}
		_, err := s.Apply(state.Move{Server: "a", From: state.LifecycleDeployed, To: state.LifecycleReady, ForgetHosts: "gone"})
		if !errors.Is(err, state.ErrInvalid) {
			t.Fatalf("Apply with ForgetHosts %q = %v, want ErrInvalid", "gone", err)
		}
		if srv, _ := s.Server("a"); srv.Lifecycle != state.LifecycleDeployed {
			t.Fatalf("a after a refused move = %s, want deployed", srv.Lifecycle)
		}
		if _, err := s.Apply(state.Move{Server: "a", From: state.LifecycleDeployed, To: state.LifecycleReady,
			ForgetHosts: state.HostReleased, ForgetReason: "given back"}); err != nil {
			t.Fatal(err)
		}
		if h, _ := s.Host("h-a"); h.JoinStatus != state.HostReleased || h.CertFingerprint != "" || h.JoinReason != "given back" {
			t.Errorf("h-a = %+v, want released, no fingerprint, reason given back", h)
		}
		if h, _ := s.Host("h-b"); h.JoinStatus != "joined" || h.CertFingerprint != "fp" {
			t.Errorf("h-b = %+v, want untouched", h)
		}
		evs := allEvents(t, s, state.EventQuery{Server: "a"})
		var kinds []state.EventKind
		for _, e := range evs[1:] { // after server.created
			kinds = append(kinds, e.Kind)
		}
		if len(kinds) != 2 || kinds[0] != state.EventTransition || kinds[1] != state.EventHostForgotten || evs[2].Seq != evs[1].Seq+1 {
			t.Errorf("events of a = %+v, want the move then host.forgotten, adjacent", evs)
		}
	})
}
