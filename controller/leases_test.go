package controller

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/boot/dhcp"
	"github.com/machina-metal/machina/state"
)

type fixedPlanner struct{}

func (fixedPlanner) DeployPlan(_ context.Context, srv state.Server) (v1.Plan, error) {
	return v1.Plan{ImageURL: "http://127.0.0.1/img", ImageSHA256: strings.Repeat("ab", 32), ImageSizeBytes: 4 << 20,
		Seed: v1.Seed{InstanceID: "i-1", Hostname: srv.Name}}, nil
}

// TestLeasesSurviveRestart: the DHCP server's ACK (PutLease through the
// lease store the controller gives it in full mode) is kept in the state
// file, so after a controller restart the DHCP server reloads it and a
// plan request for the server from another address is still refused
// (403) while one from the leased address is served. Before the fix the
// leases were a dhcp.MemLeases made at start: after a restart it was
// empty and the request from the other address got the plan.
func TestLeasesSurviveRestart(t *testing.T) {
	const mac = "52:54:00:00:00:31"
	leased := netip.MustParseAddr("127.0.0.9")
	path := filepath.Join(t.TempDir(), "state.db")
	st, err := state.Open(path, state.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateServer(state.Server{Name: "r1-n31", BootMAC: mac}); err != nil {
		t.Fatal(err)
	}
	for _, to := range []state.Lifecycle{state.LifecycleCommissioning, state.LifecycleReady, state.LifecycleAllocated, state.LifecycleDeploying} {
		s, _ := st.Server("r1-n31")
		if _, err := st.Transition("r1-n31", s.Lifecycle, to, "test"); err != nil {
			t.Fatal(err)
		}
	}
	var store dhcp.LeaseStore = api.StateLeases{Store: st}
	hw, _ := net.ParseMAC(mac)
	if err := store.PutLease(t.Context(), dhcp.Lease{MAC: hw, IP: leased, Expires: time.Now().Add(time.Hour), Hostname: "r1-n31"}); err != nil {
		t.Fatal(err)
	}
	plan, _, err := st.IssueToken(state.TokenSpec{Purpose: state.PurposePlan, Server: "r1-n31", MAC: mac})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil { // the controller stops
		t.Fatal(err)
	}

	st, err = state.Open(path, state.Options{NoSync: true}) // and starts again
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	leases := &api.StateLeases{Store: st}
	// What the DHCP server loads at Listen.
	if got, err := leases.Leases(t.Context()); err != nil || len(got) != 1 || got[0].MAC.String() != mac || got[0].IP != leased {
		t.Errorf("leases after the restart = %+v, %v", got, err)
	}
	a, err := api.New(api.Config{Store: st, Heartbeat: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	m, err := api.NewMachine(api.MachineConfig{Store: st, Planner: fixedPlanner{}, Leases: leases})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Mount(a); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(a.Handler())
	defer hs.Close()
	get := func(from string) int {
		t.Helper()
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		hc := &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
		defer hc.CloseIdleConnections()
		req, _ := http.NewRequest(http.MethodGet, hs.URL+v1.PathAgentPlan, nil)
		req.Header.Set("Authorization", "Bearer "+plan)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("127.0.0.1"); code != http.StatusForbidden {
		t.Fatalf("plan from 127.0.0.1 after the restart, with %s leased: %d, want 403", leased, code)
	}
	if code := get(leased.String()); code != http.StatusOK {
		t.Fatalf("plan from the leased %s after the restart: %d, want 200", leased, code)
	}
}
