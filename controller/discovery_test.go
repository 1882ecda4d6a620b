package controller

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/discover"
	"github.com/machina-metal/machina/state"
)

// newScanAPIWith serves mountDiscovery over the admin API with scan and
// propose (nil: register refused) on a fresh store, and returns a client
// with an admin token named ops.
func newScanAPIWith(t *testing.T, scan scanFunc, propose proposeFunc, branch string) (*v1.Client, *state.Store) {
	t.Helper()
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{MasterKey: []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Config{Store: st, Heartbeat: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := mountDiscovery(srv, st, scan, propose, branch); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { hs.Close(); st.Close() })
	tok, _, err := st.CreateAdminToken("ops", state.ActorLocal)
	if err != nil {
		t.Fatal(err)
	}
	c, err := v1.NewClient(hs.URL, tok)
	if err != nil {
		t.Fatal(err)
	}
	return c, st
}

func newScanAPI(t *testing.T, scan scanFunc) (*v1.Client, *state.Store) {
	t.Helper()
	return newScanAPIWith(t, scan, nil, "")
}

func TestScanRoute(t *testing.T) {
	var trees bmcsim.Trees
	dir, err := bmcsim.TreeDir("", "dell-poweredge-r750-idrac9")
	if err != nil {
		t.Fatal(err)
	}
	sim, err := trees.New(dir, bmcsim.Config{Username: "root", Password: "s3cret-dell", LockoutThreshold: 3})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewTLSServer(sim)
	defer ts.Close()
	var seen discover.Config
	// The test wrapper alone reaches loopback; the request cannot.
	loop := func(ctx context.Context, cfg discover.Config) (*discover.Report, error) {
		seen = cfg
		cfg.AllowLoopback, cfg.Targets = true, []string{ts.Listener.Addr().String()}
		return discover.Scan(ctx, cfg)
	}
	c, st := newScanAPI(t, loop)
	for name, cr := range map[string]state.Credential{"bmc-wrong": {Username: "root", Password: "nope"}, "bmc-dell": {Username: "root", Password: "s3cret-dell"}} {
		if _, err := st.PutSecret(name, cr, "test"); err != nil {
			t.Fatal(err)
		}
	}
	var rep discover.Report
	err = c.Scan(context.Background(), v1.ScanRequest{CIDR: "10.0.0.0/30", Credentials: []string{"bmc-wrong", "bmc-dell"}, InsecureTLS: true}, &rep)
	if err != nil {
		t.Fatal(err)
	}
	if seen.AllowLoopback || len(seen.Targets) != 0 || seen.CIDR != "10.0.0.0/30" || len(seen.Credentials) != 2 || seen.Credentials[1].Password != "s3cret-dell" {
		t.Errorf("scan config from the request: %+v", seen)
	}
	if len(rep.Results) != 1 || rep.Results[0].Status != discover.StatusAuthenticated || rep.Results[0].Credentials != "bmc-dell" || rep.Results[0].Failures != 1 {
		t.Fatalf("report: %+v", rep)
	}
	if sim.Locked() {
		t.Error("locked")
	}
	evs, err := st.Events(state.EventQuery{})
	if err != nil {
		t.Fatal(err)
	}
	audited := false
	for _, e := range evs {
		if e.Kind == "scan" && e.Actor == "ops" && strings.Contains(e.Message, "1 authenticated") {
			audited = true
		}
		if strings.Contains(e.Message, "s3cret") {
			t.Error("password in an event")
		}
	}
	if !audited {
		t.Errorf("no scan event: %+v", evs)
	}
	// Unknown credential: 404 before any probe.
	err = c.Scan(context.Background(), v1.ScanRequest{CIDR: "10.0.0.0/30", Credentials: []string{"nope"}}, &rep)
	if !v1.IsCode(err, "not_found") {
		t.Errorf("unknown credential: %v", err)
	}
}

func TestScanRouteRefusesRanges(t *testing.T) {
	c, st := newScanAPI(t, discover.Scan)
	if _, err := st.PutSecret("bmc-a", state.Credential{Username: "u", Password: "p"}, "test"); err != nil {
		t.Fatal(err)
	}
	for _, cidr := range []string{"127.0.0.1/32", "8.8.8.0/24", "10.0.0.0/16", "fd00::/120"} {
		var rep discover.Report
		err := c.Scan(context.Background(), v1.ScanRequest{CIDR: cidr, Credentials: []string{"bmc-a"}}, &rep)
		if !v1.IsCode(err, "bad_request") || !strings.Contains(err.Error(), "range") {
			t.Errorf("%s: %v", cidr, err)
		}
	}
}

// TestScanRouteIncomplete: a scan cut short (here its context ends before
// the first probe, as at scanTimeout) still answers 200 with what it
// learnt, marked incomplete in the answer and the audit event.
func TestScanRouteIncomplete(t *testing.T) {
	stopped := func(ctx context.Context, cfg discover.Config) (*discover.Report, error) {
		ctx, cancel := context.WithCancel(ctx)
		cancel()
		return discover.Scan(ctx, cfg)
	}
	c, st := newScanAPI(t, stopped)
	if _, err := st.PutSecret("bmc-a", state.Credential{Username: "u", Password: "p"}, "test"); err != nil {
		t.Fatal(err)
	}
	var rep discover.Report
	if err := c.Scan(context.Background(), v1.ScanRequest{CIDR: "10.0.0.0/30", Credentials: []string{"bmc-a"}}, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Incomplete == "" || rep.Range != "10.0.0.0/30" || len(rep.Results) != 0 {
		t.Fatalf("report: %+v", rep)
	}
	evs, err := st.Events(state.EventQuery{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Kind == "scan" && strings.Contains(e.Message, "(incomplete: ") {
			return
		}
	}
	t.Errorf("no incomplete scan event: %+v", evs)
}
