// Package discover finds Redfish BMCs on a private IPv4 range, authenticates
// to each with a short ordered list of named credentials without ever
// tripping an account lockout, reads their identity and NIC MACs, and
// proposes the authenticated ones as new servers.yaml entries in a Git
// commit for review ([Register]).
//
// A scan only ever talks to RFC 1918 ranges (10/8, 172.16/12, 192.168/16) of
// at most [MaxAddresses] addresses; loopback is reachable only through the
// explicit test override [Config.AllowLoopback].
package discover

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/machina-metal/machina/macaddr"
)

// MaxAddresses is the largest range a scan accepts (a /23).
const MaxAddresses = 512

// MaxCredentials is how many credentials a scan tries per BMC at most.
const MaxCredentials = 3

// DefaultLockoutThreshold is the lockout threshold assumed when
// Config.LockoutThreshold is zero: three consecutive failures, the strictest
// common BMC default, so at most two failures are spent per BMC.
const DefaultLockoutThreshold = 3

// Errors of range validation; the returned errors wrap them.
var (
	// ErrRange reports a CIDR that is malformed, not IPv4, outside the
	// private ranges, or loopback without the test override.
	ErrRange = errors.New("discover: range refused")
	// ErrTooLarge reports a range of more than MaxAddresses addresses.
	ErrTooLarge = errors.New("discover: range too large")
	// ErrNoCredentials reports a scan given no credential or more than
	// MaxCredentials.
	ErrNoCredentials = errors.New("discover: credentials")
)

var private = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
}

var loopback = netip.MustParsePrefix("127.0.0.0/8")

// Credential is one named credential of the controller's secret store.
// Name is what a registered server's bmc.credentials refers to; Username
// and Password are never logged, printed or returned in a [Result].
type Credential struct {
	Name     string
	Username string
	Password string
}

// String returns the name only, so a credential cannot leak through %v.
func (c Credential) String() string { return c.Name }

// Config is one scan.
type Config struct {
	// CIDR is the IPv4 range to scan, e.g. "10.10.1.0/24". Network and
	// broadcast addresses of ranges larger than /31 are skipped.
	CIDR string
	// Credentials are tried in order, at most MaxCredentials of them.
	Credentials []Credential
	// LockoutThreshold is the BMCs' lockout after this many consecutive
	// failed logins; zero means DefaultLockoutThreshold. A scan spends at
	// most min(LockoutThreshold-1, MaxCredentials) failures per BMC.
	LockoutThreshold int
	// Port is the Redfish port; zero means 443 (80 when Scheme is http).
	Port int
	// Scheme is "https" (default) or "http" (tests, plain-HTTP emulators).
	Scheme string
	// InsecureTLS skips certificate verification (BMCs ship self-signed
	// certificates). Registered entries carry it as bmc.insecureTLS.
	InsecureTLS bool
	// Concurrency bounds the addresses probed at once; zero means 32.
	Concurrency int
	// Timeout bounds each HTTP request (connect, TLS, headers and body);
	// zero means 5 s.
	Timeout time.Duration
	// AllowLoopback is the test override: it admits 127.0.0.0/8 ranges and
	// Targets. Never set in production (the controller and machinactl
	// have no flag for it).
	AllowLoopback bool
	// Targets, with AllowLoopback, replaces CIDR by explicit loopback
	// host:port pairs (emulators listen on ephemeral ports).
	Targets []string
	// Logger receives one Debug line per address; nil discards.
	Logger *slog.Logger
}

// Status is the outcome of probing one address.
type Status string

// Outcomes of one address.
const (
	// StatusAuthenticated: a Redfish service that accepted a credential.
	StatusAuthenticated Status = "authenticated"
	// StatusAuthFailed: a Redfish service that refused every credential
	// tried (at most the lockout budget).
	StatusAuthFailed Status = "auth-failed"
	// StatusNotRedfish: something answered HTTP but not a Redfish service root.
	StatusNotRedfish Status = "not-redfish"
	// StatusError: a connection was made but the exchange failed (TLS
	// handshake, timeout, reset, unreadable identity).
	StatusError Status = "error"
)

// Result is what a scan learnt of one address that answered TCP.
type Result struct {
	// Address is the Redfish base URL, e.g. "https://10.10.1.11".
	Address string `json:"address"`
	Status  Status `json:"status"`
	// Credentials is the name of the credential that worked.
	Credentials string `json:"credentials,omitempty"`
	// Attempts is how many credentials were tried; Failures how many the
	// BMC refused.
	Attempts int `json:"attempts"`
	Failures int `json:"failures"`
	// RedfishVersion is the service root's RedfishVersion.
	RedfishVersion string `json:"redfishVersion,omitempty"`
	// Identity of the first System (Redfish ComputerSystem properties).
	SystemID     string `json:"systemID,omitempty"`
	Manufacturer string `json:"manufacturer,omitempty"`
	Model        string `json:"model,omitempty"`
	Serial       string `json:"serial,omitempty"`
	UUID         string `json:"uuid,omitempty"`
	// MACs are the System's EthernetInterfaces MACs in lower-case colon
	// form, boot-MAC candidates in the BMC's order.
	MACs []string `json:"macs,omitempty"`
	// InsecureTLS records that the certificate was not verified.
	InsecureTLS bool `json:"insecureTLS,omitempty"`
	// Error says why the status is not authenticated.
	Error string `json:"error,omitempty"`
}

// Report is the outcome of a scan.
type Report struct {
	// Range is the scanned range in canonical form (host bits cleared,
	// see [Range]), or "targets" in test mode.
	Range string `json:"range"`
	// Probed is how many addresses were tried.
	Probed int `json:"probed"`
	// Results holds the addresses that accepted a TCP connection, in
	// address order; silent addresses are only counted in Probed.
	Results []Result `json:"results"`
	// Incomplete, when set, says why the scan stopped early (its context
	// ended: cancelled, or the controller's bound on one scan): addresses
	// not yet probed are missing from Results and some results may be
	// timeouts.
	Incomplete string `json:"incomplete,omitempty"`
}

// Addresses validates cidr and returns the host addresses to probe:
// private IPv4 (10/8, 172.16/12, 192.168/16) or, with allowLoopback,
// 127.0.0.0/8; at most MaxAddresses; network and broadcast addresses
// dropped for prefixes shorter than /31. Host bits are cleared, as nmap and
// ipcalc do ("192.168.1.77/24" is 192.168.1.0/24; [Range] names the range
// scanned). Errors wrap ErrRange or ErrTooLarge.
func Addresses(cidr string, allowLoopback bool) ([]netip.Addr, error) {
	p, err := parseRange(cidr, allowLoopback)
	if err != nil {
		return nil, err
	}
	size := uint64(1) << (32 - p.Bits())
	var out []netip.Addr
	for a, i := p.Addr(), uint64(0); i < size; a, i = a.Next(), i+1 {
		if size > 2 && (i == 0 || i == size-1) {
			continue
		}
		out = append(out, a)
	}
	return out, nil
}

// Range validates cidr as [Addresses] does and returns the range a scan of
// it covers in canonical form, host bits cleared: "192.168.1.77/24" gives
// "192.168.1.0/24", a bare address "10.0.0.5" gives "10.0.0.5/32".
func Range(cidr string, allowLoopback bool) (string, error) {
	p, err := parseRange(cidr, allowLoopback)
	if err != nil {
		return "", err
	}
	return p.String(), nil
}

// parseRange is the validation of Addresses and Range.
func parseRange(cidr string, allowLoopback bool) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(strings.TrimSpace(cidr))
	if err != nil {
		if a, aerr := netip.ParseAddr(strings.TrimSpace(cidr)); aerr == nil && a.Is4() {
			p = netip.PrefixFrom(a, 32)
		} else {
			return netip.Prefix{}, fmt.Errorf("%w: %q is not an IPv4 CIDR", ErrRange, cidr)
		}
	}
	if !p.Addr().Is4() {
		return netip.Prefix{}, fmt.Errorf("%w: %q is not IPv4", ErrRange, cidr)
	}
	p = p.Masked()
	inside := func(set ...netip.Prefix) bool {
		for _, q := range set {
			if q.Bits() <= p.Bits() && q.Contains(p.Addr()) {
				return true
			}
		}
		return false
	}
	switch {
	case inside(private...):
	case allowLoopback && inside(loopback):
	default:
		return netip.Prefix{}, fmt.Errorf("%w: %s is not inside 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16", ErrRange, p)
	}
	if size := uint64(1) << (32 - p.Bits()); size > MaxAddresses {
		return netip.Prefix{}, fmt.Errorf("%w: %s holds %d addresses, more than %d", ErrTooLarge, p, size, MaxAddresses)
	}
	return p, nil
}

// target is one host:port to probe.
type target struct {
	hostport string
	addr     netip.Addr
	port     int
}

func (cfg *Config) targets() ([]target, error) {
	if len(cfg.Targets) > 0 {
		if !cfg.AllowLoopback {
			return nil, fmt.Errorf("%w: explicit targets are a test override and need AllowLoopback", ErrRange)
		}
		var out []target
		for _, t := range cfg.Targets {
			ap, err := netip.ParseAddrPort(t)
			if err != nil || !loopback.Contains(ap.Addr()) {
				return nil, fmt.Errorf("%w: target %q is not a loopback IPv4 host:port", ErrRange, t)
			}
			out = append(out, target{hostport: t, addr: ap.Addr(), port: int(ap.Port())})
		}
		return out, nil
	}
	addrs, err := Addresses(cfg.CIDR, cfg.AllowLoopback)
	if err != nil {
		return nil, err
	}
	out := make([]target, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, target{hostport: net.JoinHostPort(a.String(), strconv.Itoa(cfg.Port)), addr: a, port: cfg.Port})
	}
	return out, nil
}

// Scan probes every address of cfg's range: GET /redfish/v1/ without
// credentials (a JSON object carrying RedfishVersion or a Systems link is a
// Redfish service, DSP0266 §8.1), then GET /redfish/v1/Systems with HTTP
// Basic credentials in order, stopping at the first that works and after
// min(LockoutThreshold-1, MaxCredentials) refusals, then reads the first
// System's identity and EthernetInterfaces MACs. At most Concurrency
// addresses are probed at once, each request bounded by Timeout. Only a
// refused range or credential list is an error; per-address failures are
// Results. A cancelled ctx returns what was learnt, marked
// Report.Incomplete, and ctx.Err(). At most maxNICs (64) NICs are read per
// System.
func Scan(ctx context.Context, cfg Config) (*Report, error) {
	if len(cfg.Credentials) == 0 || len(cfg.Credentials) > MaxCredentials {
		return nil, fmt.Errorf("%w: give 1 to %d credential names, got %d", ErrNoCredentials, MaxCredentials, len(cfg.Credentials))
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	ts, err := cfg.targets()
	if err != nil {
		return nil, err
	}
	rep := &Report{Range: "targets", Probed: len(ts)}
	if len(cfg.Targets) == 0 {
		// Validated by targets: the canonical range actually scanned.
		rep.Range, _ = Range(cfg.CIDR, cfg.AllowLoopback)
	}
	tr := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: cfg.Timeout}).DialContext,
		TLSClientConfig:       &tls.Config{InsecureSkipVerify: cfg.InsecureTLS, MinVersion: tls.VersionTLS12}, //nolint:gosec // opt-in, recorded per entry
		TLSHandshakeTimeout:   cfg.Timeout,
		ResponseHeaderTimeout: cfg.Timeout,
		MaxIdleConnsPerHost:   1,
		DisableCompression:    true,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: cfg.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	results := make([]*Result, len(ts))
	sem := make(chan struct{}, cfg.Concurrency)
	var wg sync.WaitGroup
	for i, t := range ts {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			results[i] = probe(ctx, client, &cfg, t)
		}()
	}
	wg.Wait()
	for _, r := range results {
		if r != nil {
			rep.Results = append(rep.Results, *r)
		}
	}
	if err := ctx.Err(); err != nil {
		rep.Incomplete = "the scan was stopped before it finished: " + err.Error()
	}
	return rep, ctx.Err()
}

// setDefaults fills cfg's zero values (https, its port, the default
// lockout threshold, 32 probes at once, 5 s, a discarding logger) and
// checks scheme, port and threshold.
func (cfg *Config) setDefaults() error {
	switch cfg.Scheme {
	case "":
		cfg.Scheme = "https"
	case "https", "http":
	default:
		return fmt.Errorf("discover: scheme %q: want https or http", cfg.Scheme)
	}
	if cfg.Port == 0 {
		cfg.Port = 443
		if cfg.Scheme == "http" {
			cfg.Port = 80
		}
	}
	if cfg.Port < 1 || cfg.Port > 65535 {
		return fmt.Errorf("discover: port %d out of range", cfg.Port)
	}
	if cfg.LockoutThreshold == 0 {
		cfg.LockoutThreshold = DefaultLockoutThreshold
	}
	if cfg.LockoutThreshold < 2 {
		return fmt.Errorf("%w: a lockout threshold of %d leaves no failure to spend; give the one right credential with threshold 2 or more", ErrNoCredentials, cfg.LockoutThreshold)
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 32
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// probe returns nil when nothing accepted a TCP connection.
func probe(ctx context.Context, client *http.Client, cfg *Config, t target) *Result {
	base := cfg.Scheme + "://" + t.hostport
	if (cfg.Scheme == "https" && t.port == 443) || (cfg.Scheme == "http" && t.port == 80) {
		base = cfg.Scheme + "://" + t.addr.String()
	}
	log := cfg.Logger.With("address", base)
	res := &Result{Address: base, InsecureTLS: cfg.Scheme == "https" && cfg.InsecureTLS}
	root, status, err := getJSON(ctx, client, base, "/redfish/v1/", nil)
	if err != nil {
		if isDialError(err) {
			log.Debug("scan: no answer", "err", err)
			return nil
		}
		res.Status, res.Error = StatusError, "service root: "+describe(err)
		log.Debug("scan: error", "err", err)
		return res
	}
	if status != http.StatusOK || root == nil || (root["RedfishVersion"] == nil && link(root, "Systems") == "") {
		res.Status, res.Error = StatusNotRedfish, fmt.Sprintf("GET /redfish/v1/ answered %d without a Redfish service root", status)
		log.Debug("scan: not redfish", "status", status)
		return res
	}
	res.RedfishVersion, _ = root["RedfishVersion"].(string)
	systems := link(root, "Systems")
	if systems == "" {
		systems = "/redfish/v1/Systems"
	}
	cred, coll := login(ctx, client, cfg, base, systems, res, log)
	if cred == nil {
		res.Status = StatusAuthFailed
		if res.Attempts < len(cfg.Credentials) {
			res.Error += fmt.Sprintf("; stopped after %d failures to stay under a lockout of %d", res.Failures, cfg.LockoutThreshold)
		}
		return res
	}
	res.Status, res.Credentials, res.Error = StatusAuthenticated, cred.Name, ""
	ms := members(coll)
	if len(ms) == 0 {
		res.Status, res.Error = StatusError, "the Systems collection is empty"
		return res
	}
	sys, st, err := getJSON(ctx, client, base, ms[0], cred)
	if err != nil || st != http.StatusOK || sys == nil {
		res.Status, res.Error = StatusError, fmt.Sprintf("read system %s: %s", ms[0], errOr(err, st))
		return res
	}
	res.SystemID = str(sys, "Id")
	res.Manufacturer, res.Model = str(sys, "Manufacturer"), str(sys, "Model")
	res.Serial, res.UUID = str(sys, "SerialNumber"), str(sys, "UUID")
	res.MACs = systemMACs(ctx, client, base, link(sys, "EthernetInterfaces"), cred)
	log.Debug("scan: authenticated", "credential", cred.Name, "macs", len(res.MACs))
	return res
}

// login tries cfg's credentials on the Systems collection, spending at
// most the lockout budget (LockoutThreshold-1, and MaxCredentials) on
// refusals, and returns the first that works with the collection it read;
// nil when none did (res says why).
func login(ctx context.Context, client *http.Client, cfg *Config, base, systems string, res *Result, log *slog.Logger) (*Credential, map[string]any) {
	budget := min(cfg.LockoutThreshold-1, MaxCredentials)
	for i := range cfg.Credentials {
		if res.Failures >= budget || res.Attempts >= MaxCredentials {
			break
		}
		c := &cfg.Credentials[i]
		res.Attempts++
		body, st, err := getJSON(ctx, client, base, systems, c)
		if err == nil && st == http.StatusOK && body != nil {
			return c, body
		}
		// Any answer other than success may have counted as a failed login
		// on the BMC, so it is spent from the lockout budget.
		res.Failures++
		switch {
		case err != nil:
			res.Error = "credential " + c.Name + ": " + describe(err)
		default:
			res.Error = fmt.Sprintf("credential %s: GET %s answered %d", c.Name, systems, st)
		}
		log.Debug("scan: credential refused", "credential", c.Name, "status", st)
	}
	return nil, nil
}

// systemMACs reads the MAC addresses of a System's EthernetInterfaces
// (eth, "" for none; at most maxNICs members), each once, the current
// address before the permanent one.
func systemMACs(ctx context.Context, client *http.Client, base, eth string, cred *Credential) []string {
	if eth == "" {
		return nil
	}
	var macs []string
	if ec, st, err := getJSON(ctx, client, base, eth, cred); err == nil && st == http.StatusOK {
		ms := members(ec)
		ms = ms[:min(len(ms), maxNICs)]
		for _, m := range ms {
			nic, st, err := getJSON(ctx, client, base, m, cred)
			if err != nil || st != http.StatusOK {
				continue
			}
			for _, k := range []string{"MACAddress", "PermanentMACAddress"} {
				if m, err := macaddr.Parse(strings.TrimSpace(str(nic, k))); err == nil && !m.IsZero() {
					mac := m.String()
					if !slices.Contains(macs, mac) {
						macs = append(macs, mac)
					}
					break
				}
			}
		}
	}
	return macs
}

// maxNICs bounds the EthernetInterfaces members read per System, so a
// responder listing thousands of slow members cannot hold a scan slot for
// thousands of request timeouts (servers have a handful of NICs).
const maxNICs = 64

// maxBody bounds any response body read during a scan.
const maxBody = 1 << 20

// getJSON GETs base+path (path must be an absolute Redfish path on the same
// host; @odata.id links are never followed elsewhere) and decodes a JSON
// object; a non-JSON body yields a nil map and no error.
func getJSON(ctx context.Context, client *http.Client, base, path string, c *Credential) (map[string]any, int, error) {
	if !strings.HasPrefix(path, "/redfish/v1") {
		return nil, 0, fmt.Errorf("link %q is not under /redfish/v1", path)
	}
	u, err := url.Parse(base + path)
	if err != nil {
		return nil, 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("OData-Version", "4.0")
	if c != nil {
		req.SetBasicAuth(c.Username, c.Password)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, resp.StatusCode, err
	}
	var m map[string]any
	if json.Unmarshal(data, &m) != nil {
		m = nil
	}
	return m, resp.StatusCode, nil
}

// isDialError reports a failure to open the TCP connection (refused,
// unreachable, connect timeout): the address is treated as empty.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// describe names a per-address failure without echoing URLs with
// credentials (Basic auth is a header, so the URL carries none).
func describe(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var rec tls.RecordHeaderError
	var cv *tls.CertificateVerificationError
	switch {
	case errors.As(err, &cv):
		return "tls certificate not trusted (use insecure TLS for self-signed BMC certificates): " + cv.Error()
	case errors.As(err, &rec):
		return "tls handshake failed: " + err.Error()
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return "timeout"
	}
	return err.Error()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func errOr(err error, status int) string {
	if err != nil {
		return describe(err)
	}
	return "status " + strconv.Itoa(status)
}

func str(m map[string]any, k string) string { s, _ := m[k].(string); return strings.TrimSpace(s) }

func link(m map[string]any, k string) string {
	o, _ := m[k].(map[string]any)
	return str(o, "@odata.id")
}

func members(m map[string]any) []string {
	arr, _ := m["Members"].([]any)
	var out []string
	for _, v := range arr {
		if o, ok := v.(map[string]any); ok {
			if id := str(o, "@odata.id"); id != "" {
				out = append(out, id)
			}
		}
	}
	return out
}
