// Package ui is Machina's web console: server-rendered pages (html/template)
// and small vanilla JavaScript modules, all embedded with go:embed and
// served under /ui/ with no outside request (the provisioning network is
// offline) and no build step. xterm.js is vendored from npm into
// static/vendor (pinned by ui/package-lock.json; see docs/ui.md).
//
// Pages: the fleet by zone with filters, live rows from the admin API's
// event stream and a lifecycle-over-time chart; a server page (identity,
// hardware, BMC read model, conditions, events, allocation, join log);
// images; hosts; inventory (acting and newest revision, validation errors,
// held plans with a confirm-then-approve flow calling state.Store.Approve);
// and a serial console (xterm.js on the console package's WebSocket).
//
// Security: login with an admin token (state.Store.AuthenticateAdmin)
// starts a server-side session whose cookie is HttpOnly, SameSite=Strict,
// Path=/ui/, Secure over TLS, and expires after Config.SessionTTL; every
// request re-checks the token, so revoking it ends the session. Every
// change is a POST with the session's CSRF token and a same-origin
// Origin/Sec-Fetch-Site. Every answer carries a Content-Security-Policy
// whose script-src is 'self' only: no inline script, handler attribute or
// eval runs. Approvals are recorded as state events whose Actor is the
// token's name, like the API's changes; console attach and detach are
// audited by the console handler under "ui:<token name>".
//
// ui imports state and bmc (for bmc.Info). The reconciler, images and
// console packages are reached through the small interfaces in Config
// (InventorySource, ImageSource, BMCInfoSource, an http.Handler), wired in
// cmd/machina.
package ui
