// Package join enrols hosts into the fleet (DESIGN.md "Flow" step 5): the
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
// api/v1 and join/spec; it must not import api, reconciler or deploy.
package join
