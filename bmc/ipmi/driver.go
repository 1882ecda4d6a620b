package ipmi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/types"

	"github.com/machina-metal/machina/bmc"
)

// DefaultPort is the RMCP/RMCP+ UDP port (IPMI v2.0 §13.1.3, "ASF-RMCP", 623).
const DefaultPort = 623

// Cipher suite IDs (IPMI v2.0 table 22-20).
const (
	// CipherSuite17 is RAKP-HMAC-SHA256 / HMAC-SHA256-128 / AES-CBC-128, the
	// only suite OpenBMC offers by default.
	CipherSuite17 uint8 = 17
	// CipherSuite3 is RAKP-HMAC-SHA1 / HMAC-SHA1-96 / AES-CBC-128, what most
	// older BMCs (and ipmi_sim) offer.
	CipherSuite3 uint8 = 3
)

// Config configures one IPMI BMC. Every zero value is usable.
type Config struct {
	// Address is "host" or "host:port" ("[v6addr]:port" for IPv6); the port
	// defaults to 623.
	Address string
	// Username is the IPMI user name (at most 16 bytes, IPMI v2.0 §13.20).
	Username string
	// Password is the user's password. It is never logged, put in an error,
	// or passed on a command line.
	Password string
	// CipherSuites are tried in order when no suite is cached for this driver;
	// nil means {17, 3}. Suites below MinCipherSuite are not tried.
	CipherSuites []uint8
	// MinCipherSuite is the weakest cipher suite a session may run with,
	// judged by the algorithms the BMC's Open Session Response returned
	// (Security), not by the suite asked for: 3 (RAKP-HMAC-SHA1,
	// HMAC-SHA1-96, AES-CBC-128) or 17 (the SHA-256 variants, AES); zero
	// means 3. Every other suite (no integrity or no encryption, MD5, RC4;
	// 0-2 among them) is never accepted. A BMC that answers with less is
	// refused with bmc.ErrUnsupported naming what it offered and the
	// minimum.
	MinCipherSuite uint8
	// HandshakeTimeout bounds each UDP exchange while trying a cipher suite;
	// zero means 1s. Kept short so a BMC silently ignoring suite 17 costs
	// little before suite 3 is tried.
	HandshakeTimeout time.Duration
	// Timeout bounds one UDP exchange of an established session; zero means 1s.
	Timeout time.Duration
	// Retries is how many times a request whose answer was lost is sent
	// again; zero means 2, a negative value means none.
	Retries int
	// PowerTimeout bounds the wait for the chassis to reach the wanted power
	// state after a command; zero means 60s.
	PowerTimeout time.Duration
	// SoftOffTimeout bounds the wait after a soft shutdown (Chassis Control
	// 05h) before a hard power off is sent; zero means 30s.
	SoftOffTimeout time.Duration
	// PollInterval is the pause between two Get Chassis Status reads while
	// waiting for a power state; zero means 500ms.
	PollInterval time.Duration
	// IPMITool is the ipmitool binary used for Serial-over-LAN; "" means
	// "ipmitool" looked up in PATH.
	IPMITool string
	// Logger receives Info lines for hardware actions and Debug lines for
	// decisions; nil discards.
	Logger *slog.Logger
}

// Driver is a bmc.Driver for one IPMI BMC. Safe for concurrent use; calls
// are serialised.
type Driver struct {
	cfg  Config
	host string
	port int
	log  *slog.Logger

	mu sync.Mutex
	// c is the current session, nil before the first call and after Close
	// or a lost session.
	c *client.Client
	// suite is the cipher suite that worked last, 0 before the first session.
	suite uint8
	// security is what the current (or last) session negotiated.
	security Security
	// sawOff is set when chassis status read off during the current
	// reset or cycle; evidence is what proved the last one.
	sawOff bool
	// lostAnswer is set when the answer to the current reset or cycle's
	// Chassis Control was lost (controlOnce).
	lostAnswer bool
	evidence   string
	// opened is when c was opened; expire closes c at sessionMaxAge.
	opened time.Time
	expire *time.Timer
}

// sessionMaxAge bounds a session's life: the driver closes a session (Close
// Session, then its socket) at this age, idle or not, and the next call
// opens a new one. go-ipmi v0.9.1 starts a keep-alive with every session
// that sends Get Session Info every 30 s with a context that is never
// cancelled; an exchange it had queued when the session was closed ran
// after Close had released the socket and dereferenced the nil connection
// (udpclient.go ExchangeUntilMatch): a panic that ended the controller in
// the VM lab under CI load. Its interval is a constant, so
// the driver never lets a session reach its first keep-alive: 15 s leaves
// 15 s for a call holding the driver's lock (Timeout x (Retries+1)) to end.
var sessionMaxAge = 15 * time.Second // a var for the tests only

var (
	_ bmc.Driver           = (*Driver)(nil)
	_ bmc.SecurityReporter = (*Driver)(nil)
)

// New validates cfg and returns a driver. It does not contact the BMC: the
// session is opened by the first call. Errors name the invalid field.
func New(cfg Config) (*Driver, error) {
	host, port, err := splitAddress(cfg.Address)
	if err != nil {
		return nil, err
	}
	if cfg.Username == "" {
		return nil, errors.New("ipmi: username is empty")
	}
	if len(cfg.Username) > 16 {
		return nil, fmt.Errorf("ipmi: username is %d bytes, at most 16 allowed", len(cfg.Username))
	}
	if len(cfg.Password) > 20 {
		return nil, fmt.Errorf("ipmi: password is %d bytes, at most 20 allowed", len(cfg.Password))
	}
	if cfg.CipherSuites == nil {
		cfg.CipherSuites = []uint8{CipherSuite17, CipherSuite3}
	}
	if cfg.MinCipherSuite == 0 {
		cfg.MinCipherSuite = CipherSuite3
	}
	if cfg.MinCipherSuite != CipherSuite3 && cfg.MinCipherSuite != CipherSuite17 {
		return nil, fmt.Errorf("ipmi: minimum cipher suite %d: want 3 or 17 (suites without integrity or encryption, with MD5 or RC4, are never accepted)", cfg.MinCipherSuite)
	}
	var suites []uint8
	for _, s := range cfg.CipherSuites {
		if _, _, _, ok := types.GetCipherSuiteAlgorithms(types.CipherSuiteID(s)); !ok {
			return nil, fmt.Errorf("ipmi: unknown cipher suite %d", s)
		}
		if suiteRank(int(s)) >= suiteRank(int(cfg.MinCipherSuite)) {
			suites = append(suites, s)
		}
	}
	if len(suites) == 0 {
		return nil, fmt.Errorf("ipmi: cipher suites %v: none at or above the minimum cipher suite %d", cfg.CipherSuites, cfg.MinCipherSuite)
	}
	cfg.CipherSuites = suites
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	switch {
	case cfg.Retries == 0:
		cfg.Retries = 2
	case cfg.Retries < 0:
		cfg.Retries = 0
	}
	if cfg.PowerTimeout <= 0 {
		cfg.PowerTimeout = 60 * time.Second
	}
	if cfg.SoftOffTimeout <= 0 {
		cfg.SoftOffTimeout = 30 * time.Second
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 500 * time.Millisecond
	}
	if cfg.IPMITool == "" {
		cfg.IPMITool = "ipmitool"
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Driver{cfg: cfg, host: host, port: port, log: log.With("bmc", net.JoinHostPort(host, strconv.Itoa(port)))}, nil
}

// splitAddress parses "host", "host:port", "[v6]" or "[v6]:port".
func splitAddress(addr string) (string, int, error) {
	if addr == "" {
		return "", 0, errors.New("ipmi: address is empty")
	}
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		// No port: a bare host name, IPv4 or (bracketed or not) IPv6 address.
		host, portStr = addr, ""
		if len(host) > 1 && host[0] == '[' && host[len(host)-1] == ']' {
			host = host[1 : len(host)-1]
		}
	}
	if host == "" {
		return "", 0, fmt.Errorf("ipmi: address %q has no host", addr)
	}
	if host[0] == '-' {
		return "", 0, fmt.Errorf("ipmi: address %q: host starts with '-'", addr)
	}
	for _, r := range host {
		if !(r == '.' || r == '-' || r == ':' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '%') {
			return "", 0, fmt.Errorf("ipmi: address %q: invalid character %q in host", addr, r)
		}
	}
	port := DefaultPort
	if portStr != "" {
		p, err := strconv.Atoi(portStr)
		if err != nil || p < 1 || p > 65535 {
			return "", 0, fmt.Errorf("ipmi: address %q: invalid port %q", addr, portStr)
		}
		port = p
	}
	return host, port, nil
}

// CipherSuite returns the cipher suite requested by the last successful
// session, or 0 before the first one; Security says what the BMC answered.
func (d *Driver) CipherSuite() uint8 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.suite
}

// Security returns what the last successful session negotiated, as the
// BMC's Open Session Response stated it; the zero Security before the
// first session.
func (d *Driver) Security() Security {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.security
}

// session returns the open session, opening one if needed. Called with d.mu held.
func (d *Driver) session(ctx context.Context) (*client.Client, error) {
	if d.c != nil && time.Since(d.opened) < sessionMaxAge {
		return d.c, nil
	}
	if d.c != nil {
		d.closeCurrent(ctx)
	}
	suites := d.cfg.CipherSuites
	if d.suite != 0 {
		// The cached suite first; the others stay as fallbacks in case the
		// BMC was reconfigured.
		suites = append([]uint8{d.suite}, without(suites, d.suite)...)
	}
	var errs []error
	var weak []string // sessions refused for answering below the minimum
	for _, s := range suites {
		c, err := client.NewClient(d.host, d.port, d.cfg.Username, d.cfg.Password)
		if err != nil {
			return nil, fmt.Errorf("ipmi: open session: %w", err)
		}
		sniff := &openSessionSniffer{timeout: d.cfg.HandshakeTimeout}
		c.WithUDPProxy(sniff)
		c.WithTimeout(d.cfg.HandshakeTimeout).WithRetry(min(d.cfg.Retries, 1)).WithCipherSuiteID(types.CipherSuiteID(s))
		start := time.Now()
		err = c.Connect(ctx)
		if err == nil {
			sec, ok := sniff.security(s)
			if !ok || suiteRank(sec.Suite) < suiteRank(int(d.cfg.MinCipherSuite)) {
				discard(ctx, c)
				offered := sec.String()
				if !ok {
					offered = "algorithms not seen in its Open Session Response"
				}
				d.log.Debug("ipmi cipher suite below the minimum", "requested", s, "offered", offered, "minimum", d.cfg.MinCipherSuite)
				weak = append(weak, fmt.Sprintf("asked cipher suite %d, the BMC answered with %s", s, offered))
				continue
			}
			d.adopt(c, s, sec, errs, time.Since(start))
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("ipmi: open session: %w", ctx.Err())
		}
		switch {
		case isAuthError(err):
			discard(ctx, c)
			// A wrong password fails the RAKP exchange whatever the suite.
			return nil, fmt.Errorf("ipmi: open session with cipher suite %d as %q: %w (RAKP: %v)", s, d.cfg.Username, bmc.ErrAuth, err)
		case isRefused(err):
			return nil, fmt.Errorf("ipmi: open session: %w: %v", bmc.ErrUnreachable, err)
		case isTimeout(err) && isChannelAuthStep(err):
			// Get Channel Authentication Capabilities precedes any suite
			// choice: silence here is silence for every suite.
			return nil, fmt.Errorf("ipmi: open session: %w: no answer to Get Channel Authentication Capabilities", bmc.ErrUnreachable)
		}
		discard(ctx, c)
		d.log.Debug("ipmi cipher suite not accepted", "cipherSuite", s, "took", time.Since(start), "err", err)
		errs = append(errs, fmt.Errorf("cipher suite %d: %w", s, err))
	}
	if len(weak) > 0 {
		return nil, fmt.Errorf("ipmi: open session: %w: below the minimum cipher suite %d: %s%s", bmc.ErrUnsupported, d.cfg.MinCipherSuite,
			strings.Join(weak, "; "), joinedSuffix(errs))
	}
	joined := errors.Join(errs...)
	allTimeouts := true
	for _, e := range errs {
		if !isTimeout(e) {
			allTimeouts = false
		}
	}
	if rakp1Silent(errs) {
		return nil, unknownUserError(d.cfg.Username, suites)
	}
	if allTimeouts {
		return nil, fmt.Errorf("ipmi: open session: %w: %v", bmc.ErrUnreachable, joined)
	}
	return nil, fmt.Errorf("ipmi: open session: %w: no cipher suite of %v accepted: %v", bmc.ErrUnsupported, suites, joined)
}

// adopt makes c, opened with cipher suite s and negotiated as sec, the
// current session, logging what was negotiated once per change (errs are
// the suites refused before it). Called with d.mu held.
func (d *Driver) adopt(c *client.Client, s uint8, sec Security, errs []error, took time.Duration) {
	c.WithTimeout(d.cfg.Timeout).WithRetry(d.cfg.Retries)
	if d.suite != s || d.security != sec {
		// Say what was negotiated, once per change: the BMC's
		// answer, not the request (a BMC may answer a request
		// for suite 17 with suite 3's algorithms).
		refused := make([]string, 0, len(errs))
		for _, e := range errs {
			refused = append(refused, e.Error())
		}
		d.log.Info("ipmi session opened", "requestedCipherSuite", s, "cipherSuite", sec.Suite,
			"authentication", sec.Authentication, "integrity", sec.Integrity, "confidentiality", sec.Confidentiality,
			"refused", refused, "took", took)
	}
	d.c, d.suite, d.security, d.opened = c, s, sec, time.Now()
	d.expire = time.AfterFunc(sessionMaxAge, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.c == c {
			d.closeCurrent(context.Background())
		}
	})
}

// joinedSuffix is "; other suites: ..." naming errs, "" when none.
func joinedSuffix(errs []error) string {
	if len(errs) == 0 {
		return ""
	}
	return "; other suites: " + errors.Join(errs...).Error()
}

func isChannelAuthStep(err error) bool {
	return err != nil && containsAll(err.Error(), "Get Channel Authentication Capabilities")
}

func without(s []uint8, v uint8) []uint8 {
	out := make([]uint8, 0, len(s))
	for _, x := range s {
		if x != v {
			out = append(out, x)
		}
	}
	return out
}

// dropSession forgets a session the BMC no longer answers on.
func (d *Driver) dropSession(ctx context.Context) {
	if d.c == nil {
		return
	}
	d.stopExpire()
	discard(ctx, d.c)
	d.c = nil
}

// stopExpire stops the current session's age timer. Called with d.mu held.
func (d *Driver) stopExpire() {
	if d.expire != nil {
		d.expire.Stop()
		d.expire = nil
	}
}

// closeCurrent ends the current session at its age limit: Close Session
// within the driver's Timeout (the BMC frees the slot), then the socket.
// Called with d.mu held. A failed Close Session is logged at Debug: the
// BMC's inactivity timeout frees the slot.
func (d *Driver) closeCurrent(ctx context.Context) {
	c := d.c
	d.c = nil
	d.stopExpire()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.Timeout)
	defer cancel()
	if err := c.Close(cctx); err != nil {
		d.log.Debug("ipmi session close at its age limit failed", "err", err)
	}
}

// discard releases c's socket and keep-alive goroutine without waiting for
// the BMC: Close Session is attempted with an already cancelled context.
func discard(ctx context.Context, c *client.Client) {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cancel()
	_ = c.Close(cctx)
}

// call runs fn on a session. When fn fails because no answer came (the BMC
// restarted and forgot the session, or packets were lost beyond the retry
// budget), the session is re-established once and fn runs again. fn's error
// is classified and wrapped once with op.
func (d *Driver) call(ctx context.Context, op string, fn func(c *client.Client) error) error {
	c, err := d.session(ctx)
	if err != nil {
		return err
	}
	err = fn(c)
	if err != nil && ctx.Err() == nil && isTimeout(err) {
		d.log.Debug("ipmi no answer on session; re-establishing", "op", op, "err", err)
		d.dropSession(ctx)
		c, serr := d.session(ctx)
		if serr != nil {
			return serr
		}
		err = fn(c)
	}
	return classify(op, err)
}

// raw sends one IPMI request and returns the response data after the
// completion code. A non-zero completion code is a *CompletionError.
func (d *Driver) raw(ctx context.Context, op string, netFn types.NetFn, cmd uint8, data []byte) ([]byte, error) {
	var out []byte
	err := d.call(ctx, op, func(c *client.Client) error {
		res, err := c.RawCommand(ctx, netFn, cmd, data, op)
		if err != nil {
			return err
		}
		out = res.Response
		return nil
	})
	return out, err
}

// Close ends the RMCP+ session (Close Session, Cmd 3Ch). Safe to call more
// than once and on a driver that never connected.
func (d *Driver) Close(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.c == nil {
		return nil
	}
	c := d.c
	d.c = nil
	d.stopExpire()
	if err := c.Close(ctx); err != nil {
		return classify("close session", err)
	}
	return nil
}

// InsertMedia returns bmc.ErrUnsupported: IPMI has no virtual media.
func (d *Driver) InsertMedia(ctx context.Context, url string) (err error) {
	defer func() { err = bmc.WithBMC(d.cfg.Address, err) }()
	return fmt.Errorf("ipmi: insert media: %w", bmc.ErrUnsupported)
}

// EjectMedia returns bmc.ErrUnsupported: IPMI has no virtual media.
func (d *Driver) EjectMedia(ctx context.Context) (err error) {
	defer func() { err = bmc.WithBMC(d.cfg.Address, err) }()
	return fmt.Errorf("ipmi: eject media: %w", bmc.ErrUnsupported)
}
