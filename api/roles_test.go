package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
)

// TestRouteRolesCoverAdminRoutes: every built-in admin route has its
// role in the one table (api.RouteRoles), and a route mounted with
// HandleAdmin that the table lacks needs admin.
func TestRouteRolesCoverAdminRoutes(t *testing.T) {
	f := newFixture(t, state.Options{})
	table := api.RouteRoles()
	for _, p := range f.api.AdminRoutes() {
		if _, ok := table[p]; !ok {
			t.Errorf("admin route %s has no role in api.RouteRoles", p)
		}
	}
	if r, ok := api.RouteRole("POST /api/v1/not-in-the-table"); ok || r != state.RoleAdmin {
		t.Errorf("RouteRole(unknown) = %q, %v; want admin, false", r, ok)
	}
}

var wildcard = regexp.MustCompile(`\{[^}]*\}`)

// TestRolesEnforced drives every admin route of the server (the built-in
// ones and routes mounted with HandleAdmin, one of them absent from the
// table) with a viewer's, an operator's and an admin's token: a token
// whose role is below the table's entry gets 403 with code "forbidden"
// and the needed role named, in the JSON body and the message, and the
// handler never runs; any other answer is the handler's (not 401, not
// 403). Events of an operator's move carry the actor and its role.
func TestRolesEnforced(t *testing.T) {
	f := newFixture(t, state.Options{})
	ran := map[string]bool{}
	for _, p := range []string{"POST /api/v1/reconcile", "GET /api/v1/plan", "POST /api/v1/unlisted-test-route"} {
		if err := f.api.HandleAdmin(p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran[p+" "+api.Actor(r)+" "+string(api.ActorRole(r))] = true
			w.WriteHeader(http.StatusNoContent)
		})); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.store.CreateServer(state.Server{Name: "n1"}); err != nil {
		t.Fatal(err)
	}
	toks := map[state.Role]string{state.RoleAdmin: f.token}
	for _, r := range []state.Role{state.RoleViewer, state.RoleOperator} {
		v, _, err := f.store.CreateAdminTokenRole(string(r)+"-tok", r, state.ActorLocal)
		if err != nil {
			t.Fatal(err)
		}
		toks[r] = v
	}
	names := map[state.Role]string{state.RoleViewer: "viewer-tok", state.RoleOperator: "operator-tok", state.RoleAdmin: "ops"}
	routes := f.api.AdminRoutes()
	if len(routes) < 18 {
		t.Fatalf("only %d admin routes: %v", len(routes), routes)
	}
	for _, p := range routes {
		need, _ := api.RouteRole(p)
		method, path, _ := strings.Cut(p, " ")
		path = wildcard.ReplaceAllString(path, "n1")
		for _, role := range state.Roles() {
			body := ""
			if method == http.MethodPost || method == http.MethodPut {
				body = "{}" // refused by the handler (400) or accepted: not by the role check
			}
			if p == "DELETE /api/v1/admin-tokens/{name}" {
				path = "/api/v1/admin-tokens/nobody" // 404 from the handler, every token stays
			}
			var code int
			var h http.Header
			var data []byte
			if p == "GET /api/v1/events/stream" {
				code, h, data = f.streamHead(t, path, toks[role]) // the stream stays open: headers and the first bytes only
			} else {
				code, h, data = f.do(t, method, path+"?limit=1", toks[role], body)
			}
			if !role.Allows(need) {
				var e v1.Error
				if code != http.StatusForbidden || json.Unmarshal(data, &e) != nil || e.Code != v1.CodeForbidden || e.Role != string(need) ||
					!strings.Contains(e.Message, "role "+string(need)) || !strings.Contains(h.Get("WWW-Authenticate"), "insufficient_scope") {
					t.Errorf("%s as %s (needs %s): %d %s; want 403 forbidden naming %s", p, role, need, code, data, need)
				}
				if ran[p+" "+names[role]+" "+string(role)] {
					t.Errorf("%s ran its handler for a %s", p, role)
				}
				continue
			}
			if code == http.StatusForbidden || code == http.StatusUnauthorized {
				t.Errorf("%s as %s (needs %s): %d %s", p, role, need, code, data)
			}
		}
	}
	if !ran["POST /api/v1/reconcile operator-tok operator"] || !ran["POST /api/v1/unlisted-test-route ops admin"] || ran["POST /api/v1/unlisted-test-route operator-tok operator"] {
		t.Errorf("mounted handlers ran as %v", ran)
	}
	// The audit trail names the operator and its role.
	if _, err := f.store.Transition("n1", "new", "commissioning", "the reconciler"); err != nil {
		t.Fatal(err)
	}
	code, _, data := f.do(t, "POST", "/api/v1/servers/n1/transitions", toks[state.RoleOperator], `{"from":"commissioning","to":"failed","reason":"t"}`)
	if code != http.StatusOK {
		t.Fatalf("operator transition: %d %s", code, data)
	}
	evs, err := f.client.Events(t.Context(), 0, 500)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range evs.Events {
		if e.Actor == "operator-tok" && e.To == "failed" {
			found = true
			if e.Role != "operator" {
				t.Errorf("event %+v: role %q, want operator", e, e.Role)
			}
		}
	}
	if !found {
		t.Errorf("no event of the operator's move in %+v", evs.Events)
	}
}

// TestAdminTokenRoleThroughAPI: POST /api/v1/admin-tokens takes a role
// (default admin, an unknown one 400) and the list shows each token's
// role; a viewer cannot create a token (403 naming admin).
func TestAdminTokenRoleThroughAPI(t *testing.T) {
	f := newFixture(t, state.Options{})
	ctx := t.Context()
	for _, tc := range []struct{ name, role, want string }{{"v", "viewer", "viewer"}, {"o", "operator", "operator"}, {"a", "", "admin"}} {
		got, err := f.client.CreateAdminTokenRole(ctx, tc.name, tc.role)
		if err != nil || got.Role != tc.want || got.Token == "" {
			t.Errorf("create %s %q = %+v, %v", tc.name, tc.role, got, err)
		}
	}
	if code, _, data := f.do(t, "POST", "/api/v1/admin-tokens", f.token, `{"name":"x","role":"root"}`); code != http.StatusBadRequest {
		t.Errorf("unknown role: %d %s", code, data)
	}
	list, err := f.client.AdminTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, tk := range list.Tokens {
		got[tk.Name] = tk.Role
	}
	if want := map[string]string{"ops": "admin", "v": "viewer", "o": "operator", "a": "admin"}; !equalMaps(got, want) {
		t.Errorf("roles listed = %v, want %v", got, want)
	}
	v, _, _ := f.store.CreateAdminTokenRole("v2", state.RoleViewer, state.ActorLocal)
	vc, _ := v1.NewClient(f.srv.URL, v)
	if _, err := vc.CreateAdminTokenRole(ctx, "sneaky", "admin"); err == nil || !strings.Contains(err.Error(), "role admin") {
		t.Errorf("viewer creating a token: %v", err)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// streamHead opens path (an event stream) with token and returns the
// answer's status, headers and the first bytes of its body, then closes
// it (a refusal's body is whole: it is short).
func (f *fixture) streamHead(t testing.TB, path, token string) (int, http.Header, []byte) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 512)
	n, _ := resp.Body.Read(buf)
	return resp.StatusCode, resp.Header, buf[:n]
}
