// Package api is Machina's HTTP server. This file set holds the admin API
// under /api/v1 (bearer admin tokens stored hashed in state), /healthz and
// /metrics (Prometheus text exposition); machine-facing endpoints (boot,
// report, plan, image, join) mount here later, gated by state machine
// tokens.
//
// Each admin route needs a role of the token (viewer, operator, admin),
// declared in one table (RouteRoles); a lower role gets 403 "forbidden"
// naming the role needed.
//
// Every change made through the API is recorded as a state event whose
// Actor is the admin token's name, never the token, and Role its role. No response, log line
// or event carries a secret's value.
//
// api imports api/v1 and state; it must not import the reconciler.
package api
