package controller

import (
	"net/http"
	"reflect"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// apiTags are the document's groups, in the order docs/api.md shows them.
var apiTags = []any{
	map[string]any{"name": "status", "description": "The controller's health and the OpenAPI document."},
	map[string]any{"name": "servers", "description": "Servers, their lifecycle and their events."},
	map[string]any{"name": "inventory", "description": "The Git inventory, the plan, approvals and provisioning."},
	map[string]any{"name": "hosts", "description": "Joined hosts: enrolment, fencing."},
	map[string]any{"name": "images", "description": "OS images."},
	map[string]any{"name": "admin", "description": "Secrets, admin tokens, BMC discovery and state snapshots."},
}

// Common path and query parameters.
var (
	serverName = map[string]string{"name": "The server's name (inventory key)."}
	pageQuery  = []apiParam{
		{"after", "integer", "Return events after this sequence number (0: from the first)."},
		{"limit", "integer", "At most this many events (1 to 10000; default 100)."},
	}
)

// componentNames rename the components of Go types whose own names say
// too little outside their package.
var componentNames = map[reflect.Type]string{
	reflect.TypeFor[plan.Result](): "PlanResult",
	reflect.TypeFor[plan.Step]():   "PlanStep",
}

// reconcileAccepted is POST /api/v1/reconcile's answer.
type reconcileAccepted struct {
	// Status is "reconcile requested".
	Status string `json:"status"`
}

// apiOperations is the admin API as the OpenAPI document describes it:
// one entry per route mounted behind an admin token (api.Server's
// built-in routes, HandleAdmin's of the controller and the join server),
// in the order docs/api.md shows them. To add a route: mount it, give it
// its role in api/roles.go, add its entry here (with the Go types its
// handler encodes and decodes), and run
// `go test ./controller -run TestOpenAPIDocumentFresh -update` to rewrite
// api/openapi.json and docs/api.md; the tests in openapi_test.go fail
// until the three agree.
var apiOperations = []apiOp{
	{Pattern: "GET /api/v1/status", Role: state.RoleViewer, ID: "getStatus", Tag: "status",
		Summary:   "Fleet counts by lifecycle, secret sealing, the last event and the Git side's health.",
		Responses: []apiResp{{Status: http.StatusOK, Description: "The controller's status.", Body: v1.Status{}}}},
	{Pattern: "GET /api/v1/openapi.json", Role: state.RoleViewer, ID: "getOpenAPI", Tag: "status",
		Summary:   "This document (OpenAPI 3.1, JSON).",
		Responses: []apiResp{{Status: http.StatusOK, Description: "The OpenAPI document the controller was built with.", Media: "application/json"}}},

	{Pattern: "GET /api/v1/servers", Role: state.RoleViewer, ID: "listServers", Tag: "servers",
		Summary:     "List servers, by name, one page at a time.",
		Description: "Pass the answer's `next` as `after` for the following page; no `next` means the last page.",
		Query: []apiParam{
			{"zone", "string", "Only servers of this zone."},
			{"lifecycle", "string", "Only servers in this lifecycle state (new, commissioning, ready, allocated, deploying, deployed, failed, retired)."},
			{"after", "string", "Return servers whose name sorts after this one."},
			{"limit", "integer", "At most this many servers (1 to 10000; default 100)."},
		},
		Responses: []apiResp{{Status: http.StatusOK, Description: "A page of servers.", Body: v1.ServerList{}}},
		Errors:    map[int]string{http.StatusBadRequest: "An unknown lifecycle or a limit out of range (code bad_request)."}},
	{Pattern: "GET /api/v1/servers/{name}", Role: state.RoleViewer, ID: "getServer", Tag: "servers",
		Summary: "One server's observed state.", Path: serverName,
		Responses: []apiResp{{Status: http.StatusOK, Description: "The server.", Body: v1.Server{}}},
		Errors:    map[int]string{http.StatusNotFound: ""}},
	{Pattern: "GET /api/v1/servers/{name}/events", Role: state.RoleViewer, ID: "listServerEvents", Tag: "servers",
		Summary: "One server's events, oldest first.", Path: serverName, Query: pageQuery,
		Responses: []apiResp{{Status: http.StatusOK, Description: "A page of events.", Body: v1.EventList{}}},
		Errors:    map[int]string{http.StatusBadRequest: "", http.StatusNotFound: ""}},
	{Pattern: "GET /api/v1/servers/{name}/firmware", Role: state.RoleViewer, ID: "getServerFirmware", Tag: "servers",
		Summary:     "The server's last firmware read from its BMC: BIOS attributes and registry, storage, firmware inventory, Secure Boot, the volumes Machina created.",
		Description: "What `machinactl plan` checks a profile's firmware block against. 404 `not_read` until the BMC has been read (Redfish servers, at commissioning).",
		Path:        serverName,
		Responses:   []apiResp{{Status: http.StatusOK, Description: "The server's firmware as last read.", Body: state.Firmware{}}},
		Errors:      map[int]string{http.StatusNotFound: ""}},
	{Pattern: "POST /api/v1/servers/{name}/transitions", Role: state.RoleOperator, ID: "transitionServer", Tag: "servers",
		Summary:     "Move a server through its lifecycle (compare-and-swap on `from`).",
		Description: "Only the moves an operator may make by hand are accepted; the others are the controller's own.",
		Path:        serverName, Request: v1.TransitionRequest{},
		Example:   `{"from": "ready", "to": "retired", "reason": "fan failure"}`,
		Responses: []apiResp{{Status: http.StatusOK, Description: "The server after the move.", Body: v1.Server{}}},
		Errors: map[int]string{http.StatusBadRequest: "", http.StatusNotFound: "", http.StatusRequestEntityTooLarge: "",
			http.StatusConflict: "The move is not allowed from the server's lifecycle, or `from` is stale (code conflict; `lifecycle` names the current state)."}},
	{Pattern: "GET /api/v1/events", Role: state.RoleViewer, ID: "listEvents", Tag: "servers",
		Summary: "Every event (lifecycle moves, actions, audit), oldest first.", Query: pageQuery,
		Responses: []apiResp{{Status: http.StatusOK, Description: "A page of events.", Body: v1.EventList{}}},
		Errors:    map[int]string{http.StatusBadRequest: ""}},
	{Pattern: "GET /api/v1/events/stream", Role: state.RoleViewer, ID: "streamEvents", Tag: "servers",
		Summary: "New events as Server-Sent Events.",
		Description: "Each event is `id: <seq>`, `event: <kind>` and `data: <Event JSON>`; comment lines keep the connection alive. " +
			"A reconnecting client's `Last-Event-ID` header resumes after that sequence number; without it or `after` the stream starts with the next new event. " +
			"The stream ends when the token is revoked.",
		Query: []apiParam{
			{"server", "string", "Only this server's events."},
			{"after", "integer", "Start after this sequence number."},
			{"unnamed", "string", "1 or true: leave out the `event:` line (a browser's EventSource then delivers every kind as `message`)."},
		},
		Responses: []apiResp{{Status: http.StatusOK, Description: "An endless event stream.", Media: "text/event-stream"}},
		Errors:    map[int]string{http.StatusBadRequest: ""}},

	{Pattern: "GET /api/v1/plan", Role: state.RoleViewer, ID: "getPlan", Tag: "inventory",
		Summary:   "The reconciler's latest plan: its steps, the held steps and why, conditions, profile selections, firmware changes.",
		Responses: []apiResp{{Status: http.StatusOK, Description: "The latest plan.", Body: plan.Result{}}}},
	{Pattern: "GET /api/v1/inventory", Role: state.RoleViewer, ID: "getInventory", Tag: "inventory",
		Summary:   "The acting inventory revision, the newest invalid one and its errors, and the held plan.",
		Responses: []apiResp{{Status: http.StatusOK, Description: "The inventory's status.", Body: gitops.InventoryStatus{}}}},
	{Pattern: "POST /api/v1/reconcile", Role: state.RoleOperator, ID: "reconcile", Tag: "inventory",
		Summary:   "Poll Git and plan now.",
		Responses: []apiResp{{Status: http.StatusAccepted, Description: "Requested; the pass runs in the background.", Body: reconcileAccepted{}}}},
	{Pattern: "GET /api/v1/approvals", Role: state.RoleViewer, ID: "listApprovals", Tag: "inventory",
		Summary:   "The recorded approvals of held plans.",
		Responses: []apiResp{{Status: http.StatusOK, Description: "The approvals.", Body: v1.ApprovalList{}}}},
	{Pattern: "POST /api/v1/approve", Role: state.RoleOperator, ID: "approve", Tag: "inventory",
		Summary:     "Approve the held plan of the acting inventory revision (the safety brake).",
		Description: "`revision` is the inventory digest's hex (12 to 64 digits), not a commit id.",
		Request:     v1.ApproveRequest{}, Example: `{"revision": "3f2a9c81d0e4"}`,
		Responses: []apiResp{{Status: http.StatusOK, Description: "Recorded (or recorded before).", Body: v1.ApproveResponse{}}},
		Errors: map[int]string{http.StatusBadRequest: "Malformed body (bad_request), or not a digest (invalid_revision).",
			http.StatusConflict: "The revision matches no held plan; nothing is recorded (code not_held)."}},
	{Pattern: "POST /api/v1/provision", Role: state.RoleOperator, ID: "provision", Tag: "inventory",
		Summary: "Allocate and deploy `count` servers of a profile.", Request: v1.ProvisionRequest{},
		Example:   `{"profile": "web", "count": 2}`,
		Responses: []apiResp{{Status: http.StatusOK, Description: "The servers allocated.", Body: v1.ProvisionResponse{}}},
		Errors: map[int]string{http.StatusBadRequest: "Malformed body, unknown profile or bad count (code bad_request).",
			http.StatusConflict: "Fewer servers fit the profile than asked (code insufficient_capacity)."}},

	{Pattern: "GET /api/v1/hosts", Role: state.RoleViewer, ID: "listHosts", Tag: "hosts",
		Summary:   "Joined hosts, online from their heartbeats.",
		Responses: []apiResp{{Status: http.StatusOK, Description: "The hosts.", Body: v1.HostList{}}}},
	{Pattern: "GET /api/v1/join/info", Role: state.RoleViewer, ID: "getJoinInfo", Tag: "hosts",
		Summary:   "The join listener's URL, its CA's fingerprint and PEM, and the join script's digest.",
		Responses: []apiResp{{Status: http.StatusOK, Description: "What a host needs to join.", Body: v1.JoinInfo{}}}},
	{Pattern: "POST /api/v1/join/tokens", Role: state.RoleAdmin, ID: "createEnrolmentToken", Tag: "hosts",
		Summary: "Issue a single-use enrolment token for a host to join.", Request: v1.EnrolmentRequest{},
		Example:   `{"ttl": "1h"}`,
		Responses: []apiResp{{Status: http.StatusCreated, Description: "The token (shown once; Cache-Control: no-store).", Body: v1.EnrolmentToken{}}},
		Errors:    map[int]string{http.StatusBadRequest: "Malformed body, a TTL out of range or an invalid network or pool (code bad_request)."}},
	{Pattern: "POST /api/v1/hosts/{name}/fence", Role: state.RoleOperator, ID: "fenceHost", Tag: "hosts",
		Summary:     "Fence a host: power its server off through the BMC and read the power back off.",
		Description: "Answers only after the power read back off; audited as an event naming the token.",
		Path:        map[string]string{"name": "The host's name."}, Request: v1.FenceRequest{},
		Example:   `{"reason": "lost heartbeat, storage split-brain"}`,
		Responses: []apiResp{{Status: http.StatusOK, Description: "Fenced.", Body: v1.FenceResult{}}},
		Errors: map[int]string{http.StatusBadRequest: "No reason, or a malformed body (code bad_request).", http.StatusNotFound: "No such host (code not_found).",
			http.StatusConflict:   "The host has no known server, or a fence is running (code conflict).",
			http.StatusBadGateway: "The power did not read back off (code fence_failed; the device's sanitised error)."}},
	{Pattern: "POST /api/v1/hosts/{name}/unfence", Role: state.RoleOperator, ID: "unfenceHost", Tag: "hosts",
		Summary: "Lift a host's fence (the controller may power it on again).",
		Path:    map[string]string{"name": "The host's name."}, Request: v1.FenceRequest{},
		Example:   `{"reason": "storage repaired"}`,
		Responses: []apiResp{{Status: http.StatusOK, Description: "The host, unfenced.", Body: v1.Host{}}},
		Errors: map[int]string{http.StatusBadRequest: "No reason, or a malformed body (code bad_request).", http.StatusNotFound: "No such host (code not_found).",
			http.StatusConflict: "The host is not fenced (not_fenced) or has no known server (conflict)."}},

	{Pattern: "GET /api/v1/images", Role: state.RoleViewer, ID: "listImages", Tag: "images",
		Summary:   "Every image the inventory names or the store holds: state, digest, import progress and failure.",
		Responses: []apiResp{{Status: http.StatusOK, Description: "The images, by name.", Body: v1.ImageList{}}}},

	{Pattern: "GET /api/v1/secrets", Role: state.RoleAdmin, ID: "listSecrets", Tag: "admin",
		Summary:   "The stored credentials' names and metadata (never their values).",
		Responses: []apiResp{{Status: http.StatusOK, Description: "The secrets.", Body: v1.SecretList{}}}},
	{Pattern: "PUT /api/v1/secrets/{name}", Role: state.RoleAdmin, ID: "putSecret", Tag: "admin",
		Summary: "Store or replace a BMC credential (sealed at rest when sealing is on).",
		Path:    map[string]string{"name": "The credential's name, as the inventory's bmc.credentials names it."},
		Request: v1.SecretRequest{}, Example: `{"username": "admin", "password": "s3cret"}`,
		Responses: []apiResp{{Status: http.StatusOK, Description: "The secret's metadata.", Body: v1.Secret{}}},
		Errors:    map[int]string{http.StatusBadRequest: "", http.StatusRequestEntityTooLarge: ""}},
	{Pattern: "DELETE /api/v1/secrets/{name}", Role: state.RoleAdmin, ID: "deleteSecret", Tag: "admin",
		Summary: "Delete a credential.", Path: map[string]string{"name": "The credential's name."},
		Responses: []apiResp{{Status: http.StatusNoContent, Description: "Deleted."}},
		Errors:    map[int]string{http.StatusNotFound: ""}},
	{Pattern: "GET /api/v1/admin-tokens", Role: state.RoleAdmin, ID: "listAdminTokens", Tag: "admin",
		Summary:   "The admin tokens (names, roles, creators; never their values).",
		Responses: []apiResp{{Status: http.StatusOK, Description: "The tokens.", Body: v1.AdminTokenList{}}}},
	{Pattern: "POST /api/v1/admin-tokens", Role: state.RoleAdmin, ID: "createAdminToken", Tag: "admin",
		Summary: "Create an admin token with a role (default admin).", Request: v1.AdminTokenRequest{},
		Example:   `{"name": "grafana", "role": "viewer"}`,
		Responses: []apiResp{{Status: http.StatusCreated, Description: "The token; its value is shown once.", Body: v1.AdminTokenCreated{}}},
		Errors:    map[int]string{http.StatusBadRequest: "", http.StatusRequestEntityTooLarge: "", http.StatusConflict: "A token of that name exists (code conflict)."}},
	{Pattern: "DELETE /api/v1/admin-tokens/{name}", Role: state.RoleAdmin, ID: "revokeAdminToken", Tag: "admin",
		Summary: "Revoke an admin token (its open event streams end).", Path: map[string]string{"name": "The token's name."},
		Responses: []apiResp{{Status: http.StatusNoContent, Description: "Revoked."}},
		Errors:    map[int]string{http.StatusNotFound: "", http.StatusConflict: "It is the last token (code conflict): create another first."}},
	{Pattern: "POST /api/v1/scan", Role: state.RoleAdmin, ID: "scan", Tag: "admin",
		Summary:     "Scan a BMC subnet with stored credentials; optionally propose the servers found to the inventory.",
		Description: "With `register`, the servers found are proposed as a commit on the inventory branch (or a branch named by `commitTo`).",
		Request:     v1.ScanRequest{}, Example: `{"cidr": "10.0.40.0/28", "credentials": ["bmc-redfish"]}`,
		Responses: []apiResp{{Status: http.StatusOK, Description: "What each address answered.", Body: scanResponse{}}},
		Errors: map[int]string{http.StatusBadRequest: "Malformed body, a bad CIDR or an unknown credential (code bad_request or as named).",
			http.StatusUnprocessableEntity: "register: the proposed servers.yaml is invalid (code invalid_proposal).",
			http.StatusBadGateway:          "register: the push failed (code push_failed)."}},
	{Pattern: "GET /api/v1/state/snapshot", Role: state.RoleAdmin, ID: "getStateSnapshot", Tag: "admin",
		Summary:     "A consistent copy of the state database (bbolt), for backups.",
		Description: "Sealed secrets stay sealed in the copy. `machina state restore` puts it back.",
		Responses:   []apiResp{{Status: http.StatusOK, Description: "The database file.", Media: "application/octet-stream"}}},
}
