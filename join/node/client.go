// Package node is the host side of joining (cmd/machina-node): host facts,
// a key and CSR, the pinned join request, applying networks (netlink) and
// storage pools (directories, lvm2), reporting each step over mutual TLS,
// and heartbeats. It imports api/v1 and join/spec only (no state, no
// controller code), so the node binary stays small.
package node

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
)

// Files under the node's state directory (mode 0600, directory 0700).
const (
	KeyFile    = "node.key" // PKCS #8 PEM
	CertFile   = "node.crt" // PEM
	CAFile     = "ca.pem"
	ConfigFile = "node.json" // url, host, heartbeat
)

// Errors the join client returns; inspect with errors.Is.
var (
	// ErrPinMismatch: the listener's chain carries no CA whose public-key
	// SHA-256 is the pinned fingerprint (a wrong or impostor controller).
	ErrPinMismatch = errors.New("controller CA does not match the pinned fingerprint")
	// ErrRefused: the controller answered the join with an error.
	ErrRefused = errors.New("join refused by the controller")
)

// RefusedError carries the controller's answer to a refused join.
type RefusedError struct {
	Status int
	Body   v1.Error
}

// Error is "join refused by the controller: STATUS CODE: MESSAGE".
func (e *RefusedError) Error() string {
	return fmt.Sprintf("%v: %d %s: %s", ErrRefused, e.Status, e.Body.Code, e.Body.Message)
}

// Unwrap returns ErrRefused.
func (e *RefusedError) Unwrap() error { return ErrRefused }

// Facts gathers a host's facts: the kernel host name (first label,
// lower-cased), virtualisation CPU flags from root/proc/cpuinfo, whether
// root/dev/kvm exists, and MemTotal from root/proc/meminfo. root "" means /.
func Facts(root string) (v1.HostFacts, error) {
	if root == "" {
		root = "/"
	}
	var f v1.HostFacts
	hn, err := os.Hostname()
	if err != nil {
		return f, fmt.Errorf("node: facts: hostname: %w", err)
	}
	f.Hostname = strings.ToLower(strings.SplitN(hn, ".", 2)[0])
	if data, err := os.ReadFile(filepath.Join(root, "proc/cpuinfo")); err == nil {
		seen := map[string]bool{}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if !ok || strings.TrimSpace(k) != "flags" {
				continue
			}
			for _, fl := range strings.Fields(v) {
				if (fl == "vmx" || fl == "svm") && !seen[fl] {
					seen[fl] = true
					f.CPUFlags = append(f.CPUFlags, fl)
				}
			}
		}
	}
	if _, err := os.Stat(filepath.Join(root, "dev/kvm")); err == nil {
		f.KVM = true
	}
	if data, err := os.ReadFile(filepath.Join(root, "proc/meminfo")); err == nil {
		for line := range strings.SplitSeq(string(data), "\n") {
			if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				fs := strings.Fields(rest)
				if len(fs) >= 1 {
					kb, _ := strconv.ParseInt(fs[0], 10, 64)
					f.MemoryBytes = kb << 10
				}
			}
		}
	}
	return f, nil
}

// PinnedTLS returns a TLS client config that accepts the listener only if
// its presented chain contains a CA certificate whose SubjectPublicKeyInfo
// SHA-256 is fingerprint (hex) and the leaf verifies against that CA for
// serverName. The error on mismatch wraps ErrPinMismatch.
func PinnedTLS(fingerprint, serverName string) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // replaced by VerifyConnection below: chain to the pinned CA
		VerifyConnection: func(cs tls.ConnectionState) error {
			var ca *x509.Certificate
			for _, c := range cs.PeerCertificates {
				s := sha256.Sum256(c.RawSubjectPublicKeyInfo)
				if c.IsCA && hex.EncodeToString(s[:]) == fingerprint {
					ca = c
				}
			}
			if ca == nil || len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("node: %w (want %s)", ErrPinMismatch, fingerprint)
			}
			pool := x509.NewCertPool()
			pool.AddCert(ca)
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, DNSName: serverName})
			if err != nil {
				return fmt.Errorf("node: listener certificate: %w", err)
			}
			return nil
		},
	}
}

// JoinConfig configures Join.
type JoinConfig struct {
	URL         string // the join listener, https://HOST[:PORT]
	Fingerprint string // pinned CA public-key SHA-256, hex
	Token       string // enrolment token
	Dir         string // state directory for key, certificate and CA
	Facts       v1.HostFacts
	// HTTPTimeout bounds the join request; zero means 60s.
	HTTPTimeout time.Duration
	// MaxWait bounds the retries of a rate-limited (429), unavailable (503)
	// or unreachable listener; zero means 10 minutes.
	MaxWait time.Duration
	// LocalAddr is the source address of the join's connections (a host
	// with several addresses joins from its management one); the zero
	// value leaves it to the routing table.
	LocalAddr netip.Addr
}

// transport is the HTTP transport of the join and node clients: TLS tc,
// connections from local (zero: the routing table's choice). The join
// listener caps the connections one source address holds open
// (join.MaxConnsPerIP), so the clients close their idle connections when
// done (Join on return, Client.Run when it stops) rather than leaving them
// to the listener's idle timeout.
func transport(tc *tls.Config, local netip.Addr) *http.Transport {
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	if local.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: local.AsSlice()}
	}
	return &http.Transport{TLSClientConfig: tc, DialContext: d.DialContext, TLSHandshakeTimeout: 10 * time.Second,
		IdleConnTimeout: clientIdleTimeout, MaxIdleConnsPerHost: 2}
}

// clientIdleTimeout is how long the node agent keeps an idle connection
// to the join listener: below the listener's own idle timeout (30 s,
// join.Server), so the agent closes a connection before the controller
// does and never sends a heartbeat on one the controller is closing at
// that moment (with both at 30 s and a 30 s heartbeat interval, the
// request and the server's close crossed and the heartbeat failed with
// EOF). Heartbeats faster than this reuse their connection.
const clientIdleTimeout = 20 * time.Second

// Join generates an ECDSA P-256 key (kept in Dir), posts a CSR with the
// facts and token to URL/hosts/join over TLS pinned to Fingerprint, and
// stores the node certificate, the CA and the config in Dir. Running it
// again with a new token re-joins: a new key and certificate replace the
// old ones. Errors wrap ErrPinMismatch or a *RefusedError.
func Join(ctx context.Context, cfg JoinConfig) (v1.JoinResponse, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return v1.JoinResponse{}, fmt.Errorf("node: join: URL %q is not https://host[:port]", cfg.URL)
	}
	if cfg.HTTPTimeout <= 0 {
		cfg.HTTPTimeout = 60 * time.Second
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return v1.JoinResponse{}, fmt.Errorf("node: join: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return v1.JoinResponse{}, fmt.Errorf("node: join: key: %w", err)
	}
	csrDER, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: cfg.Facts.Hostname}, DNSNames: []string{cfg.Facts.Hostname}}, key)
	if err != nil {
		return v1.JoinResponse{}, fmt.Errorf("node: join: csr: %w", err)
	}
	req := v1.JoinRequest{Token: cfg.Token, Facts: cfg.Facts,
		CSR: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csrDER}))}
	hc := &http.Client{Timeout: cfg.HTTPTimeout, Transport: transport(PinnedTLS(cfg.Fingerprint, u.Hostname()), cfg.LocalAddr)}
	defer hc.CloseIdleConnections() // the node client that follows opens its own
	var resp v1.JoinResponse
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 10 * time.Minute
	}
	// A fleet deploying at once meets the listener's rate limit (429), and
	// a first boot may come before the listener is reachable: both are
	// retried with capped, jittered backoff. A refused join does not use up
	// the token, so retrying is safe; other refusals (bad token, failed
	// check, pin mismatch) are final.
	deadline := time.Now().Add(cfg.MaxWait)
	for attempt := 0; ; attempt++ {
		err = post(ctx, hc, strings.TrimSuffix(cfg.URL, "/")+"/hosts/join", req, &resp)
		if err == nil {
			break
		}
		var re *RefusedError
		var ne net.Error
		retry := (errors.As(err, &re) && (re.Status == http.StatusTooManyRequests || re.Status == http.StatusServiceUnavailable)) ||
			errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || (errors.As(err, &ne) && ne.Timeout())
		if !retry || time.Now().After(deadline) {
			return v1.JoinResponse{}, fmt.Errorf("node: join: %w", err)
		}
		wait := min(time.Second<<min(attempt, 5), 30*time.Second)
		wait = wait/2 + time.Duration(mrand.Int64N(int64(wait)))
		select {
		case <-ctx.Done():
			return v1.JoinResponse{}, fmt.Errorf("node: join: %w", ctx.Err())
		case <-time.After(wait):
		}
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return v1.JoinResponse{}, fmt.Errorf("node: join: %w", err)
	}
	nc := nodeConfig{URL: strings.TrimSuffix(cfg.URL, "/"), Host: resp.Host, HeartbeatSeconds: resp.HeartbeatSeconds}
	ncData, _ := json.Marshal(nc)
	files := []struct {
		name string
		data []byte
	}{
		{KeyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})},
		{CertFile, []byte(resp.Certificate)},
		{CAFile, []byte(resp.CA)},
		{ConfigFile, ncData},
	}
	for _, f := range files {
		if err := writeFileAtomic(filepath.Join(cfg.Dir, f.name), f.data); err != nil {
			return v1.JoinResponse{}, fmt.Errorf("node: join: save %s: %w", f.name, err)
		}
	}
	return resp, nil
}

type nodeConfig struct {
	URL              string `json:"url"`
	Host             string `json:"host"`
	HeartbeatSeconds int    `json:"heartbeatSeconds"`
}

func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func post(ctx context.Context, hc *http.Client, u string, in, out any) error {
	return postReq(ctx, hc, u, in, out, false)
}

// postReq is post; idempotent marks the request safe to send twice, so
// that net/http's Transport sends it again on a new connection when the
// kept-alive one it chose was closed by the server before any response
// (the Transport retries only requests it knows to be idempotent; an
// empty Idempotency-Key header tells it so and is not sent on the wire,
// net/http's Transport documentation). A server can close an idle
// connection at any moment (its idle timeout, a restart, an HA
// failover), so without it a heartbeat fails now and then with EOF.
func postReq(ctx context.Context, hc *http.Client, u string, in, out any, idempotent bool) error {
	data, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if idempotent {
		req.Header["Idempotency-Key"] = nil
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		e := &RefusedError{Status: resp.StatusCode}
		if json.Unmarshal(body, &e.Body) != nil {
			e.Body = v1.Error{Code: "http_" + strconv.Itoa(resp.StatusCode), Message: http.StatusText(resp.StatusCode)}
		}
		return e
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(body, out)
}

// Client talks to the join listener over mutual TLS with the node
// certificate stored by Join. Safe for concurrent use.
type Client struct {
	cfg nodeConfig
	tc  *tls.Config
	hc  *http.Client

	// Version is the node agent's build, sent with every heartbeat; ""
	// sends none.
	Version string
	// Uptime reads the host's uptime; nil reads /proc/uptime.
	Uptime func() (time.Duration, error)
	// started is when Load made this client (the agent's start).
	started time.Time
	// since returns the time since t; nil means time.Since.
	since func(time.Time) time.Duration
}

// Load reads the node's key, certificate, CA and config from dir.
func Load(dir string) (*Client, error) {
	var nc nodeConfig
	data, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if err != nil {
		return nil, fmt.Errorf("node: load: %w (has this host joined?)", err)
	}
	if err := json.Unmarshal(data, &nc); err != nil {
		return nil, fmt.Errorf("node: load: %s: %w", ConfigFile, err)
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile))
	if err != nil {
		return nil, fmt.Errorf("node: load: certificate: %w", err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		return nil, fmt.Errorf("node: load: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("node: load: %s holds no certificate", CAFile)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, Certificates: []tls.Certificate{pair}}
	return &Client{cfg: nc, tc: tc, hc: &http.Client{Timeout: 30 * time.Second, Transport: transport(tc, netip.Addr{})}, started: time.Now()}, nil
}

// SetLocalAddr makes the client's connections come from local (a host
// with several addresses heartbeats from its management one; the
// simulated lab gives each machine its own loopback address, as each real
// host has its own). Call it before the first request; the zero value
// leaves the source to the routing table.
func (c *Client) SetLocalAddr(local netip.Addr) {
	c.hc.CloseIdleConnections()
	c.hc = &http.Client{Timeout: c.hc.Timeout, Transport: transport(c.tc, local)}
}

// CloseIdleConnections closes the client's idle keep-alive connections
// (a finished join's steps, or an agent that stops), so that they do not
// hold one of the connections the join listener allows the host's
// address until its idle timeout.
func (c *Client) CloseIdleConnections() { c.hc.CloseIdleConnections() }

// Host returns the host name the controller recorded.
func (c *Client) Host() string { return c.cfg.Host }

// Heartbeat returns the interval the controller asked for (default 30s).
func (c *Client) Heartbeat() time.Duration {
	if c.cfg.HeartbeatSeconds <= 0 {
		return 30 * time.Second
	}
	return time.Duration(c.cfg.HeartbeatSeconds) * time.Second
}

func (c *Client) path(p string) string {
	return c.cfg.URL + "/hosts/" + url.PathEscape(c.cfg.Host) + "/" + p
}

// Step reports one step's outcome (POST /hosts/NAME/steps).
func (c *Client) Step(ctx context.Context, s v1.JoinStep) error {
	if err := post(ctx, c.hc, c.path("steps"), s, nil); err != nil {
		return fmt.Errorf("node: report step %s: %w", s.Step, err)
	}
	return nil
}

// Done reports the join's outcome (POST /hosts/NAME/done).
func (c *Client) Done(ctx context.Context, d v1.JoinDone) error {
	if err := post(ctx, c.hc, c.path("done"), d, nil); err != nil {
		return fmt.Errorf("node: report join outcome: %w", err)
	}
	return nil
}

// Beat sends one heartbeat (POST /hosts/NAME/heartbeat) carrying the
// host's uptime, the agent's own uptime and its version, so the controller
// tells a reboot from an agent restart. An unreadable uptime is left out.
func (c *Client) Beat(ctx context.Context) error {
	since := c.since
	if since == nil {
		since = time.Since
	}
	hb := v1.Heartbeat{AgentVersion: c.Version, AgentUptimeSeconds: since(c.started).Seconds(), AgentStartedAt: c.started.UTC()}
	up := c.Uptime
	if up == nil {
		up = ProcUptime
	}
	if d, err := up(); err == nil {
		hb.UptimeSeconds = d.Seconds()
	}
	// A heartbeat only records that the host is alive: sending it twice
	// is harmless, so it is retried on a connection the server closed.
	if err := postReq(ctx, c.hc, c.path("heartbeat"), hb, nil, true); err != nil {
		return fmt.Errorf("node: heartbeat: %w", err)
	}
	return nil
}

// Run heartbeats every Heartbeat() until ctx is done, then returns nil.
// Failures are passed to onErr (nil ignores them) and retried next tick.
// It closes the client's idle connections when it returns.
func (c *Client) Run(ctx context.Context, onErr func(error)) error {
	t := time.NewTicker(c.Heartbeat())
	defer t.Stop()
	defer c.hc.CloseIdleConnections()
	for {
		if err := c.Beat(ctx); err != nil && ctx.Err() == nil && onErr != nil {
			onErr(err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// ProcUptime reads the host's uptime from /proc/uptime (its first field,
// seconds since boot, proc(5)).
func ProcUptime() (time.Duration, error) {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("node: /proc/uptime is empty")
	}
	sec, err := strconv.ParseFloat(f[0], 64)
	if err != nil || sec < 0 {
		return 0, fmt.Errorf("node: /proc/uptime %q is not seconds", f[0])
	}
	return time.Duration(sec * float64(time.Second)), nil
}
