package api_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
)

// TestTransitionReleaseIsOneWrite: a release through the API (deployed →
// ready) moves the server and forgets its hosts in one transaction. The
// failure is injected between what used to be two writes: a host record
// that cannot be decoded makes forgetting the hosts fail after the move
// was decided. The release must then answer an error and leave the server
// deployed with its allocation and its host trusted, never a server moved
// to ready whose host still holds its node certificate.
func TestTransitionReleaseIsOneWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	st, err := state.Open(path, state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateServer(state.Server{Name: "d1"}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []state.Move{{From: state.LifecycleNew, To: state.LifecycleCommissioning}, {From: state.LifecycleCommissioning, To: state.LifecycleReady},
		{From: state.LifecycleReady, To: state.LifecycleAllocated, Update: func(s *state.Server) error {
			s.Allocation = &state.Allocation{Profile: "hypervisor", Reason: "provision", At: time.Now()}
			return nil
		}},
		{From: state.LifecycleAllocated, To: state.LifecycleDeploying}, {From: state.LifecycleDeploying, To: state.LifecycleDeployed}} {
		m.Server = "d1"
		if _, err := st.Apply(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.PutHost(state.Host{Name: "h-d1", Server: "d1", CertFingerprint: "fp-d1", JoinStatus: "joined"}); err != nil {
		t.Fatal(err)
	}
	tok, _, err := st.CreateAdminToken("ops", state.ActorLocal)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	// The injected fault: a second host record that does not decode.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("hosts")).Put([]byte("h-torn"), []byte(`{"name":"h-torn","server":`))
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	st, err = state.Open(path, state.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a, err := api.New(api.Config{Store: st, Logger: log, Heartbeat: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(a.Handler())
	defer hs.Close()
	c, err := v1.NewClient(hs.URL, tok)
	if err != nil {
		t.Fatal(err)
	}

	got, err := c.Transition(context.Background(), "d1", v1.TransitionRequest{From: "deployed", To: "ready", Reason: "give back"})
	if err == nil {
		t.Fatalf("release with a host record that cannot be read = %+v, want an error", got)
	}
	d1, err := st.Server("d1")
	if err != nil {
		t.Fatal(err)
	}
	if d1.Lifecycle != state.LifecycleDeployed || d1.Allocation == nil || d1.NeedsWipe {
		t.Errorf("d1 after the failed release: lifecycle %s, allocation %+v, needsWipe %v; want deployed, kept, false (nothing written)",
			d1.Lifecycle, d1.Allocation, d1.NeedsWipe)
	}
	if h, _ := st.Host("h-d1"); h.JoinStatus != "joined" || h.CertFingerprint != "fp-d1" {
		t.Errorf("host h-d1 after the failed release = %+v, want joined with its fingerprint", h)
	}
	evs, err := st.Events(state.EventQuery{Server: "d1", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Kind == state.EventTransition && e.From == state.LifecycleDeployed {
			t.Errorf("event of a release that failed: %+v", e)
		}
	}
}
