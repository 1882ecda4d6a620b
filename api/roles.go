package api

import (
	"maps"
	"net/http"

	"github.com/machina-metal/machina/state"
)

// routeRoles is the one table of the role each admin route needs
// (state.Role: viewer reads; operator also moves servers through their
// lifecycle, provisions, approves, fences and unfences, opens consoles,
// asks for a reconcile; admin also manages secrets and tokens, scans BMC
// subnets and takes state snapshots). The built-in routes and those the
// controller and the join server mount with HandleAdmin are listed here;
// a route mounted with HandleAdmin that is missing needs RoleAdmin
// (TestRouteRolesCoverAdminRoutes fails on it). The serial console
// (console.Pattern, mounted with HandleOperator) authenticates itself and
// checks this table's entry too.
var routeRoles = map[string]state.Role{
	"GET /api/v1/status":                      state.RoleViewer,
	"GET /api/v1/servers":                     state.RoleViewer,
	"GET /api/v1/servers/{name}":              state.RoleViewer,
	"GET /api/v1/servers/{name}/events":       state.RoleViewer,
	"GET /api/v1/servers/{name}/firmware":     state.RoleViewer,
	"POST /api/v1/servers/{name}/transitions": state.RoleOperator,
	"GET /api/v1/servers/{name}/console":      state.RoleOperator,
	"GET /api/v1/events":                      state.RoleViewer,
	"GET /api/v1/events/stream":               state.RoleViewer,
	"GET /api/v1/secrets":                     state.RoleAdmin,
	"PUT /api/v1/secrets/{name}":              state.RoleAdmin,
	"DELETE /api/v1/secrets/{name}":           state.RoleAdmin,
	"GET /api/v1/approvals":                   state.RoleViewer,
	"GET /api/v1/admin-tokens":                state.RoleAdmin,
	"POST /api/v1/admin-tokens":               state.RoleAdmin,
	"DELETE /api/v1/admin-tokens/{name}":      state.RoleAdmin,
	"GET /api/v1/state/snapshot":              state.RoleAdmin,
	"GET /api/v1/openapi.json":                state.RoleViewer,
	// controller (mountAdmin, mountDiscovery, mountImages, mountHosts)
	"POST /api/v1/reconcile":            state.RoleOperator,
	"GET /api/v1/plan":                  state.RoleViewer,
	"GET /api/v1/inventory":             state.RoleViewer,
	"POST /api/v1/approve":              state.RoleOperator,
	"POST /api/v1/provision":            state.RoleOperator,
	"POST /api/v1/scan":                 state.RoleAdmin,
	"GET /api/v1/images":                state.RoleViewer,
	"POST /api/v1/hosts/{name}/fence":   state.RoleOperator,
	"POST /api/v1/hosts/{name}/unfence": state.RoleOperator,
	// join.RegisterAdmin: an enrolment token is a credential.
	"POST /api/v1/join/tokens": state.RoleAdmin,
	"GET /api/v1/hosts":        state.RoleViewer,
	"GET /api/v1/join/info":    state.RoleViewer,
}

// RouteRole returns the role the admin route pattern (as mounted, e.g.
// "POST /api/v1/approve") needs: its entry in the table, RoleAdmin for a
// pattern the table lacks (the safe default), and whether it had one.
func RouteRole(pattern string) (state.Role, bool) {
	r, ok := routeRoles[pattern]
	if !ok {
		return state.RoleAdmin, false
	}
	return r, true
}

// RouteRoles returns a copy of the route → role table, for docs and for
// tests that check it against the routes served.
func RouteRoles() map[string]state.Role { return maps.Clone(routeRoles) }

type roleKey struct{}

// ActorRole returns the role of the admin token that authenticated r, or
// "" for unauthenticated routes.
func ActorRole(r *http.Request) state.Role {
	role, _ := r.Context().Value(roleKey{}).(state.Role)
	return role
}
