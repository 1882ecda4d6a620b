package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/machina-metal/machina/internal/httpstatus"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/internal/connlimit"
	"github.com/machina-metal/machina/state"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Config configures New. Every zero value except Store is usable.
type Config struct {
	// Store is the open state store; required.
	Store *state.Store
	// Logger receives one Debug line per request and Error lines for
	// failures answered 500; nil discards.
	Logger *slog.Logger
	// Registry receives the API's metrics and is served at /metrics; nil
	// means a new registry with the Go and process collectors.
	Registry *prometheus.Registry
	// Heartbeat is the interval of SSE keep-alive comments; zero means 15s.
	Heartbeat time.Duration
	// ShutdownTimeout bounds the graceful drain in Serve; zero means 5s.
	ShutdownTimeout time.Duration
	// MaxConnsPerIP caps the open connections of one source address on
	// Serve's listener; zero means DefaultMaxConnsPerIP. Further ones are
	// closed at once and counted (machina_api_conns_refused_total).
	MaxConnsPerIP int
	// BodyTimeout bounds the reading of a request body, whatever the
	// method (a GET or DELETE may carry one too), from the end of its
	// headers; zero means 30s. Headers have 10s (ReadHeaderTimeout), and a
	// keep-alive connection waits at most 30s for its next request
	// (IdleTimeout).
	BodyTimeout time.Duration
	// Git, if set, reports the Git side's health for GET /api/v1/status
	// and the machina_git_* metrics (read at each request and scrape);
	// nil when the controller runs without a repository.
	Git func() v1.GitHealth
}

// Server is the admin API. Create with New; serve Handler or call Serve.
type Server struct {
	cfg   Config
	log   *slog.Logger
	store *state.Store
	mux   *http.ServeMux
	// mounted lists the patterns mounted after New (Routes).
	mountedMu sync.Mutex
	mounted   []string
	// adminMounted lists the patterns mounted with HandleAdmin.
	adminMounted []string
	handler      http.Handler
	// pub holds the routes that need no admin token and are not operator
	// pages: what a machine-facing (plain HTTP, off-loopback) listener
	// serves. See MachineHandler.
	pub      *http.ServeMux
	machine  http.Handler
	adminURL string
	metrics  *metrics
	encoded  encodedServers
	// connsRefused counts connections the listeners closed at accept
	// (their address had MaxConnsPerIP open).
	connsRefused atomic.Int64
}

// maxBody bounds request bodies (64 KiB); larger bodies answer 413.
const maxBody = 64 << 10

// New builds the server and registers its metrics on cfg.Registry.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("api: new: Config.Store is nil")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
		cfg.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 15 * time.Second
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 5 * time.Second
	}
	s := &Server{cfg: cfg, log: cfg.Logger, store: cfg.Store, mux: http.NewServeMux(), pub: http.NewServeMux()}
	m, err := newMetrics(cfg.Registry, cfg.Store, func() float64 { return float64(s.connsRefused.Load()) }, cfg.Git)
	if err != nil {
		return nil, fmt.Errorf("api: new: %w", err)
	}
	s.metrics = m
	for _, r := range s.routes() {
		h := r.h
		if r.auth {
			role, _ := RouteRole(r.pattern)
			h = s.authenticate(h, role)
		}
		ih := s.instrument(r.pattern, h, r.auth)
		s.mux.Handle(r.pattern, ih)
		if !r.auth {
			s.pub.Handle(r.pattern, ih)
		}
	}
	s.handler = http.HandlerFunc(s.serveHTTP)
	s.machine = http.HandlerFunc(s.serveMachine)
	return s, nil
}

type route struct {
	pattern string
	auth    bool
	h       http.HandlerFunc
}

// routes is the full route table (Go 1.22 ServeMux patterns).
func (s *Server) routes() []route {
	return []route{
		{"GET /healthz", false, s.handleHealth},
		{"GET /metrics", false, promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{}).ServeHTTP},
		{"GET /api/v1/status", true, s.handleStatus},
		{"GET /api/v1/servers", true, s.handleListServers},
		{"GET /api/v1/servers/{name}", true, s.handleGetServer},
		{"GET /api/v1/servers/{name}/events", true, s.handleServerEvents},
		{"POST /api/v1/servers/{name}/transitions", true, s.handleTransition},
		{"GET /api/v1/events", true, s.handleEvents},
		{"GET /api/v1/events/stream", true, s.handleStream},
		{"GET /api/v1/secrets", true, s.handleListSecrets},
		{"PUT /api/v1/secrets/{name}", true, s.handlePutSecret},
		{"DELETE /api/v1/secrets/{name}", true, s.handleDeleteSecret},
		{"GET /api/v1/approvals", true, s.handleListApprovals},
		{"GET /api/v1/admin-tokens", true, s.handleListAdminTokens},
		{"POST /api/v1/admin-tokens", true, s.handleCreateAdminToken},
		{"DELETE /api/v1/admin-tokens/{name}", true, s.handleRevokeAdminToken},
		{"GET /api/v1/state/snapshot", true, s.handleSnapshot},
		{"GET /api/v1/openapi.json", true, handleOpenAPI},
	}
}

// Routes returns the route patterns the server handles, for tests and
// docs: its own table, then every pattern mounted with HandleAdmin or
// HandlePublic, in mount order. A mounted prefix ("/ui/") stands for a
// handler with routes of its own (ui.UI.Routes).
func (s *Server) Routes() []string {
	var out []string
	for _, r := range s.routes() {
		out = append(out, r.pattern)
	}
	s.mountedMu.Lock()
	out = append(out, s.mounted...)
	s.mountedMu.Unlock()
	return out
}

// Wrap puts mw around the handlers Serve and ServeMachine answer with
// (the controller's HA gate: a standby forwards writes to the leader).
// Call it before serving; not safe concurrently with requests.
func (s *Server) Wrap(mw func(http.Handler) http.Handler) {
	s.handler, s.machine = mw(s.handler), mw(s.machine)
}

// Handler returns the HTTP handler. Unknown paths answer 404 and known
// paths with another method 405, both as JSON errors.
func (s *Server) Handler() http.Handler { return s.handler }

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if _, pattern := s.mux.Handler(r); pattern != "" {
		s.mux.ServeHTTP(w, r)
		return
	}
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, p := s.mux.Handler(probe); p != "" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		writeError(w, http.StatusMethodNotAllowed, v1.Error{Message: "method " + r.Method + " not allowed", Code: v1.CodeMethodNotAllowed})
		return
	}
	writeError(w, http.StatusNotFound, v1.Error{Message: "no such endpoint", Code: v1.CodeNotFound})
}

// MachineHandler returns the handler for a listener that machines reach
// over plain HTTP off loopback (iPXE, the ramdisk agent, image downloads):
// it serves the routes mounted with HandlePublic and the built-in
// unauthenticated ones (/healthz, /metrics), and answers every admin route
// (HandleAdmin and the built-in admin API) and operator page
// (HandleOperator: UI, console) 403 with code "tls_required" naming the
// TLS admin URL set by SetAdminURL, without reading any credential: the
// admin token and secrets travel only over TLS off loopback.
func (s *Server) MachineHandler() http.Handler { return s.machine }

// SetAdminURL sets the admin API's TLS URL that MachineHandler's 403
// answers name (e.g. https://10.0.0.5:8444). Call before serving.
func (s *Server) SetAdminURL(u string) { s.adminURL = u }

func (s *Server) serveMachine(w http.ResponseWriter, r *http.Request) {
	if _, pattern := s.pub.Handler(r); pattern != "" {
		s.pub.ServeHTTP(w, r)
		return
	}
	if _, pattern := s.mux.Handler(r); pattern != "" {
		msg := "the admin API and UI are served over TLS only on this address"
		if s.adminURL != "" {
			msg += ": use " + s.adminURL
		}
		writeError(w, http.StatusForbidden, v1.Error{Message: msg, Code: v1.CodeTLSRequired})
		return
	}
	s.serveHTTP(w, r)
}

// Serve answers on ln until ctx is done, then drains for at most
// Config.ShutdownTimeout, closes ln and returns nil. Request contexts
// (including SSE streams) are cancelled when ctx is done.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	return s.serve(ctx, ln, s.handler)
}

// ServeMachine is Serve with MachineHandler: for the plain HTTP listener
// off loopback when the admin API has its TLS listener.
func (s *Server) ServeMachine(ctx context.Context, ln net.Listener) error {
	return s.serve(ctx, ln, s.machine)
}

// serve answers h on ln: headers within 10s, bodies (any method) within
// BodyTimeout, idle keep-alive connections closed after 30s. ln is wrapped
// with connlimit (MaxConnsPerIP per source address, further ones closed at
// accept and counted) unless it already is a connlimit listener (it has a
// Limits method: the controller passes listeners with their descriptor
// budgets, see connlimit.Budget).
func (s *Server) serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	maxConns, bodyTimeout := s.cfg.MaxConnsPerIP, s.cfg.BodyTimeout
	if maxConns <= 0 {
		maxConns = DefaultMaxConnsPerIP
	}
	if bodyTimeout <= 0 {
		bodyTimeout = 30 * time.Second
	}
	if _, limited := ln.(interface{ Limits() *connlimit.Listener }); !limited {
		ln = connlimit.PerIP(ln, maxConns, &s.connsRefused)
	}
	hs := &http.Server{
		Handler:           withBodyDeadline(h, bodyTimeout),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       30 * time.Second, // thousands of machines each leave a keep-alive connection (8 KiB of buffers) behind; no WriteTimeout: SSE streams are long-lived
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("api: serve %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		hs.Close()
	}
	<-errc
	return nil
}

// withBodyDeadline gives every request that has a body, whatever its
// method, a read deadline of d from the end of its headers, covering the
// handler's reads and net/http's discard of an unread body after the
// handler returns (so a slow body on a GET or DELETE no longer holds a
// connection and its descriptor indefinitely: the deadline used to be set
// for POST, PUT and PATCH only). A request without a body (Content-Length
// 0, no Transfer-Encoding) gets none: there is nothing left to read, and a
// deadline would cancel the request context of the event streams'
// long-lived GETs when net/http's background read hit it. Not ReadTimeout,
// for the same reason.
func withBodyDeadline(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(d))
		}
		h.ServeHTTP(w, r)
	})
}

// HandleAdmin mounts h at pattern (a Go 1.22 ServeMux pattern such as
// "POST /api/v1/reconcile") behind admin-token authentication, with the
// same metrics, logging and JSON 401s as the built-in routes, and the
// role check of RouteRole(pattern) (403 naming the role needed); Actor(r)
// gives h the token's name for audit events. Call before serving. Errors:
// a pattern that conflicts with a registered one.
func (s *Server) HandleAdmin(pattern string, h http.Handler) error {
	role, _ := RouteRole(pattern)
	s.mountedMu.Lock()
	s.adminMounted = append(s.adminMounted, pattern)
	s.mountedMu.Unlock()
	return s.mountOn(pattern, s.authenticate(h.ServeHTTP, role), false, true)
}

// AdminRoutes returns the patterns that need an admin token: the built-in
// ones, then those mounted with HandleAdmin in mount order.
func (s *Server) AdminRoutes() []string {
	var out []string
	for _, r := range s.routes() {
		if r.auth {
			out = append(out, r.pattern)
		}
	}
	s.mountedMu.Lock()
	out = append(out, s.adminMounted...)
	s.mountedMu.Unlock()
	return out
}

// HandlePublic mounts h at pattern without authentication, for
// machine-facing endpoints (boot, report, plan, image) that gate
// themselves with single-use state tokens. Call before serving.
func (s *Server) HandlePublic(pattern string, h http.Handler) error {
	return s.mountOn(pattern, h, true, false)
}

// HandleOperator mounts h at pattern without admin-token authentication
// (h authenticates its users itself, as the UI's session and the console's
// bearer check do) but, like the admin routes, only on the operator's
// listener: MachineHandler refuses it. Call before serving.
func (s *Server) HandleOperator(pattern string, h http.Handler) error {
	return s.mountOn(pattern, h, false, false)
}

// mountOn mounts h at pattern on the operator's mux (and, public, on the
// machine-facing one); auth: h authenticates with the admin token
// (instrument then keeps the actor's slot for the log line).
func (s *Server) mountOn(pattern string, h http.Handler, public, auth bool) (err error) {
	defer func() {
		if r := recover(); r != nil { // ServeMux panics on conflicting patterns
			err = fmt.Errorf("api: mount %s: %v", pattern, r)
		}
	}()
	ih := s.instrument(pattern, h, auth)
	s.mux.Handle(pattern, ih)
	if public {
		s.pub.Handle(pattern, ih)
	}
	s.mountedMu.Lock()
	s.mounted = append(s.mounted, pattern)
	s.mountedMu.Unlock()
	return nil
}

// Actor returns the name of the admin token that authenticated r, or ""
// for unauthenticated routes. Use it as the Actor of audit events.
func Actor(r *http.Request) string { return actor(r) }

type ctxKey struct{}

// tokenKey holds the presented bearer token in the request context, so
// long-lived handlers (SSE) can notice a revocation. Never logged.
type tokenKey struct{}

// stillAuthorized reports whether r's bearer token is still valid.
func (s *Server) stillAuthorized(r *http.Request) bool {
	tok, _ := r.Context().Value(tokenKey{}).(string)
	_, err := s.store.AuthenticateAdmin(tok)
	return err == nil
}

// actor returns the authenticated admin token's name, or "".
func actor(r *http.Request) string {
	if a, ok := r.Context().Value(ctxKey{}).(*string); ok {
		return *a
	}
	return ""
}

// authenticate requires "Authorization: Bearer <admin token>" (RFC 6750
// section 2.1) of a token whose role allows need, and puts the token's
// name and role in the request context. A valid token whose role falls
// short is answered 403 (code "forbidden", Role naming need: RFC 6750
// section 3.1's insufficient_scope) and the refusal is logged with the
// token's name.
func (s *Server) authenticate(next http.HandlerFunc, need state.Role) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Get("Authorization")
		scheme, tok, ok := strings.Cut(h, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="machina"`)
			writeError(w, http.StatusUnauthorized, v1.Error{Message: "missing bearer token", Code: v1.CodeUnauthorized})
			return
		}
		at, err := s.store.AuthenticateAdmin(strings.TrimSpace(tok))
		if err != nil {
			if !errors.Is(err, state.ErrTokenUnknown) {
				s.internal(w, r, err)
				return
			}
			s.metrics.authFailures.Inc()
			w.Header().Set("WWW-Authenticate", `Bearer realm="machina", error="invalid_token"`)
			writeError(w, http.StatusUnauthorized, v1.Error{Message: "invalid or revoked token", Code: v1.CodeUnauthorized})
			return
		}
		if p, ok := r.Context().Value(ctxKey{}).(*string); ok {
			*p = at.Name
		}
		if !at.Role.Allows(need) {
			s.log.Info("admin request refused: role", "token", at.Name, "role", at.Role, "need", need, "method", r.Method, "path", r.URL.Path)
			w.Header().Set("WWW-Authenticate", `Bearer realm="machina", error="insufficient_scope"`)
			writeError(w, http.StatusForbidden, v1.Error{Message: fmt.Sprintf("this request needs an admin token with role %s; token %s has role %s", need, at.Name, at.Role),
				Code: v1.CodeForbidden, Role: string(need)})
			return
		}
		ctx := context.WithValue(r.Context(), tokenKey{}, strings.TrimSpace(tok))
		next(w, r.WithContext(context.WithValue(ctx, roleKey{}, at.Role)))
	}
}

// instrument counts and times every request of pattern and logs it at
// Debug. The route's histogram and its 200 counter are looked up once,
// at mount, not per request (a boot storm's script GETs each paid a label
// hash and a map lookup for both, and a string for the code); the actor
// slot the log line reads is put in the request context only for routes
// that authenticate (withActor), since a new context is a copy of the
// request (the api server's cost per script GET).
func (s *Server) instrument(pattern string, next http.Handler, withActor bool) http.Handler {
	ok := s.metrics.requests.WithLabelValues(pattern, "200")
	dur := s.metrics.duration.WithLabelValues(pattern)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &httpstatus.Recorder{ResponseWriter: w}
		if withActor {
			name := new(string) // filled by authenticate
			r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, name))
		}
		next.ServeHTTP(sw, r)
		if sw.Code == 0 {
			sw.Code = http.StatusOK
		}
		d := time.Since(start)
		if sw.Code == http.StatusOK {
			ok.Inc()
		} else {
			s.metrics.requests.WithLabelValues(pattern, strconv.Itoa(sw.Code)).Inc()
		}
		dur.Observe(d.Seconds())
		if s.log.Enabled(r.Context(), slog.LevelDebug) {
			s.log.Debug("http request", "route", pattern, "status", sw.Code, "duration", d, "actor", actor(r))
		}
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v) // the client went away; nothing to do
}

func writeError(w http.ResponseWriter, code int, e v1.Error) { writeJSON(w, code, e) }

func badRequest(w http.ResponseWriter, format string, args ...any) {
	writeError(w, http.StatusBadRequest, v1.Error{Message: fmt.Sprintf(format, args...), Code: v1.CodeBadRequest})
}

// internal logs err (which never holds a secret: state errors name records,
// not values) and answers 500 without details.
// A write refused because this controller lost leadership
// (state.ErrNotLeader, HA on etcd), or a store call that timed out (etcd
// unreachable), answers 503 with Retry-After instead:
// the client's retry reaches the new leader (through the provisioning VIP
// or the admin API's forwarding).
func (s *Server) internal(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, state.ErrNotLeader) || errors.Is(err, context.DeadlineExceeded) {
		s.log.Warn("request refused: not the leader or store timed out", "err", err, "method", r.Method, "path", r.URL.Path)
		unavailable(w)
		return
	}
	s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	writeError(w, http.StatusInternalServerError, v1.Error{Message: "internal error", Code: v1.CodeInternal})
}

// storeError maps a state error to an answer.
func (s *Server) storeError(w http.ResponseWriter, r *http.Request, err error) {
	var te *state.TransitionError
	switch {
	case errors.As(err, &te):
		writeError(w, http.StatusConflict, v1.Error{Message: te.Error(), Code: v1.CodeConflict, Lifecycle: string(te.Current)})
	case errors.Is(err, state.ErrNotFound):
		writeError(w, http.StatusNotFound, v1.Error{Message: "not found", Code: v1.CodeNotFound})
	case errors.Is(err, state.ErrExists):
		writeError(w, http.StatusConflict, v1.Error{Message: "already exists", Code: v1.CodeConflict})
	case errors.Is(err, state.ErrInvalid):
		// Request values are not echoed back: a mistyped secret could be one.
		badRequest(w, "invalid name, MAC or lifecycle")
	case errors.Is(err, state.ErrClosed):
		writeError(w, http.StatusServiceUnavailable, v1.Error{Message: "store closed", Code: v1.CodeUnavailable})
	default:
		s.internal(w, r, err)
	}
}

// decodeBody decodes a JSON body strictly (unknown fields are errors) into
// v, answering 400 or 413 itself when it returns false.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, v1.Error{Message: fmt.Sprintf("body larger than %d bytes", maxBody), Code: v1.CodeTooLarge})
			return false
		}
		badRequest(w, "decode body: %v", sanitizeJSONErr(err))
		return false
	}
	// dec.More is false before a stray '}' or ']': only io.EOF from the
	// next token proves there is nothing after the object.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		badRequest(w, "decode body: trailing data after the JSON object")
		return false
	}
	return true
}

// sanitizeJSONErr keeps decoder errors short and value-free: syntax and
// type errors name an offset or field, never the value.
func sanitizeJSONErr(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("invalid JSON at offset %d", se.Offset)
	case errors.As(err, &te):
		return fmt.Sprintf("field %q: want %s", te.Field, te.Type)
	case strings.HasPrefix(err.Error(), "json: unknown field"):
		return strings.TrimPrefix(err.Error(), "json: ")
	case errors.Is(err, context.Canceled):
		return "request cancelled"
	}
	return "invalid JSON body"
}
