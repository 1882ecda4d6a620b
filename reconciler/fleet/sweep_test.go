package fleet

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/state"
)

// TestBMCUnreadableClearedOnSecretChange (and the health event path): with a wrong secret the sweep
// records "BMC unreadable" on the server; once the secret is fixed, the
// servers that could not be read are read again at once (not at the next
// sweep, an hour away here, nor after the refused-credential skip), which
// clears it. A retired server never carries it. Real path: StoreDrivers
// builds Redfish drivers from the store's secret, bmcsim answers 401 to a
// wrong password. Before this fix the error stayed until the next sweep
// after the skip (about 70 s in the demo), retired servers included.
func TestBMCUnreadableClearedOnSecretChange(t *testing.T) {
	fixtures, err := bmcsim.FixturesDir()
	if err != nil {
		t.Fatal(err)
	}
	tree, err := bmcsim.TreeDir(fixtures, "dmtf-public-rackmount1")
	if err != nil {
		t.Fatal(err)
	}
	var trees bmcsim.Trees
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for i, name := range []string{"live", "gone"} {
		sim, err := trees.New(tree, bmcsim.Config{Username: "admin", Password: "right"})
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(sim)
		defer ts.Close()
		if _, err := st.CreateServer(state.Server{Name: name, Zone: "z", BootMAC: "52:54:00:22:00:0" + string(rune('1'+i)),
			BMC: state.BMCFacts{Driver: "redfish", Address: ts.URL, Credentials: "c"}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range []state.Move{{Server: "gone", From: state.LifecycleNew, To: state.LifecycleCommissioning},
		{Server: "gone", From: state.LifecycleCommissioning, To: state.LifecycleReady}} {
		if _, err := st.Apply(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.PutSecret("c", state.Credential{Username: "admin", Password: "wrong"}, "test"); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	drivers := &StoreDrivers{Store: st, Logger: log}
	defer drivers.Close(context.Background())
	w := NewSweep(st, drivers, time.Hour, log)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for _, name := range []string{"live", "gone"} {
		w.read(ctx, name) // one sweep's reads, unpaced
	}
	for _, name := range []string{"live", "gone"} {
		if s, _ := st.Server(name); !strings.Contains(s.BMCError, "401") {
			t.Fatalf("%s after a sweep with the wrong secret: BMCError %q, want the 401", name, s.BMCError)
		}
	}
	// Retire "gone": its next failed read clears the error instead.
	if _, err := st.Apply(state.Move{Server: "gone", From: state.LifecycleReady, To: state.LifecycleRetired}); err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	delete(w.skip, "gone")
	w.mu.Unlock()
	w.read(ctx, "gone")
	if s, _ := st.Server("gone"); s.BMCError != "" {
		t.Errorf("retired server keeps BMCError %q", s.BMCError)
	}

	w.first = time.Hour // no sweep during the test: only the secret change reads
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	time.Sleep(50 * time.Millisecond) // run has subscribed to SecretsChanged
	if _, err := st.PutSecret("c", state.Credential{Username: "admin", Password: "right"}, "test"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, _ := st.Server("live")
		if s.BMCError == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("BMCError %q 10 s after the secret was fixed; want it cleared by the re-read", s.BMCError)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The production path for a health other than OK (the
	// Redfish driver's OnEvent hook was set nowhere and is gone): the
	// sweep's read stores the BMC's rollup (the DMTF tree says Warning)
	// and Store.ObserveBMC writes an EventHealth event for the change.
	s, _ := st.Server("live")
	if s.Health != "Warning" {
		t.Errorf("health %q after the read, want the tree's Warning", s.Health)
	}
	evs, err := st.Events(state.EventQuery{Server: "live", Limit: state.MaxPageSize})
	if err != nil {
		t.Fatal(err)
	}
	health := false
	for _, e := range evs {
		health = health || e.Kind == state.EventHealth && strings.HasSuffix(e.Message, "→Warning")
	}
	if !health {
		t.Errorf("no EventHealth event ending →Warning in %+v", evs)
	}
	cancel()
	<-done
}
