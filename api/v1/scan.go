package v1

import (
	"context"
	"net/http"
)

// ScanRequest is the body of POST /api/v1/scan: scan a private IPv4 range
// for Redfish BMCs with credentials of the controller's secret store.
type ScanRequest struct {
	// CIDR is a range inside 10/8, 172.16/12 or 192.168/16 of at most 512
	// addresses.
	CIDR string `json:"cidr"`
	// Credentials are 1 to 3 secret names, tried in order.
	Credentials []string `json:"credentials"`
	// LockoutThreshold is the BMCs' lockout after N consecutive failures;
	// 0 means 3 (at most 2 failures are spent per BMC).
	LockoutThreshold int `json:"lockoutThreshold,omitempty"`
	// Port is the Redfish HTTPS port; 0 means 443.
	Port int `json:"port,omitempty"`
	// InsecureTLS accepts the BMCs' self-signed certificates.
	InsecureTLS bool `json:"insecureTLS,omitempty"`
	// Register proposes the authenticated BMCs as new servers.yaml entries
	// (as `machinactl scan --register`): the controller commits them,
	// validated, onto a new review branch "discovered/YYYY-MM-DD" of the
	// inventory repository, or onto CommitTo. Zone is then required.
	Register bool `json:"register,omitempty"`
	// Zone is the zone of the proposed servers (Register only).
	Zone string `json:"zone,omitempty"`
	// Site, if set, is their site (Register only).
	Site string `json:"site,omitempty"`
	// CommitTo, if set, must be the inventory branch the controller
	// follows: the entries are committed straight onto it instead of a
	// review branch (Register only).
	CommitTo string `json:"commitTo,omitempty"`
}

// Scan calls POST /api/v1/scan and decodes the report (the discover
// package's Report: range, probed, results; with Register also
// "registered": branch, commit, added, skipped) into out.
func (c *Client) Scan(ctx context.Context, req ScanRequest, out any) error {
	return c.do(ctx, http.MethodPost, "/api/v1/scan", nil, req, out)
}
