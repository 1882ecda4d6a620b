package ui

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/machina-metal/machina/bmc"
	"github.com/machina-metal/machina/state"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Prefix is the path every UI route lives under. Mount the handler New
// returns at this prefix with no method, e.g.
// apiServer.HandlePublic(ui.Prefix, h): the UI authenticates by its own
// session cookie, not by bearer token.
const Prefix = "/ui/"

// BMCInfoSource returns the BMC read model of a server (bmc.Driver.Info of
// the server's driver). Implementations MUST bound the call (the UI passes
// a context with Config.BMCTimeout) and MAY return an error wrapping
// bmc.ErrUnsupported or bmc.ErrUnreachable; the page then shows the error
// instead of the section.
type BMCInfoSource interface {
	BMCInfo(ctx context.Context, server string) (*bmc.Info, error)
}

// ConsoleSource says whether a server's BMC offers a serial console, so the
// console page can say "not supported by this BMC" instead of opening a
// WebSocket the console handler refuses (a browser sees only an abnormal
// close, code 1006, with no status or reason). The UI passes a context
// bounded by Config.BMCTimeout.
type ConsoleSource interface {
	// ConsoleSupported returns nil when server's BMC driver offers a serial
	// console (bmc.Console), an error wrapping bmc.ErrUnsupported when it
	// does not, and other errors when it cannot tell (the page then tries).
	ConsoleSupported(ctx context.Context, server string) error
}

// ImageStatus is one image's state as the images page shows it; it mirrors
// images.Status plus the image's name.
type ImageStatus struct {
	Name string `json:"name"`
	// State is pending | downloading | converting | verified | failed.
	State string `json:"state"`
	// Percent is 0–100 while downloading or converting, -1 when the size
	// is unknown.
	Percent float64 `json:"percent"`
	// Reason says why State is failed; "" otherwise.
	Reason string `json:"reason,omitempty"`
	// SizeBytes is the raw image's size once verified; 0 before.
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// Digest is the verified raw image's digest ("sha256:..."), "" before.
	Digest string `json:"digest,omitempty"`
}

// ImageSource lists the images of the acting inventory with their import
// status, ordered by name.
type ImageSource interface {
	ImageStatuses(ctx context.Context) ([]ImageStatus, error)
}

// Revision identifies one inventory revision.
type Revision struct {
	Commit  string    `json:"commit"`            // Git commit hash (hex)
	Digest  string    `json:"digest"`            // inventory digest, "sha256:<hex>"
	Message string    `json:"message,omitempty"` // the commit's subject line
	At      time.Time `json:"at,omitzero"`       // commit time
}

// ValidationError is one problem of an invalid revision
// (inventory.FieldError), shown as FILE:LINE:COL: PATH: MESSAGE.
type ValidationError struct {
	File    string `json:"file"`
	Line    int    `json:"line"`
	Column  int    `json:"column,omitempty"`
	Path    string `json:"path,omitempty"`
	Message string `json:"message"`
}

// String renders e as `machinactl validate` does.
func (e ValidationError) String() string {
	pos := fmt.Sprintf("%s:%d", e.File, e.Line)
	if e.Column > 0 {
		pos += fmt.Sprintf(":%d", e.Column)
	}
	if e.Path != "" {
		return pos + ": " + e.Path + ": " + e.Message
	}
	return pos + ": " + e.Message
}

// PlanStep is one step of a plan (plan.Step).
type PlanStep struct {
	Server  string `json:"server"`
	Action  string `json:"action"`            // reconciler action, e.g. "retire"
	Profile string `json:"profile,omitempty"` // for allocate and deploy
	Why     string `json:"why"`
}

// Condition is a fact status shows (gitops.Condition).
type Condition struct {
	Subject string `json:"subject"` // "server/NAME", "profile/NAME" or "inventory"
	Type    string `json:"type"`    // CamelCase: Orphaned, InsufficientCapacity, Waiting, Held
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// InventoryStatus is what the inventory page shows.
type InventoryStatus struct {
	// Acting is the revision the controller acts on (the last good one);
	// zero before the first valid revision.
	Acting Revision `json:"acting"`
	// Newest is the newest revision fetched; equal to Acting when it is valid.
	Newest Revision `json:"newest"`
	// Errors are Newest's validation errors; empty when it is valid.
	Errors []ValidationError `json:"errors,omitempty"`
	// Held are the steps of Acting the safety brake holds until approved
	// (plan.Result.Held); Brake says why.
	Held  []PlanStep `json:"held,omitempty"`
	Brake string     `json:"brake,omitempty"`
	// Conditions of the acting plan (plan.Result.Conditions).
	Conditions []Condition `json:"conditions,omitempty"`
	// Git is the inventory poller's and the status writer's health (the
	// figures of GET /api/v1/status's git); nil: not shown.
	Git *GitHealth `json:"git,omitempty"`
}

// GitHealth is the Git side's condition as the inventory page shows it.
type GitHealth struct {
	// Poll is the inventory poller, Push the status write-back.
	Poll, Push GitLoop
	// RemoteTip is the branch tip the remote listed last; Behind how many
	// commits it is ahead of the tip evaluated (-1: not fetched).
	RemoteTip string
	Behind    int
	// LastStatusCommit is the last status commit pushed and
	// LastStatusPackBytes the size of its pack.
	LastStatusCommit    string
	LastStatusPackBytes int64
}

// GitLoop is one Git loop's condition: its last success (zero: never),
// the failures since and the last error; Failing marks a write-back that
// failed FailingAfter times in a row, or a poll failing at all.
type GitLoop struct {
	LastSuccess         time.Time
	ConsecutiveFailures int
	Failing             bool
	LastError           string
}

// InventorySource reports the reconciler's view of the inventory. The UI's
// approve button calls state.Store.Approve with a prefix of Acting.Digest;
// the source is expected to re-plan with plan.Options.Approved once
// Store.Approved(Acting.Digest) is true.
type InventorySource interface {
	InventoryStatus(ctx context.Context) (InventoryStatus, error)
}

// Config configures New. Only Store and API are required; every other zero
// value is usable (the page section it feeds says "not available").
type Config struct {
	// Store is the open state store: servers, events, hosts, join logs,
	// admin tokens (login) and approvals.
	Store *state.Store
	// API is the admin API handler (api.Server.Handler()). The UI forwards
	// its browser's reads of /ui/api/v1/... (servers, events and the
	// event stream) to it with the session's admin token, so the page and
	// machinactl read the same answers. Required.
	API http.Handler
	// Console is the console WebSocket handler (console.Handler) shared with
	// the API, so one writer is enforced across machinactl and browsers.
	// Its Config.Authenticate must accept UI sessions: wrap the bearer check
	// with ConsoleAuthenticate. nil: the console page says unavailable.
	Console http.Handler
	// RouteRole gives the admin token role an admin API route pattern
	// needs (pass a wrapper of api.RouteRole, the one table): the UI hides
	// what the session's token may not do (the console button, the
	// approval form) and refuses it if asked anyway. nil: every action
	// needs state.RoleAdmin.
	RouteRole func(pattern string) state.Role
	// ConsoleSupport tells the console page whether the server's BMC has a
	// serial console; nil: the page always opens the WebSocket.
	ConsoleSupport ConsoleSource
	// BMC feeds the server page's BMC section; nil: "not available".
	BMC BMCInfoSource
	// BMCTimeout bounds one BMCInfo call; zero means 5s.
	BMCTimeout time.Duration
	// Images feeds the images page; nil: "not available".
	Images ImageSource
	// Inventory feeds the inventory page and server conditions; nil: "not available".
	Inventory InventorySource
	// SessionTTL is a session's lifetime from login (absolute, not
	// sliding); zero means 30 minutes.
	SessionTTL time.Duration
	// MaxSessions bounds live sessions; a login beyond it evicts the oldest.
	// Zero means 256.
	MaxSessions int
	// Logger receives Info lines for logins, logouts and approvals and Warn
	// lines for refused changes and CSP reports; nil discards.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// UI is the web console. Create it with New (which returns it as an
// http.Handler); it is safe for concurrent use.
type UI struct {
	cfg      Config
	log      *slog.Logger
	store    *state.Store
	mux      *http.ServeMux
	patterns []string // registered route patterns (Routes)
	tmpl     map[string]*template.Template
	static   http.Handler
	sessions *sessions
	// cspReports counts Content-Security-Policy violation reports received.
	cspReports atomic.Int64
	// cspRefused counts reports refused over a source's rate; cspLog
	// paces the violation log lines (one per cspLogEvery, with a count).
	cspRefused atomic.Int64
	cspMu      sync.Mutex
	cspBySrc   map[string]*cspBucket
	cspLogAt   time.Time
	cspUnseen  int64
}

// New builds the UI handler for the routes under Prefix; the handler is a
// *UI. Errors: a nil Store or API, or a template that does not parse.
func New(cfg Config) (http.Handler, error) { return newUI(cfg) }

func newUI(cfg Config) (*UI, error) {
	if cfg.Store == nil {
		return nil, errors.New("ui: new: Config.Store is nil")
	}
	if cfg.API == nil {
		return nil, errors.New("ui: new: Config.API is nil")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 30 * time.Minute
	}
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = 256
	}
	if cfg.BMCTimeout <= 0 {
		cfg.BMCTimeout = 5 * time.Second
	}
	tmpl, err := parseTemplates()
	if err != nil {
		return nil, fmt.Errorf("ui: new: %w", err)
	}
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, fmt.Errorf("ui: new: %w", err)
	}
	u := &UI{cfg: cfg, log: cfg.Logger, store: cfg.Store, mux: http.NewServeMux(), tmpl: tmpl,
		static:   http.StripPrefix("/ui/static/", http.FileServerFS(sub)),
		sessions: newSessions(cfg.SessionTTL, cfg.MaxSessions, cfg.Now)}
	u.routes()
	return u, nil
}

// handle registers one route on the UI's mux and records its pattern.
func (u *UI) handle(pattern string, h http.HandlerFunc) {
	u.mux.HandleFunc(pattern, h)
	u.patterns = append(u.patterns, pattern)
}

// Routes returns every UI route pattern (all under Prefix), for tests
// and docs.
func (u *UI) Routes() []string { return append([]string(nil), u.patterns...) }

// routes registers every UI route. Pages and reads are GET; every change
// is a POST checked for the session's CSRF token and a same-origin Origin.
func (u *UI) routes() {
	m := u.mux
	u.handle("GET /ui/{$}", u.page(u.handleFleet))
	u.handle("GET /ui/login", u.handleLoginForm)
	u.handle("POST /ui/login", u.handleLogin)
	u.handle("POST /ui/logout", u.change(u.handleLogout))
	u.handle("GET /ui/servers/{name}", u.page(u.handleServer))
	u.handle("GET /ui/servers/{name}/console", u.page(u.handleConsolePage))
	u.handle("GET /ui/servers/{name}/console/ws", u.authed(u.handleConsoleWS))
	u.handle("GET /ui/images", u.page(u.handleImages))
	u.handle("GET /ui/hosts", u.page(u.handleHosts))
	u.handle("GET /ui/inventory", u.page(u.handleInventory))
	u.handle("GET /ui/inventory/approve", u.page(u.handleApproveConfirm))
	u.handle("POST /ui/inventory/approve", u.change(u.handleApprove))
	u.handle("GET /ui/data/history", u.authed(u.handleHistory))
	u.handle("GET /ui/data/images", u.authed(u.handleImagesData))
	u.handle("GET /ui/api/v1/", u.authed(u.handleAPIProxy))
	u.handle("POST /ui/csp-report", u.handleCSPReport)
	m.Handle("GET /ui/static/", u.staticHandler())
}

// ServeHTTP sets the security headers on every answer and dispatches.
func (u *UI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", cspFor(r.URL.Path))
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	if r.URL.Path == "/ui" {
		http.Redirect(w, r, Prefix, http.StatusSeeOther)
		return
	}
	u.mux.ServeHTTP(w, r)
}

// csp is the Content-Security-Policy of every UI answer (CSP Level 3):
// scripts only from the UI's own files, so no inline script or event
// handler attribute runs, no eval; connections only to the same origin
// (fetch, EventSource, WebSocket); nothing may frame the UI. Violations
// are reported to /ui/csp-report.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; font-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; " +
	"report-uri /ui/csp-report"

// cspConsole relaxes style-src for the console page only: xterm.js's DOM
// renderer inserts <style> elements for its theme and cell widths. Scripts
// stay as strict as everywhere else.
const cspConsole = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; " +
	"connect-src 'self'; font-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; " +
	"report-uri /ui/csp-report"

func cspFor(path string) string {
	if strings.HasPrefix(path, "/ui/servers/") && strings.HasSuffix(path, "/console") {
		return cspConsole
	}
	return csp
}

// staticHandler serves the embedded assets with a short cache lifetime
// (they change with the binary) and no directory listings.
func (u *UI) staticHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Cache-Control", "private, max-age=300")
		u.static.ServeHTTP(w, r)
	})
}

// CSPReports returns how many Content-Security-Policy violation reports the
// UI has received since New; tests assert it stays zero.
func (u *UI) CSPReports() int64 { return u.cspReports.Load() }

// handleCSPReport accepts a browser's violation report
// (application/csp-report, CSP Level 2 report-uri), counts and logs it.
// Unauthenticated by design (browsers send no credentials choice); the
// body is bounded and only its directive and blocked URI are logged.
// cspBucket is one source address's CSP report allowance.
type cspBucket struct {
	tokens float64
	last   time.Time
}

// CSP report limits: per source address a burst of cspBurst refilled one
// per cspEvery (a browser reports a handful per page view); at most
// cspSources addresses tracked; one log line per cspLogEvery.
const (
	cspBurst    = 20
	cspEvery    = 3 * time.Second
	cspSources  = 4096
	cspLogEvery = 10 * time.Second
)

// cspAllow takes one report from src's allowance.
func (u *UI) cspAllow(src string, now time.Time) bool {
	u.cspMu.Lock()
	defer u.cspMu.Unlock()
	if u.cspBySrc == nil || len(u.cspBySrc) >= cspSources {
		u.cspBySrc = map[string]*cspBucket{}
	}
	b, ok := u.cspBySrc[src]
	if !ok {
		b = &cspBucket{tokens: cspBurst, last: now}
		u.cspBySrc[src] = b
	}
	b.tokens = min(cspBurst, b.tokens+now.Sub(b.last).Seconds()/cspEvery.Seconds())
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// CSPRefused reports how many CSP reports were refused over their
// source's rate (429).
func (u *UI) CSPRefused() int64 { return u.cspRefused.Load() }

// handleCSPReport takes a browser's CSP violation report: unauthenticated,
// so its body is bounded (16 KiB, and the listener's body timeout), each
// source address is rate-limited (429 beyond it, counted), and the log
// gets at most one line per cspLogEvery, counting the reports since.
func (u *UI) handleCSPReport(w http.ResponseWriter, r *http.Request) {
	src, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		src = r.RemoteAddr
	}
	now := time.Now()
	if !u.cspAllow(src, now) {
		u.cspRefused.Add(1)
		w.Header().Set("Retry-After", "3")
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	var rep struct {
		Report struct {
			Directive  string `json:"violated-directive"`
			BlockedURI string `json:"blocked-uri"`
			Document   string `json:"document-uri"`
		} `json:"csp-report"`
	}
	_ = decodeJSON(w, r, 16<<10, &rep) // a malformed report still counts
	u.cspReports.Add(1)
	u.cspMu.Lock()
	logIt := now.Sub(u.cspLogAt) >= cspLogEvery
	unseen := u.cspUnseen
	if logIt {
		u.cspLogAt, u.cspUnseen = now, 0
	} else {
		u.cspUnseen++
	}
	u.cspMu.Unlock()
	if logIt {
		u.log.Warn("csp violation", "directive", rep.Report.Directive, "blocked", truncate(rep.Report.BlockedURI, 200),
			"document", truncate(rep.Report.Document, 200), "unlogged_since_last", unseen, "refused_total", u.cspRefused.Load())
	}
	w.WriteHeader(http.StatusNoContent)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
