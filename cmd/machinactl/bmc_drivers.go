package main

import (
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path"
	"strings"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/bmc/ipmi"
	"github.com/machina-metal/machina/bmc/redfish"
)

// newDriver returns the bmc.Driver for driver ("redfish" or "ipmi") talking
// to address with the given credentials. insecure skips TLS verification
// (Redfish only).
//
// For redfish, address is "host[:port]", "https://host[:port]", or the URL
// of one ComputerSystem ("https://host/redfish/v1/Systems/<ID>"), which
// selects that system on a BMC with several. For ipmi it is "host[:port]"
// (IPMI v2.0 lanplus, default port 623).
func newDriver(driver, address, user, pass string, insecure bool, o driverOpts) (bmc.Driver, error) {
	switch driver {
	case "redfish":
		endpoint, system, err := splitRedfishAddress(address)
		if err != nil {
			return nil, err
		}
		var pool *x509.CertPool
		if o.caFile != "" {
			pem, err := os.ReadFile(o.caFile)
			if err != nil {
				return nil, fmt.Errorf("--ca-file: %w", err)
			}
			pool = x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--ca-file %s: no PEM certificate in it", o.caFile)
			}
		}
		return redfish.New(redfish.Config{Endpoint: endpoint, SystemID: system, Username: user, Password: pass, Insecure: insecure,
			Auth: o.auth, RootCAs: pool, Logger: o.logger, PowerTimeout: o.powerTimeout, SoftOffTimeout: o.softOffTimeout,
			ResetEvidenceTimeout: o.resetEvidenceTimeout})
	case "ipmi":
		if strings.Contains(address, "://") || strings.Contains(address, "@") {
			return nil, fmt.Errorf("--address: ipmi wants host[:port] (default port 623), without scheme or credentials")
		}
		return ipmi.New(ipmi.Config{Address: address, Username: user, Password: pass, Logger: o.logger, PowerTimeout: o.powerTimeout, SoftOffTimeout: o.softOffTimeout})
	}
	return nil, fmt.Errorf("unknown bmc driver %q (want redfish or ipmi)", driver)
}

// driverOpts are the optional driver settings of `machinactl bmc`.
type driverOpts struct {
	auth           string        // redfish: auto, session or basic ("" is auto)
	caFile         string        // redfish: PEM file of CAs or the BMC's certificate to trust
	logger         *slog.Logger  // the driver's warnings, to stderr
	powerTimeout   time.Duration // bounds waiting for a power state; zero is the driver's default
	softOffTimeout time.Duration // bounds a graceful shutdown before forcing off; zero is the driver's default
	// resetEvidenceTimeout bounds watching for proof that a reset
	// restarted the machine (redfish); zero is the driver's default.
	resetEvidenceTimeout time.Duration
}

// splitRedfishAddress returns the base URL and the system ID named by a
// /redfish/v1/Systems/<ID> path, if any.
func splitRedfishAddress(address string) (endpoint, system string, err error) {
	if address == "" {
		return "", "", fmt.Errorf("--address is required")
	}
	if !strings.Contains(address, "://") {
		address = "https://" + address
	}
	u, err := url.Parse(address)
	if err == nil && u.User != nil {
		return "", "", fmt.Errorf("--address must not carry credentials (value not shown); use --username and --password-stdin")
	}
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") || u.RawQuery != "" {
		return "", "", fmt.Errorf("--address %q: want host[:port] or an http(s) URL without credentials or query", address)
	}
	p := strings.TrimRight(u.Path, "/")
	switch {
	case p == "" || strings.EqualFold(p, "/redfish/v1"):
	case strings.HasPrefix(strings.ToLower(p), "/redfish/v1/systems/") && strings.Count(p, "/") == 4:
		system = path.Base(p)
	default:
		return "", "", fmt.Errorf("--address %q: path must be empty or /redfish/v1/Systems/<ID>", address)
	}
	return u.Scheme + "://" + u.Host, system, nil
}
