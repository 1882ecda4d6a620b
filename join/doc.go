// Package join enrols hosts into the fleet (docs/architecture.md "Flow" step 5): the
// controller CA (ECDSA P-256, key sealed in the state store), the join
// listener (TLS with a CA-signed certificate; install script, CA and
// machina-node downloads, POST /hosts/join, and node endpoints over mutual
// TLS), single-use enrolment tokens carrying site, rack, tags, networks and
// storage pools, host checks, node certificates, host records and join
// logs, and the first-boot command that pins the CA fingerprint and the
// install script's SHA-256.
//
// The node side (facts, CSR, applying networks and pools, heartbeats) is
// join/node; validation shared by both is join/spec. join imports state,
// inventory (profiles' join settings), api/v1 and join/spec; it must not
// import api, reconciler or deploy (api's admin server is reached through
// the AdminMux interface).
//
// Wiring in the controller: LoadOrCreateCA(store, nil) once the store is
// open; New(Config{Store, CA, URL, NodeBinary}) and Serve(ctx, ln) on its
// own TCP listener; RegisterAdmin(apiServer, joinServer, api.Actor) for
// the admin routes; per deploy, IssueToken(DeployEnrolment(profile,
// server, ttl), "controller") then FirstBootCommand for the seed.
package join
