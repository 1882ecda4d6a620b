// Package redfish is the DMTF Redfish (DSP0266) driver for [bmc.Driver],
// built on stmcginnis/gofish for sessions and transport.
//
// Resource bodies are decoded tolerantly into generic JSON: a property of
// the wrong type reads as unknown and never fails the operation. Vendor
// differences are rows of a quirk table ([Quirk]) keyed by manufacturer.
// Every write is read back; a mismatch is [bmc.ErrMismatch] naming both
// values. redfish imports only the bmc package from Machina.
package redfish

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/machina-metal/machina/bmc"
)

// Errors of system selection. All are returned before any write is sent.
var (
	// ErrAmbiguousSystem: the Systems collection has several members and
	// Config.SystemID is empty.
	ErrAmbiguousSystem = errors.New("redfish: several systems and no system ID given")
	// ErrNoSuchSystem: Config.SystemID matches no member of Systems.
	ErrNoSuchSystem = errors.New("redfish: no system with the given ID")
	// ErrNoSystems: the Systems collection has no members (a BMC whose
	// host inventory is not up yet, or a chassis manager).
	ErrNoSystems = errors.New("redfish: the BMC lists no ComputerSystem")
	// ErrTLS: the BMC's certificate did not verify against the system pool
	// or Config.RootCAs. Not transient: a human pins the CA or opts out.
	ErrTLS = errors.New("redfish: TLS certificate not trusted")
	// ErrNoSessionService: Config.Auth is AuthSession and the BMC offers no
	// Redfish sessions (its service root names neither Links.Sessions nor
	// SessionService, or POST to the Sessions collection answers 404, 405
	// or 501). Not a credentials problem: use AuthBasic or AuthAuto. It
	// wraps bmc.ErrUnsupported.
	ErrNoSessionService = fmt.Errorf("redfish: the BMC has no Redfish session service: %w", bmc.ErrUnsupported)
	// ErrSchemeMismatch: the endpoint's scheme does not match what the BMC
	// speaks on that port (an https:// URL to a plain-HTTP port, seen as a
	// TLS record header answered with "HTTP/"; or an http:// URL to a TLS
	// port, seen as a TLS alert record or a 400 "HTTP request to an HTTPS
	// server" answer). Not transient: the message names the scheme to use.
	ErrSchemeMismatch = errors.New("redfish: http/https mismatch")
)

// Config configures one BMC. Only Endpoint is required.
type Config struct {
	// Endpoint is the BMC's base URL, "https://10.0.0.5" or
	// "https://host:8443"; a bare host gets "https://".
	Endpoint string
	// Username and Password are the BMC account. The password is never
	// logged or put in errors. An empty Username sends no credentials at
	// all, for BMCs with authentication turned off.
	Username, Password string
	// Auth is the authentication scheme: AuthAuto (zero value: a Redfish
	// session, falling back to HTTP Basic when the BMC has no session
	// service), AuthSession or AuthBasic (servers.yaml bmc.auth).
	Auth string
	// SystemID picks the ComputerSystem (last path segment, e.g.
	// "System.Embedded.1"). Empty is allowed only when Systems has one member.
	SystemID string
	// Insecure skips TLS verification for this server; zero verifies.
	Insecure bool
	// RootCAs pins the CAs trusted for this server; nil uses the system pool.
	RootCAs *x509.CertPool
	// Transport replaces the HTTP transport (tests); nil builds one from
	// Insecure and RootCAs.
	Transport http.RoundTripper
	// Timeout bounds one HTTP request; zero means 30s.
	Timeout time.Duration
	// Retries is how many times a transient failure is retried; zero means 4,
	// negative means none.
	Retries int
	// RetryBase is the first backoff; it doubles per retry with ±50% jitter
	// up to 30s. Zero means 500ms.
	RetryBase time.Duration
	// PowerTimeout bounds waiting for PowerState after a reset; zero means 5m.
	PowerTimeout time.Duration
	// SoftOffTimeout bounds waiting for GracefulShutdown before ForceOff;
	// zero means 2m.
	SoftOffTimeout time.Duration
	// ResetEvidenceTimeout bounds waiting, after a reset of a running
	// machine, for LastResetTime or BootProgress to move; zero means 30s.
	ResetEvidenceTimeout time.Duration
	// PollInterval is the PowerState and task-monitor poll period; zero means 2s.
	PollInterval time.Duration
	// TaskTimeout bounds following a 202 task monitor; zero means 10m.
	TaskTimeout time.Duration
	// DisableETag never sends If-Match, even when the BMC asks (428).
	DisableETag bool
	// LogEntries is how many newest log entries Info returns; zero means 20.
	LogEntries int
	// FirmwareLimit caps the firmware inventory entries read; zero means 128.
	FirmwareLimit int
	// Logger gets Info lines for hardware actions and Debug for decisions;
	// nil discards.
	Logger *slog.Logger
}

func (c *Config) setDefaults() error {
	if c.Endpoint == "" {
		return errors.New("redfish: config: Endpoint is empty")
	}
	if !strings.Contains(c.Endpoint, "://") {
		c.Endpoint = "https://" + c.Endpoint
	}
	u, err := url.Parse(c.Endpoint)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil {
		return fmt.Errorf("redfish: config: Endpoint %q is not an http(s) URL without credentials", c.Endpoint)
	}
	c.Endpoint = u.Scheme + "://" + u.Host
	switch c.Auth {
	case "":
		c.Auth = AuthAuto
	case AuthAuto, AuthSession, AuthBasic:
	default:
		return fmt.Errorf("redfish: config: Auth %q is not auto, session or basic", c.Auth)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.Timeout, 30*time.Second)
	def(&c.RetryBase, 500*time.Millisecond)
	def(&c.PowerTimeout, 5*time.Minute)
	def(&c.SoftOffTimeout, 2*time.Minute)
	def(&c.PollInterval, 2*time.Second)
	def(&c.TaskTimeout, 10*time.Minute)
	def(&c.ResetEvidenceTimeout, 30*time.Second)
	if c.Retries == 0 {
		c.Retries = 4
	} else if c.Retries < 0 {
		c.Retries = 0
	}
	if c.LogEntries <= 0 {
		c.LogEntries = 20
	}
	if c.FirmwareLimit <= 0 {
		c.FirmwareLimit = 128
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Driver is a [bmc.Driver] for one Redfish BMC. Safe for concurrent use;
// the reconciler serialises actions per server.
type Driver struct {
	cfg  Config
	conn *conn

	mu       sync.Mutex
	sysPath  string // selected ComputerSystem
	root     map[string]any
	quirk    Quirk
	resolved bool
	evidence string                       // what proved the last reset, "" when nothing did
	sawOff   bool                         // a power-off was seen during the current reset
	regs     map[string]*bmc.BIOSRegistry // attribute registries by name (nil: unreadable)

	sysBody bodyCache // the selected System's last answer and its decode
	sysProj bodyCache // the same for the projection sysState reads
}

var (
	_ bmc.Driver     = (*Driver)(nil)
	_ bmc.ResetClock = (*Driver)(nil)
)

// New returns a driver for cfg. It does not contact the BMC; the first
// operation logs in and selects the system.
func New(cfg Config) (*Driver, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	cfg.Logger = cfg.Logger.With("bmc", cfg.Endpoint)
	d := &Driver{cfg: cfg, sysProj: bodyCache{project: projectSystem}}
	d.conn = newConn(&d.cfg)
	return d, nil
}

// AuthScheme returns the authentication scheme negotiated with the BMC:
// "session", "basic", "none" (no credentials configured), or "" before the
// first request. It stays fixed for the Driver's lifetime.
func (d *Driver) AuthScheme() string { return d.conn.Scheme() }

// Close deletes the session on the BMC. Safe to call more than once.
func (d *Driver) Close(ctx context.Context) error {
	d.conn.close(ctx)
	return nil
}

func (d *Driver) get(ctx context.Context, op, p string) (map[string]any, error) {
	return d.getWith(ctx, op, p, reqOpts{})
}

func (d *Driver) getWith(ctx context.Context, op, p string, o reqOpts) (map[string]any, error) {
	r, err := d.conn.do(ctx, op, http.MethodGet, p, nil, o)
	if err != nil {
		return nil, err
	}
	if r.body == nil {
		return nil, fmt.Errorf("redfish: %s: GET %s: body is not a JSON object", op, p)
	}
	return r.body, nil
}

// system resolves (once) and reads the selected ComputerSystem. Selection
// fails closed: several systems need Config.SystemID, and an ID matching
// nothing is ErrNoSuchSystem. The System is read from the BMC every time;
// an answer equal byte for byte to the last one is not decoded again
// (bodyCache), so the returned map must not be modified.
func (d *Driver) system(ctx context.Context, op string) (string, map[string]any, error) {
	return d.readSystem(ctx, op, &d.sysBody)
}

// readSystem is system decoding the System through cache (d.sysBody: the
// whole System; d.sysProj: the projection sysState reads).
func (d *Driver) readSystem(ctx context.Context, op string, cache *bodyCache) (string, map[string]any, error) {
	d.mu.Lock()
	resolved, sp := d.resolved, d.sysPath
	d.mu.Unlock()
	if resolved {
		sys, err := d.getWith(ctx, op, sp, reqOpts{reuse: cache})
		return sp, sys, err
	}
	root, err := d.get(ctx, op, "/redfish/v1")
	if err != nil {
		return "", nil, err
	}
	sysColl := link(root, "Systems")
	if sysColl == "" {
		return "", nil, fmt.Errorf("redfish: %s: service root has no Systems: %w", op, bmc.ErrUnsupported)
	}
	coll, err := d.get(ctx, op, sysColl)
	if err != nil {
		return "", nil, err
	}
	ms := members(coll)
	switch {
	case d.cfg.SystemID != "":
		sp = ""
		for _, m := range ms {
			if path.Base(strings.TrimRight(m, "/")) == d.cfg.SystemID {
				sp = m
				break
			}
		}
		if sp == "" {
			return "", nil, fmt.Errorf("redfish: %s: system %q among %d: %w", op, d.cfg.SystemID, len(ms), ErrNoSuchSystem)
		}
	case len(ms) == 1:
		sp = ms[0]
	case len(ms) == 0:
		return "", nil, fmt.Errorf("redfish %s: %s: the BMC lists no systems (GET %s: empty Members): %w", d.cfg.Endpoint, op, sysColl, ErrNoSystems)
	default:
		return "", nil, fmt.Errorf("redfish: %s: %d systems: %w", op, len(ms), ErrAmbiguousSystem)
	}
	sys, err := d.getWith(ctx, op, sp, reqOpts{reuse: cache})
	if err != nil {
		return "", nil, err
	}
	d.mu.Lock()
	d.resolved, d.sysPath, d.root = true, sp, root
	d.quirk = quirkFor(strv(sys, "Manufacturer"))
	d.mu.Unlock()
	d.cfg.Logger.Debug("redfish system selected", "system", sp, "manufacturer", strv(sys, "Manufacturer"))
	return sp, sys, nil
}

// sysRead says whether a read of the System may be answered from the
// operation's shared answer (bmc.ShareReads).
type sysRead int

const (
	// readFresh asks the BMC: the read verifies (a read-back after a
	// PATCH, a power poll after a reset, a caller's own read).
	readFresh sysRead = iota
	// readShared may take the newest System answer of the same
	// bmc.ShareReads operation, when no write was sent since: the read
	// only chooses the next request.
	readShared
)

// sharedSys is a System answer kept in a bmc.ReadScope under the conn.
type sharedSys struct {
	path string
	sys  map[string]any
}

// sysState reads the selected System for the boot override and power
// paths: only the properties they use (projectSystem, stateProps: iDRAC
// 9's System in 0.46x the time and 1/8 the bytes of a whole decode; a
// driver's first read also selects the System, as system does). With
// readShared and a bmc.ShareReads context it returns the operation's
// newest answer instead when there is one (no request sent). Every answer
// read is kept in the scope for the next readShared. The returned map
// must not be modified.
func (d *Driver) sysState(ctx context.Context, op string, how sysRead) (string, map[string]any, error) {
	scope := bmc.SharedReads(ctx)
	if how == readShared {
		if v, ok := scope.Load(d.conn); ok {
			s := v.(sharedSys)
			return s.path, s.sys, nil
		}
	}
	sp, sys, err := d.readSystem(ctx, op, &d.sysProj)
	if err != nil {
		return "", nil, err
	}
	scope.Store(d.conn, sharedSys{path: sp, sys: sys})
	return sp, sys, nil
}

func (d *Driver) q() Quirk {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.quirk
}

// PowerState reads ComputerSystem.PowerState. "PoweringOn"/"PoweringOff"
// and unknown values read as bmc.PowerUnknown. Under bmc.ShareReads it
// is the operation's newest System answer when no write was sent since
// (a netboot's boot override read-back already says whether to power on
// or reset): no request is sent.
func (d *Driver) PowerState(ctx context.Context) (_ bmc.PowerState, err error) {
	defer func() { err = bmc.WithBMC(d.cfg.Endpoint, err) }()
	d.conn.beginOp()
	return d.powerState(ctx, readShared)
}

func (d *Driver) powerState(ctx context.Context, how sysRead) (bmc.PowerState, error) {
	_, sys, err := d.sysState(ctx, "power state", how)
	if err != nil {
		return bmc.PowerUnknown, err
	}
	return powerOf(sys), nil
}

func powerOf(sys map[string]any) bmc.PowerState {
	switch strv(sys, "PowerState") {
	case "On":
		return bmc.PowerOn
	case "Off":
		return bmc.PowerOff
	}
	return bmc.PowerUnknown
}
