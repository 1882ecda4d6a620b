package join

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/internal/connlimit"
	"github.com/machina-metal/machina/join/spec"
	"github.com/machina-metal/machina/state"
)

// Store is the part of *state.Store the join listener and admin routes use.
type Store interface {
	IssueEnrolmentToken(ttl time.Duration, payload json.RawMessage, actor string) (string, state.EnrolmentToken, error)
	ConsumeEnrolmentToken(value, host string) (state.EnrolmentToken, error)
	PeekEnrolmentToken(value string) (state.EnrolmentToken, error)
	Server(name string) (state.Server, error)
	PutHost(h state.Host) (state.Host, error)
	Host(name string) (state.Host, error)
	Hosts() ([]state.Host, error)
	UpdateHost(name string, fn func(*state.Host) error) (state.Host, error)
	AppendJoinLog(host string, e state.JoinLogEntry) (state.JoinLogEntry, error)
	RecordHeartbeat(host string, now time.Time, hb state.Heartbeat) (state.HeartbeatResult, error)
	RecordRefusal(server string, kind state.EventKind, why state.RefusalReason, message string) (first bool)
}

// Config configures New. Store, CA and URL are required; every other zero
// value is usable.
type Config struct {
	Store Store
	CA    *CA
	// URL is the listener's public base URL ("https://10.0.0.1:8443"),
	// written into enrolment answers and first-boot commands.
	URL string
	// Names are the DNS names and IPs of the serving certificate; nil means
	// the host of URL plus "localhost" and 127.0.0.1.
	Names []string
	// NodeBinary is the machina-node executable served at
	// /join/machina-node (and /join/machina-node?arch=amd64); "" answers
	// 404 there (bundle installs only).
	NodeBinary string
	// NodeBinaryARM64 is the arm64 build of machina-node, served at
	// /join/machina-node?arch=arm64 (install.sh asks with its `uname -m`);
	// "" answers 404 for arm64 hosts, naming the flag.
	NodeBinaryARM64 string
	// NodeCertTTL is the node certificate lifetime; zero means 1 year.
	NodeCertTTL time.Duration
	// Heartbeat is the interval nodes are told to heartbeat at, in whole
	// seconds (rounded, at least 1s); zero means 30s. A host is online while its last heartbeat is younger
	// than 3 intervals.
	Heartbeat time.Duration
	// JoinRate bounds POST /hosts/join per second per source address
	// (token bucket, burst 4× but at least 1); zero means 5. Excess
	// requests answer 429. Each address has its own bucket, so callers
	// flooding from other addresses cannot keep a legitimate host out.
	JoinRate float64
	// HeartbeatRate bounds POST /hosts/{name}/heartbeat per host per
	// second (a token bucket per host, burst 5× but at least 5); zero
	// means 1. A node heartbeats once per Heartbeat interval (at least a
	// second), so only a broken or hostile node meets it. A heartbeat
	// over it answers 429 with Retry-After, is counted (HeartbeatsLimited;
	// a paced host.heartbeat_limited event) and records nothing but the
	// host's liveness, at most once per Heartbeat interval: a flooding
	// host is neither marked lost nor able to write per request.
	HeartbeatRate float64
	// LeasedIP, when set (Machina serves DHCP), returns the address leased
	// to a server's boot MAC: a join with a token naming that server from
	// another address is refused (before the token is used). nil, or no
	// live lease, checks nothing.
	LeasedIP func(server string) (netip.Addr, bool)
	// DeclaredIPs, when set, returns the static addresses the inventory
	// gives a server's deployed OS (networks.yaml layouts: servers.yaml
	// fixed addresses and the IPAM pool addresses it holds). The deployed
	// OS comes up on its declared network (cloud-init network-config v2)
	// before it joins, so its join may come from one of them instead of
	// the DHCP lease; any other address is refused as LeasedIP says.
	DeclaredIPs func(server string) []netip.Addr
	// Logger receives one Info line per join and Warn lines for refusals;
	// nil discards.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Server is the join listener: a TLS server (its certificate signed by the
// CA) serving GET /join/ca.pem, GET /join/install.sh, GET /join/machina-node
// and POST /hosts/join to anyone, and, to nodes presenting their node
// certificate (mutual TLS), POST /hosts/{name}/steps, /hosts/{name}/done
// and /hosts/{name}/heartbeat.
type Server struct {
	cfg   Config
	log   *slog.Logger
	mux   *http.ServeMux
	limit *perSource
	// beats limits heartbeats per host name (Config.HeartbeatRate).
	beats *perSource
	// beatsLimited counts heartbeats answered 429 (HeartbeatsLimited),
	// fencedBeats heartbeats from fenced hosts (FencedHeartbeats).
	beatsLimited, fencedBeats atomic.Int64
	// connsRefused counts connections Serve closed at accept (their
	// address had MaxConnsPerIP open): ConnsRefused.
	connsRefused atomic.Int64
}

// HeartbeatsLimited is the number of heartbeats answered 429 because
// their host was over Config.HeartbeatRate; the controller exports it as
// machina_join_heartbeats_limited_total.
func (s *Server) HeartbeatsLimited() int64 { return s.beatsLimited.Load() }

// FencedHeartbeats is the number of heartbeats received from fenced hosts
// (each one says the fence did not hold); the controller exports it as
// machina_join_fenced_heartbeats_total.
func (s *Server) FencedHeartbeats() int64 { return s.fencedBeats.Load() }

// ConnsRefused is the number of connections Serve's listener closed at
// accept because their source address already had MaxConnsPerIP (64)
// open, when Serve wrapped the listener itself; a caller that passes a
// connlimit listener (the controller, which exports
// machina_join_conns_refused_total from it) counts its own.
func (s *Server) ConnsRefused() int64 { return s.connsRefused.Load() }

// Join errors answered with these v1.Error codes.
const (
	CodeTokenUnknown = "token_unknown" // 401
	CodeTokenExpired = "token_expired" // 401
	CodeTokenUsed    = "token_used"    // 401
	CodeTokenHost    = "token_host"    // 403: the token is bound to another host name
	CodeChecksFailed = "checks_failed" // 403: a required host check failed
	CodeBadCSR       = "bad_csr"       // 400
	CodeRateLimited  = "rate_limited"  // 429
	CodeNotDeployed  = "not_deployed"  // 409: the token's deploy is not verified done
	CodeForbidden    = "forbidden"     // 403: missing or stale node certificate
)

// New validates cfg and builds the server.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil || cfg.CA == nil {
		return nil, errors.New("join: new: Store and CA are required")
	}
	u, err := CheckJoinURL(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("join: new: %w", err)
	}
	cfg.URL = u
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.NodeCertTTL <= 0 {
		cfg.NodeCertTTL = 365 * 24 * time.Hour
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 30 * time.Second
	}
	// Nodes are told whole seconds (JoinResponse.HeartbeatSeconds).
	cfg.Heartbeat = max(time.Second, cfg.Heartbeat.Round(time.Second))
	if cfg.JoinRate <= 0 {
		cfg.JoinRate = 5
	}
	if cfg.HeartbeatRate <= 0 {
		cfg.HeartbeatRate = 1
	}
	if len(cfg.Names) == 0 {
		host := strings.TrimPrefix(u, "https://")
		if i := strings.IndexByte(host, '/'); i >= 0 {
			host = host[:i]
		}
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		cfg.Names = []string{strings.Trim(host, "[]"), "localhost", "127.0.0.1"}
	}
	s := &Server{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux(),
		limit: &perSource{rate: cfg.JoinRate, burst: max(1, 4*cfg.JoinRate), m: map[string]*bucket{}},
		beats: &perSource{rate: cfg.HeartbeatRate, burst: max(5, 5*cfg.HeartbeatRate), m: map[string]*bucket{}}}
	handlers := []http.HandlerFunc{s.handleCA, s.handleScript, s.handleBinary, s.handleJoin,
		s.node(s.handleStep), s.node(s.handleDone), s.node(s.handleHeartbeat)}
	for i, p := range s.Routes() { // the same order
		s.mux.HandleFunc(p, handlers[i])
	}
	return s, nil
}

// URL returns the listener's public base URL.
func (s *Server) URL() string { return s.cfg.URL }

// Routes returns the join listener's route patterns, for tests and docs.
func (s *Server) Routes() []string {
	return []string{"GET /join/ca.pem", "GET /join/install.sh", "GET /join/machina-node", "POST /hosts/join",
		"POST /hosts/{name}/steps", "POST /hosts/{name}/done", "POST /hosts/{name}/heartbeat"}
}

// Handler returns the HTTP handler (for tests; Serve adds TLS).
func (s *Server) Handler() http.Handler { return s.mux }

// TLSConfig returns the listener's TLS configuration: a fresh serving
// certificate for Config.Names chained to the CA, TLS 1.2 or later, and
// client certificates verified against the CA when presented.
func (s *Server) TLSConfig() (*tls.Config, error) {
	pair, err := s.cfg.CA.ServerCertificate(s.cfg.Names)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{pair},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    s.cfg.CA.Pool(),
	}, nil
}

// Serve answers TLS on ln until ctx is done, then drains for up to 5s,
// closes ln and returns nil. A request has 10s for its headers and 30s in
// all (ReadTimeout: every join route is a short exchange), and an idle
// keep-alive connection is closed after 30s. ln is wrapped with connlimit
// (MaxConnsPerIP, 64, per source address) unless it is a connlimit
// listener already (it has a Limits method); either way it must be plain
// TCP: Serve adds TLS.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	tc, err := s.TLSConfig()
	if err != nil {
		return fmt.Errorf("join: serve: %w", err)
	}
	hs := &http.Server{
		Handler:           s.mux,
		TLSConfig:         tc,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       30 * time.Second, // each idle TLS connection holds buffers and cipher state; node agents close theirs first (20 s) and resend a heartbeat whose kept connection was closed
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	// One address holds at most MaxConnsPerIP connections (TLS
	// handshakes included): further ones are closed at accept. A
	// listener the caller already wrapped with connlimit (the
	// controller's, with its descriptor budget) is used as it is.
	if _, limited := ln.(interface{ Limits() *connlimit.Listener }); !limited {
		ln = connlimit.PerIP(ln, MaxConnsPerIP, &s.connsRefused)
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.ServeTLS(ln, "", "") }()
	select {
	case err := <-errc:
		return fmt.Errorf("join: serve %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		hs.Close()
	}
	<-errc
	return nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, code int, c, format string, args ...any) {
	writeJSON(w, code, v1.Error{Code: c, Message: fmt.Sprintf(format, args...)})
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		fail(w, http.StatusBadRequest, v1.CodeBadRequest, "decode request body: %v", err)
		return false
	}
	return true
}

func (s *Server) handleCA(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/x-pem-file")
	_, _ = w.Write(s.cfg.CA.PEM())
}

func (s *Server) handleScript(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/x-shellscript")
	_, _ = w.Write(installScript)
}

func (s *Server) handleBinary(w http.ResponseWriter, r *http.Request) {
	// arch is a GOARCH name; no arch is amd64, what install scripts from
	// before the parameter ran on.
	path := s.cfg.NodeBinary
	switch arch := r.URL.Query().Get("arch"); arch {
	case "", "amd64":
	case "arm64":
		if s.cfg.NodeBinaryARM64 == "" {
			fail(w, http.StatusNotFound, v1.CodeNotFound, "this controller serves no arm64 machina-node binary (machina serve --node-binary-arm64); install from a bundle")
			return
		}
		path = s.cfg.NodeBinaryARM64
	default:
		fail(w, http.StatusBadRequest, v1.CodeBadRequest, "query parameter arch: want amd64 or arm64")
		return
	}
	if path == "" {
		fail(w, http.StatusNotFound, v1.CodeNotFound, "this controller serves no machina-node binary; install from a bundle")
		return
	}
	f, err := os.Open(path)
	if err != nil {
		s.log.Error("open machina-node binary", "err", err)
		fail(w, http.StatusInternalServerError, v1.CodeInternal, "machina-node binary unavailable")
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		fail(w, http.StatusInternalServerError, v1.CodeInternal, "machina-node binary unavailable")
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "machina-node", fi.ModTime(), f)
}

// payload is what an enrolment token carries (state.EnrolmentToken.Payload).
type payload struct {
	Site           string           `json:"site,omitempty"`
	Rack           string           `json:"rack,omitempty"`
	Tags           []string         `json:"tags,omitempty"`
	Networks       []v1.JoinNetwork `json:"networks,omitempty"`
	Pools          []v1.JoinPool    `json:"pools,omitempty"`
	Require        []string         `json:"require,omitempty"`
	MinMemoryBytes int64            `json:"minMemoryBytes,omitempty"`
	Host           string           `json:"host,omitempty"`
	Server         string           `json:"server,omitempty"`
	Deploy         string           `json:"deploy,omitempty"`
}

func (s *Server) handleJoin(w http.ResponseWriter, r *http.Request) {
	if !s.limit.allow(sourceIP(r), s.cfg.Now()) {
		fail(w, http.StatusTooManyRequests, CodeRateLimited, "too many join requests from this address; retry shortly")
		return
	}
	var req v1.JoinRequest
	if !decode(w, r, &req) {
		return
	}
	host := req.Facts.Hostname
	if err := spec.Hostname(host); err != nil {
		fail(w, http.StatusBadRequest, v1.CodeBadRequest, "join: %v", err)
		return
	}
	log := s.log.With("host", host, "remote", r.RemoteAddr)
	csr, err := ParseCSR(req.CSR)
	if err != nil {
		log.Debug("join refused", "err", err) // the answer names it; no log line per request
		fail(w, http.StatusBadRequest, CodeBadCSR, "join: %v", err)
		return
	}
	if why, server, reason := s.deployNotVerified(req.Token, r); why != "" {
		// Checked before the token is used: the host's own join, after
		// its done is recorded, still works. Counted, with a paced event
		// (one at once, then one summary per interval), and logged at
		// Debug: a flood of refused joins writes and logs nothing per
		// request.
		s.cfg.Store.RecordRefusal(server, state.EventTokenRefused, reason, "join refused: "+why)
		log.Debug("join refused", "why", why)
		fail(w, http.StatusConflict, CodeNotDeployed, "join: %s", why)
		return
	}
	tok, err := s.cfg.Store.ConsumeEnrolmentToken(req.Token, host)
	if err != nil {
		tokenRefused(w, log, err)
		return
	}
	var p payload
	if len(tok.Payload) > 0 {
		if err := json.Unmarshal(tok.Payload, &p); err != nil {
			log.Error("decode token payload", "token", tok.ID, "err", err)
			fail(w, http.StatusInternalServerError, v1.CodeInternal, "join: internal error")
			return
		}
	}
	if p.Host != "" && p.Host != host {
		log.Warn("join refused: token bound to another host", "token", tok.ID, "want", p.Host)
		fail(w, http.StatusForbidden, CodeTokenHost, "join: enrolment token is for host %s, not %s", p.Host, host)
		return
	}
	s.joinLog(host, "info", "join", fmt.Sprintf("join started with enrolment token %s from %s", tok.ID, r.RemoteAddr))
	checks := Checks(req.Facts, p.Require, p.MinMemoryBytes)
	failed := s.logChecks(host, checks)
	now := s.cfg.Now().UTC()
	rec := state.Host{Name: host, Server: p.Server, Site: p.Site, Rack: p.Rack, Tags: p.Tags, JoinedAt: now}
	old, oldErr := s.cfg.Store.Host(host)
	if oldErr == nil {
		rec.LastSeen = old.LastSeen
		if rec.Server == "" {
			rec.Server = old.Server
		}
	}
	if len(failed) > 0 {
		if oldErr == nil {
			// A failed re-join keeps the certificate of the last good join
			// (the node keeps heartbeating) and what it applied.
			rec.CertFingerprint, rec.Networks, rec.StoragePools = old.CertFingerprint, old.Networks, old.StoragePools
		}
		s.checksFailed(w, log, rec, failed)
		return
	}
	s.issue(w, log, csr, rec, p, checks)
}

// issue signs the node certificate of a join that passed its checks,
// records the host (joining while networks or pools remain to apply,
// joined otherwise) and answers with the certificate, the CA and what to
// apply.
func (s *Server) issue(w http.ResponseWriter, log *slog.Logger, csr *x509.CertificateRequest, rec state.Host, p payload, checks []v1.JoinCheck) {
	host := rec.Name
	der, err := s.cfg.CA.SignNode(csr, host, s.cfg.NodeCertTTL)
	if err != nil {
		log.Error("sign node certificate", "err", err)
		fail(w, http.StatusInternalServerError, v1.CodeInternal, "join: internal error")
		return
	}
	rec.CertFingerprint = CertFingerprint(der)
	rec.JoinStatus = "joined"
	if len(p.Networks)+len(p.Pools) > 0 {
		rec.JoinStatus = "joining"
	}
	if _, err := s.cfg.Store.PutHost(rec); err != nil {
		log.Error("record host", "err", err)
		fail(w, http.StatusInternalServerError, v1.CodeInternal, "join: internal error")
		return
	}
	s.joinLog(host, "info", "certificate", "node certificate issued, SHA-256 "+rec.CertFingerprint)
	if rec.JoinStatus == "joined" {
		s.joinLog(host, "info", "join", "joined")
	}
	log.Info("host joined", "site", p.Site, "rack", p.Rack, "networks", len(p.Networks), "pools", len(p.Pools))
	writeJSON(w, http.StatusOK, v1.JoinResponse{
		Host:             host,
		Certificate:      string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		CA:               string(s.cfg.CA.PEM()),
		Checks:           checks,
		Networks:         p.Networks,
		Pools:            p.Pools,
		HeartbeatSeconds: int(s.cfg.Heartbeat.Round(time.Second) / time.Second),
	})
}

// tokenRefused answers a join whose enrolment token was refused (used,
// expired, unknown: 401) or could not be read (500).
func tokenRefused(w http.ResponseWriter, log *slog.Logger, err error) {
	// The store counted the refusal and paces its event: Debug, not a line
	// per refused request.
	log.Debug("join refused", "err", err)
	switch {
	case errors.Is(err, state.ErrTokenUsed):
		fail(w, http.StatusUnauthorized, CodeTokenUsed, "join: enrolment token already used; create a new one")
	case errors.Is(err, state.ErrTokenExpired):
		fail(w, http.StatusUnauthorized, CodeTokenExpired, "join: enrolment token expired; create a new one")
	case errors.Is(err, state.ErrTokenUnknown):
		fail(w, http.StatusUnauthorized, CodeTokenUnknown, "join: unknown enrolment token")
	default:
		log.Error("consume enrolment token", "err", err)
		fail(w, http.StatusInternalServerError, v1.CodeInternal, "join: internal error")
	}
}

// logChecks writes each check's outcome to the host's join log and
// returns the required checks that failed.
func (s *Server) logChecks(host string, checks []v1.JoinCheck) []string {
	var failed []string
	for _, c := range checks {
		level, word := "info", "passed"
		if !c.OK {
			word = "failed"
			if c.Required {
				level = "error"
				failed = append(failed, c.Name)
			} else {
				level = "warn"
				word = "failed (not required)"
			}
		}
		s.joinLog(host, level, "check "+c.Name, fmt.Sprintf("check %s %s: %s", c.Name, word, c.Detail))
	}
	return failed
}

// checksFailed records a join whose required checks failed (rec, status
// failed with the reason) and answers 403.
func (s *Server) checksFailed(w http.ResponseWriter, log *slog.Logger, rec state.Host, failed []string) {
	reason := "required checks failed: " + strings.Join(failed, ", ")
	rec.JoinStatus, rec.JoinReason = "failed", reason
	if _, err := s.cfg.Store.PutHost(rec); err != nil {
		log.Error("record failed join", "err", err)
	}
	s.joinLog(rec.Name, "error", "join", "join failed: "+reason)
	log.Warn("join refused", "reason", reason)
	writeJSON(w, http.StatusForbidden, v1.Error{Code: CodeChecksFailed, Message: "join: " + reason})
}

// Checks evaluates a host's facts: hostname (always required), virt (vmx
// or svm among CPUFlags), kvm (/dev/kvm present) and memory (at least
// minMemory bytes; zero means 1 GiB). A check is Required when named in
// require.
func Checks(f v1.HostFacts, require []string, minMemory int64) []v1.JoinCheck {
	if minMemory <= 0 {
		minMemory = 1 << 30
	}
	req := func(n string) bool { return slices.Contains(require, n) }
	out := []v1.JoinCheck{{Name: v1.CheckHostname, OK: spec.Hostname(f.Hostname) == nil, Required: true, Detail: fmt.Sprintf("hostname %q", f.Hostname)}}
	virt := slices.Contains(f.CPUFlags, "vmx") || slices.Contains(f.CPUFlags, "svm")
	vd := "no vmx or svm CPU flag"
	if virt {
		vd = "CPU virtualisation flag present"
	}
	out = append(out, v1.JoinCheck{Name: v1.CheckVirt, OK: virt, Required: req(v1.CheckVirt), Detail: vd})
	kd := "/dev/kvm missing"
	if f.KVM {
		kd = "/dev/kvm present"
	}
	out = append(out, v1.JoinCheck{Name: v1.CheckKVM, OK: f.KVM, Required: req(v1.CheckKVM), Detail: kd})
	out = append(out, v1.JoinCheck{Name: v1.CheckMemory, OK: f.MemoryBytes >= minMemory, Required: req(v1.CheckMemory),
		Detail: fmt.Sprintf("%d MiB, want at least %d MiB", f.MemoryBytes>>20, minMemory>>20)})
	return out
}

func (s *Server) joinLog(host, level, step, msg string) {
	if _, err := s.cfg.Store.AppendJoinLog(host, state.JoinLogEntry{Level: level, Step: step, Message: msg}); err != nil {
		s.log.Error("append join log", "host", host, "err", err)
	}
}

// node wraps handlers of node endpoints: the client must present a node
// certificate verified against the CA whose CommonName is {name} and whose
// SHA-256 is the one recorded at the host's last join (so a re-join
// retires the old certificate).
func (s *Server) node(h func(http.ResponseWriter, *http.Request, state.Host)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r = r.WithContext(context.WithValue(r.Context(), receivedKey{}, s.cfg.Now().UTC()))
		name := r.PathValue("name")
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			fail(w, http.StatusForbidden, CodeForbidden, "a node certificate is required")
			return
		}
		leaf := r.TLS.VerifiedChains[0][0]
		if leaf.Subject.CommonName != name {
			fail(w, http.StatusForbidden, CodeForbidden, "certificate is for %s, not %s", leaf.Subject.CommonName, name)
			return
		}
		hr, err := s.cfg.Store.Host(name)
		if err != nil || hr.CertFingerprint != CertFingerprint(leaf.Raw) {
			fail(w, http.StatusForbidden, CodeForbidden, "certificate is not the current one for %s; join again", name)
			return
		}
		h(w, r, hr)
	}
}

func (s *Server) handleStep(w http.ResponseWriter, r *http.Request, h state.Host) {
	var st v1.JoinStep
	if !decode(w, r, &st) {
		return
	}
	if len(st.Step) > 200 || len(st.Message) > 4000 {
		fail(w, http.StatusBadRequest, v1.CodeBadRequest, "step or message too long")
		return
	}
	level := "info"
	if !st.OK {
		level = "error"
	}
	s.joinLog(h.Name, level, st.Step, st.Message)
	if st.OK {
		kind, name, _ := strings.Cut(st.Step, " ")
		if kind == "network" || kind == "pool" {
			_, err := s.cfg.Store.UpdateHost(h.Name, func(x *state.Host) error {
				list := &x.Networks
				if kind == "pool" {
					list = &x.StoragePools
				}
				if !slices.Contains(*list, name) {
					*list = append(*list, name)
				}
				return nil
			})
			if err != nil {
				s.log.Error("record applied step", "host", h.Name, "err", err)
			}
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleDone(w http.ResponseWriter, r *http.Request, h state.Host) {
	var d v1.JoinDone
	if !decode(w, r, &d) {
		return
	}
	if len(d.Reason) > 4000 {
		d.Reason = d.Reason[:4000]
	}
	now := s.cfg.Now().UTC()
	_, err := s.cfg.Store.UpdateHost(h.Name, func(x *state.Host) error {
		x.LastSeen = now
		if d.OK {
			x.JoinStatus, x.JoinReason = "joined", ""
		} else {
			x.JoinStatus, x.JoinReason = "failed", d.Reason
		}
		return nil
	})
	if err != nil {
		s.log.Error("record join outcome", "host", h.Name, "err", err)
		fail(w, http.StatusInternalServerError, v1.CodeInternal, "internal error")
		return
	}
	if d.OK {
		s.joinLog(h.Name, "info", "join", "joined: networks and storage pools applied")
	} else {
		s.joinLog(h.Name, "error", "join", "join failed: "+d.Reason)
	}
	w.WriteHeader(http.StatusNoContent)
}

// receivedKey is the request context key of when a node request was
// received (node stamps it before reading the host's record): a
// heartbeat's time is its arrival, whatever the wait for its write.
type receivedKey struct{}

// received returns when r was received (node's stamp), or now.
func (s *Server) received(r *http.Request) time.Time {
	if at, ok := r.Context().Value(receivedKey{}).(time.Time); ok {
		return at
	}
	return s.cfg.Now().UTC()
}

func (s *Server) handleHeartbeat(w http.ResponseWriter, r *http.Request, h state.Host) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 4096))
	if err != nil {
		fail(w, http.StatusBadRequest, v1.CodeBadRequest, "read heartbeat: %v", err)
		return
	}
	var hb v1.Heartbeat
	if t := bytes.TrimSpace(body); len(t) > 0 && !bytes.Equal(t, []byte("{}")) {
		dec := json.NewDecoder(bytes.NewReader(t))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&hb); err != nil {
			fail(w, http.StatusBadRequest, v1.CodeBadRequest, "decode heartbeat: %v", err)
			return
		}
	}
	if hb.UptimeSeconds < 0 || hb.AgentUptimeSeconds < 0 || len(hb.AgentVersion) > 100 || !printable(hb.AgentVersion) {
		fail(w, http.StatusBadRequest, v1.CodeBadRequest, "heartbeat: negative uptime, or agent version not up to 100 printable characters")
		return
	}
	now := s.received(r)
	beat := state.Heartbeat{
		Uptime:       time.Duration(hb.UptimeSeconds * float64(time.Second)),
		AgentUptime:  time.Duration(hb.AgentUptimeSeconds * float64(time.Second)),
		AgentStarted: hb.AgentStartedAt,
		AgentVersion: hb.AgentVersion}
	ok, wait := s.beats.take(h.Name, now)
	if !ok {
		s.beatsLimited.Add(1)
		if s.cfg.Store.RecordRefusal(h.Server, state.EventHostHeartbeatLimited, state.RefusalRateLimited,
			fmt.Sprintf("host %s heartbeats faster than %g per second: answered 429", h.Name, s.cfg.HeartbeatRate)) {
			s.log.Warn("heartbeats over the per-host rate: answered 429", "host", h.Name, "rate", s.cfg.HeartbeatRate)
		}
		// Liveness only, at most once per interval: the host is alive
		// (not lost), and nothing else it says is recorded.
		if now.Sub(h.LastSeen) >= s.cfg.Heartbeat {
			beat = state.Heartbeat{}
			if res, err := s.cfg.Store.RecordHeartbeat(h.Name, now, beat); err != nil {
				s.log.Error("heartbeat liveness", "host", h.Name, "err", err)
			} else {
				s.logHeartbeat(h, hb, res)
			}
		}
		w.Header().Set("Retry-After", strconv.Itoa(int(max(1, math.Ceil(wait.Seconds())))))
		fail(w, http.StatusTooManyRequests, CodeRateLimited, "heartbeats faster than %g per second", s.cfg.HeartbeatRate)
		return
	}
	res, err := s.cfg.Store.RecordHeartbeat(h.Name, now, beat)
	if err != nil {
		s.log.Error("heartbeat", "host", h.Name, "err", err)
		fail(w, http.StatusInternalServerError, v1.CodeInternal, "internal error")
		return
	}
	s.logHeartbeat(h, hb, res)
	w.WriteHeader(http.StatusNoContent)
}

// logHeartbeat logs what a recorded heartbeat changed: a fence that did
// not hold at Error (once per fence), a return, a reboot or an agent
// restart at Info (a paced, summarised one not at all).
func (s *Server) logHeartbeat(h state.Host, hb v1.Heartbeat, res state.HeartbeatResult) {
	if res.FencedBeat {
		s.fencedBeats.Add(1)
		if res.FenceNotHeldFirst {
			if cur, err := s.cfg.Store.Host(h.Name); err == nil {
				h = cur
			}
			s.log.Error("fenced host heartbeats: the fence did not hold", "host", h.Name, "server", h.Server, "why", FenceNotHeldMessage(h))
		}
		return
	}
	switch {
	case res.Summarised:
	case res.Returned:
		s.log.Info("lost host heartbeats again", "host", h.Name, "silent", res.LostFor.Round(time.Second), "rebooted", res.Rebooted, "agent_restarted", res.AgentRestarted)
	case res.Rebooted:
		s.log.Info("host rebooted", "host", h.Name)
	case res.AgentRestarted:
		s.log.Info("node agent restarted", "host", h.Name, "version", hb.AgentVersion, "was", res.OldVersion)
	}
}

func printable(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// Online reports whether h heartbeated within 3 intervals before now.
func Online(h state.Host, now time.Time, interval time.Duration) bool {
	if interval <= 0 {
		interval = 30 * time.Second
	}
	return !h.LastSeen.IsZero() && now.Sub(h.LastSeen) < 3*interval
}

// deployNotVerified says why a token bound to an image deploy may not be
// used yet: its server is not deployed, or its deploy is not the token's
// or was not verified (done's digest, size and read-back matched the
// plan), or the request is not from the address leased to the server;
// with the server to record it under (registered, or "") and the refusal
// reason. "" when the token is bound to no deploy or the deploy is done.
func (s *Server) deployNotVerified(value string, r *http.Request) (why, server string, reason state.RefusalReason) {
	tok, err := s.cfg.Store.PeekEnrolmentToken(value)
	if err != nil || len(tok.Payload) == 0 {
		return "", "", "" // refused (or not) by the consume that follows
	}
	var p payload
	if json.Unmarshal(tok.Payload, &p) != nil || p.Server == "" {
		return "", "", ""
	}
	if s.cfg.LeasedIP != nil {
		if leased, ok := s.cfg.LeasedIP(p.Server); ok {
			if from, err := netip.ParseAddr(sourceIP(r)); err != nil || (from.Unmap() != leased.Unmap() && !s.declared(p.Server, from)) {
				return fmt.Sprintf("request from %s, but %s is leased to server %s", sourceIP(r), leased, p.Server), p.Server, state.RefusalWrongAddress
			}
		}
	}
	if p.Deploy == "" {
		return "", "", ""
	}
	srv, err := s.cfg.Store.Server(p.Server)
	switch {
	case err != nil:
		return fmt.Sprintf("server %s of this enrolment token is unknown", p.Server), "", state.RefusalTokenMismatch
	case srv.Lifecycle != state.LifecycleDeployed:
		why = fmt.Sprintf("server %s is %s: a host joins once its deploy is verified done", p.Server, srv.Lifecycle)
	case srv.Deploy == nil || srv.Deploy.ID != p.Deploy:
		why = fmt.Sprintf("this enrolment token is for another deploy of server %s", p.Server)
	case !srv.Deploy.Verified:
		why = fmt.Sprintf("the deploy of server %s was not verified", p.Server)
	default:
		return "", "", ""
	}
	return why, p.Server, state.RefusalTokenMismatch
}

// declared reports whether from is one of server's static addresses
// (Config.DeclaredIPs).
func (s *Server) declared(server string, from netip.Addr) bool {
	if s.cfg.DeclaredIPs == nil {
		return false
	}
	for _, a := range s.cfg.DeclaredIPs(server) {
		if a.Unmap() == from.Unmap() {
			return true
		}
	}
	return false
}

// sourceIP is the request's source address without its port.
func sourceIP(r *http.Request) string {
	if h, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return h
	}
	return r.RemoteAddr
}

// perSource holds one bucket per source address, at most maxSources: when
// full, buckets that have refilled (their sources idle) are dropped, and
// if none has, all are (a flood from that many addresses costs its
// senders their own limits, never a quiet source's).
type perSource struct {
	mu          sync.Mutex
	rate, burst float64
	m           map[string]*bucket
}

const maxSources = 4096

func (p *perSource) allow(src string, now time.Time) bool {
	ok, _ := p.take(src, now)
	return ok
}

// take is allow with the wait until src's next token when refused.
func (p *perSource) take(src string, now time.Time) (bool, time.Duration) {
	p.mu.Lock()
	b, ok := p.m[src]
	if !ok {
		if len(p.m) >= maxSources {
			for k, o := range p.m {
				o.mu.Lock()
				full := o.tokens+now.Sub(o.last).Seconds()*o.rate >= o.burst
				o.mu.Unlock()
				if full {
					delete(p.m, k)
				}
			}
			if len(p.m) >= maxSources {
				clear(p.m)
			}
		}
		b = &bucket{rate: p.rate, burst: p.burst, tokens: p.burst, last: now}
		p.m[src] = b
	}
	p.mu.Unlock()
	return b.take(now)
}

// bucket is a token-bucket rate limiter.
type bucket struct {
	mu                  sync.Mutex
	rate, burst, tokens float64
	last                time.Time
}

// take spends a token if there is one; otherwise it reports how long
// until there is.
func (b *bucket) take(now time.Time) (bool, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens = min(b.burst, b.tokens+max(0, now.Sub(b.last).Seconds())*b.rate)
	b.last = now
	if b.tokens < 1 {
		return false, time.Duration((1 - b.tokens) / b.rate * float64(time.Second))
	}
	b.tokens--
	return true, 0
}
