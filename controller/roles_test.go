package controller

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/state"
)

// TestRouteRolesMatchMountedRoutes mounts every admin route the
// controller mounts (mountAllAdmin: the adminRoutes list and
// join.RegisterAdmin) as Run does
// and checks them against the one role table, api.RouteRoles, both ways:
// each admin route has its role there, and each entry is a route served.
// The serial console, which authenticates itself, refuses a viewer's
// token (401, as a bad token) and lets an operator's through (404: no
// such server).
func TestRouteRolesMatchMountedRoutes(t *testing.T) {
	srv, st := mountAllAdmin(t)
	table := api.RouteRoles()
	served := map[string]bool{}
	for _, p := range srv.Routes() {
		served[p] = true
	}
	admin := srv.AdminRoutes()
	if len(admin) < 27 {
		t.Fatalf("only %d admin routes mounted: %v", len(admin), admin)
	}
	for _, p := range admin {
		if _, ok := table[p]; !ok {
			t.Errorf("admin route %s has no role in api.RouteRoles", p)
		}
	}
	for p := range table {
		if !served[p] {
			t.Errorf("api.RouteRoles has %s, which no handler serves", p)
		}
	}

	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	for _, tc := range []struct {
		role state.Role
		code int
	}{{state.RoleViewer, http.StatusUnauthorized}, {state.RoleOperator, http.StatusNotFound}, {state.RoleAdmin, http.StatusNotFound}} {
		tok, _, err := st.CreateAdminTokenRole("tok-"+string(tc.role), tc.role, state.ActorLocal)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodGet, hs.URL+"/api/v1/servers/nosuch/console", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.code {
			t.Errorf("console as %s: %s, want %d", tc.role, resp.Status, tc.code)
		}
	}
}
