package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/spf13/cobra"
)

// envCA names the PEM file of the CA that signs the admin API's TLS
// certificate (machina bootstrap writes /etc/machina/ca.pem).
const envCA = "MACHINA_CA"

// connFlags are the root's --ca-file and --insecure, shared by every verb
// that talks to the admin API.
type connFlags struct {
	caFile   string
	insecure bool
}

func (c *connFlags) register(root *cobra.Command) {
	pf := root.PersistentFlags()
	pf.StringVar(&c.caFile, "ca-file", os.Getenv(envCA), "PEM file of the CA the admin API's certificate must chain to, and no other (env "+envCA+"; machina bootstrap writes /etc/machina/ca.pem); empty trusts the system roots")
	pf.BoolVar(&c.insecure, "insecure", false, "allow plain http:// to a non-loopback admin API (the admin token and any password then cross the network in clear)")
}

// isLoopbackHost reports whether host (no port) is a loopback IP or
// "localhost"; nothing is resolved.
func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// checkAPIURL refuses plain HTTP to a non-loopback host unless --insecure,
// before any connection is made.
func (c *connFlags) checkAPIURL(apiURL string) (*url.URL, error) {
	u, err := url.Parse(apiURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, &exitError{code: 2, err: fmt.Errorf("admin API URL %q: want https://host[:port] (or http:// on loopback)", apiURL)}
	}
	if u.Scheme == "http" && !isLoopbackHost(u.Hostname()) && !c.insecure {
		return nil, &exitError{code: 2, err: fmt.Errorf("refusing plain HTTP to %s, which is not a loopback address: the admin token and any password would cross the network in clear; "+
			"use the controller's https:// admin URL with --ca-file or %s (machina bootstrap wrote /etc/machina/ca.pem), or pass --insecure", u.Host, envCA)}
	}
	return u, nil
}

// httpClient builds the HTTP client for an admin API URL: TLS verified
// against --ca-file alone when given (the controller's CA is pinned), the
// system roots otherwise.
func (c *connFlags) httpClient() (*http.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil // an admin token never goes through an environment-configured proxy
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.caFile != "" {
		pemData, err := os.ReadFile(c.caFile)
		if err != nil {
			return nil, &exitError{code: 2, err: fmt.Errorf("--ca-file: %w", err)}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pemData) {
			return nil, &exitError{code: 2, err: fmt.Errorf("--ca-file %s: no PEM certificate in it", c.caFile)}
		}
		tc.RootCAs = pool
	}
	tr.TLSClientConfig = tc
	tr.DialContext = (&net.Dialer{Timeout: 10 * time.Second}).DialContext
	return &http.Client{Transport: tr}, nil
}

// apiClient builds a client for apiURL (--api or MACHINA_API) with the
// token from MACHINA_TOKEN, refusing plain HTTP off loopback (see
// checkAPIURL).
func (e *env) apiClient(apiURL string) (*v1.Client, error) {
	if _, err := e.conn.checkAPIURL(apiURL); err != nil {
		return nil, err
	}
	tok := os.Getenv(envToken)
	if tok == "" {
		return nil, fmt.Errorf("%s is not set: export the admin token machina bootstrap printed (machina sim: the export line its banner prints), or create one with `machinactl admin-token create NAME` (or `machina token create --name NAME` while no controller runs on the state file)", envToken)
	}
	hc, err := e.conn.httpClient()
	if err != nil {
		return nil, err
	}
	c, err := v1.NewClient(apiURL, tok)
	if err != nil {
		return nil, err
	}
	c.HTTP = hc
	return c, nil
}
