package redfish

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
	"weak"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/schemas"

	"github.com/machina-metal/machina/bmc"
)

// response is one decoded Redfish answer.
type response struct {
	status  int
	request string // "METHOD /path" that was answered
	header  http.Header
	body    map[string]any // nil when the body is empty or not a JSON object
}

// captureKey carries a *http.Header through the request context so the
// transport can hand back headers gofish drops on error answers
// (Retry-After, ETag).
type captureKey struct{}

type captureTransport struct{ next http.RoundTripper }

func (t captureTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(r)
	if resp != nil {
		if h, ok := r.Context().Value(captureKey{}).(*http.Header); ok {
			*h = resp.Header.Clone()
		}
		if r.Context().Value(loginKey{}) != nil && r.Method == http.MethodGet && strings.TrimRight(r.URL.Path, "/") == "/redfish/v1" && resp.StatusCode == http.StatusOK {
			projectServiceRoot(resp)
		}
	}
	return resp, err
}

// CloseIdleConnections passes http.Client.CloseIdleConnections on to the
// wrapped transport: without it the client finds no closeIdler and a
// closed driver's keep-alive connection lived on until IdleConnTimeout.
func (t captureTransport) CloseIdleConnections() {
	if c, ok := t.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// loginKey marks the context of a login, whose service-root GET gofish
// decodes strictly into its own struct.
type loginKey struct{}

// projectServiceRoot replaces the service root gofish reads during login by
// the one link it needs (Links.Sessions, DSP0266 §13.3.4; the standard path
// when absent or of the wrong type), so a wrong-typed property elsewhere in
// the root cannot make login fail. The driver reads the real root itself.
func projectServiceRoot(resp *http.Response) {
	raw, _ := readBody(resp)
	resp.Body.Close()
	var root map[string]any
	_ = json.Unmarshal(raw, &root)
	sessions := link(obj(root, "Links"), "Sessions")
	if sessions == "" || !strings.HasPrefix(sessions, "/") {
		sessions = "/redfish/v1/SessionService/Sessions"
	}
	b, _ := json.Marshal(map[string]any{"@odata.id": "/redfish/v1", "Links": map[string]any{"Sessions": map[string]any{"@odata.id": sessions}}})
	resp.Body = io.NopCloser(bytes.NewReader(b))
	resp.ContentLength = int64(len(b))
	resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
	resp.Header.Del("Content-Encoding")
}

// Auth schemes (Config.Auth).
const (
	// AuthAuto tries a Redfish session first and falls back to HTTP Basic
	// when the BMC has no session service (DSP0266 §13.3).
	AuthAuto = "auto"
	// AuthSession uses only a Redfish session (X-Auth-Token).
	AuthSession = "session"
	// AuthBasic uses only HTTP Basic authentication (RFC 7617).
	AuthBasic = "basic"
)

// conn is the authenticated gofish client for one BMC: one session, reused,
// re-created on 401, deleted by close. The scheme negotiated on the first
// login (session or Basic) is remembered for the conn's lifetime. Safe for
// concurrent use.
type conn struct {
	cfg  *Config
	http *http.Client

	mu    sync.Mutex
	api   *gofish.APIClient
	basic bool // Basic auth in use (negotiated or forced)
	// scheme is "session", "basic" or "none" once negotiated, "" before.
	scheme string
	// authErr is the refusal of this operation's login: it is returned
	// again instead of a second attempt (BMC accounts lock after a few
	// failures). beginOp clears it.
	authErr error
}

func newConn(cfg *Config) *conn {
	tr := &http.Transport{
		Proxy:               nil,
		TLSClientConfig:     &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cfg.Insecure, RootCAs: cfg.RootCAs}, //nolint:gosec // per-server opt-out
		TLSHandshakeTimeout: cfg.Timeout,
		// BMC web servers have few connection slots, and a controller of
		// 10,000 servers must not hold 10,000 idle sockets: one idle
		// keep-alive connection per BMC, closed after 15 s unused (a
		// deploy's calls come in bursts well inside that).
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     15 * time.Second,
	}
	var rt http.RoundTripper = tr
	if cfg.Transport != nil {
		rt = cfg.Transport
	}
	return &conn{cfg: cfg, http: &http.Client{Transport: captureTransport{next: rt}}, basic: cfg.Auth == AuthBasic}
}

// beginOp starts one driver operation: a login refused in an earlier
// operation may be tried again, once.
func (c *conn) beginOp() {
	c.mu.Lock()
	c.authErr = nil
	c.mu.Unlock()
}

// rawJSON sends one request outside gofish (login negotiation) and returns
// the status, headers and decoded body (nil when not a JSON object).
func (c *conn) rawJSON(ctx context.Context, method, p string, body any) (*response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.cfg.Endpoint+p, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := readBody(resp)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusBadRequest {
		if err := schemeMismatch(c.cfg.Endpoint, nil, string(raw)); err != nil {
			return nil, err
		}
	}
	out := &response{status: resp.StatusCode, header: resp.Header}
	var m map[string]any
	if json.Unmarshal(raw, &m) == nil {
		out.body = m
	}
	return out, nil
}

// sessionsPath returns the Sessions collection the service root names
// (Links.Sessions, DSP0266 §13.3.4), and whether the root shows a session
// service at all (Links.Sessions or SessionService).
func sessionsPath(root map[string]any) (string, bool) {
	p := link(obj(root, "Links"), "Sessions")
	has := p != "" || link(root, "SessionService") != ""
	if p == "" || !strings.HasPrefix(p, "/") {
		p = "/redfish/v1/SessionService/Sessions"
	}
	return p, has
}

// login authenticates, negotiating the scheme on first use (Config.Auth
// "auto"): the service root is read without credentials; a root without
// Links.Sessions and SessionService means Basic. Otherwise a session is
// created (POST Links.Sessions); the BMC's 404, 405 or 501 there, or a 401
// carrying `WWW-Authenticate: Basic`, means Basic too. Any other 401/403 is
// the credentials refused: bmc.ErrAuth naming the scheme, and no second
// attempt with the same credentials in this operation. Without a Username
// no credentials are sent at all (BMCs with authentication off).
func (c *conn) login(ctx context.Context) (*gofish.APIClient, error) {
	if c.authErr != nil {
		return nil, c.authErr
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	gc := gofish.ClientConfig{
		Endpoint: c.cfg.Endpoint, HTTPClient: c.http, NoModifyTransport: true, ReuseConnections: true,
	}
	if c.cfg.Username == "" {
		c.scheme = "none"
		api, err := gofish.ConnectContext(context.WithValue(ctx, loginKey{}, true), gc)
		if err != nil {
			return nil, classify(c.cfg.Endpoint, "login (no credentials)", "GET /redfish/v1", err, nil)
		}
		return api, nil
	}
	if !c.basic {
		api, fallback, err := c.sessionLogin(ctx, gc)
		if err != nil || !fallback {
			return api, err
		}
		c.basic = true
	}
	c.scheme = AuthBasic
	gc.Username, gc.Password, gc.BasicAuth = c.cfg.Username, c.cfg.Password, true
	api, err := gofish.ConnectContext(context.WithValue(ctx, loginKey{}, true), gc)
	if err != nil {
		return nil, classify(c.cfg.Endpoint, "login (HTTP Basic)", "GET /redfish/v1", err, nil)
	}
	return api, nil
}

// sessionLogin creates a Redfish session. fallback is true (and err nil)
// when Config.Auth is auto and the BMC shows it has no session service.
func (c *conn) sessionLogin(ctx context.Context, gc gofish.ClientConfig) (api *gofish.APIClient, fallback bool, err error) {
	auto := c.cfg.Auth != AuthSession
	root, err := c.rawJSON(ctx, http.MethodGet, "/redfish/v1", nil)
	if err != nil {
		return nil, false, classify(c.cfg.Endpoint, "login", "GET /redfish/v1", err, nil)
	}
	if root.status/100 != 2 {
		return nil, false, c.statusOf("login", "GET /redfish/v1", root)
	}
	sp, has := sessionsPath(root.body)
	if !has && auto {
		c.cfg.Logger.Info("redfish: service root has no session service, using HTTP Basic auth")
		return nil, true, nil
	}
	if !has {
		// Forced session auth: no login is attempted (a refused one would
		// count towards the account's lockout) and the credentials are
		// not blamed.
		return nil, false, fmt.Errorf("redfish %s: login: GET /redfish/v1: %w (the service root names neither Links.Sessions nor SessionService); use HTTP Basic auth (or auto)", c.cfg.Endpoint, ErrNoSessionService)
	}
	r, err := c.rawJSON(ctx, http.MethodPost, sp, map[string]any{"UserName": c.cfg.Username, "Password": c.cfg.Password})
	if err != nil {
		return nil, false, classify(c.cfg.Endpoint, "login", "POST "+sp, err, nil)
	}
	switch {
	case r.status/100 == 2 && r.header.Get("X-Auth-Token") != "":
		loc := r.header.Get("Location")
		if u, err := url.Parse(loc); err == nil && loc != "" {
			loc = u.RequestURI()
		}
		if loc == "" {
			loc = link(r.body, "@odata.id")
			if loc == "" {
				loc = strv(r.body, "@odata.id")
			}
		}
		c.scheme = AuthSession
		gc.Session = &gofish.Session{ID: loc, Token: r.header.Get("X-Auth-Token")}
		api, err := gofish.ConnectContext(context.WithValue(ctx, loginKey{}, true), gc)
		if err != nil {
			return nil, false, classify(c.cfg.Endpoint, "login", "GET /redfish/v1", err, nil)
		}
		return api, false, nil
	case auto && r.status == http.StatusUnauthorized && strings.HasPrefix(strings.ToLower(strings.TrimSpace(r.header.Get("WWW-Authenticate"))), "basic"):
		c.cfg.Logger.Info("redfish: session login challenged for HTTP Basic, using Basic auth", "request", "POST "+sp)
		return nil, true, nil
	case auto && (r.status == http.StatusNotFound || r.status == http.StatusMethodNotAllowed || r.status == http.StatusNotImplemented):
		c.cfg.Logger.Info("redfish: no session service, using HTTP Basic auth", "request", "POST "+sp, "status", r.status)
		return nil, true, nil
	case !auto && (r.status == http.StatusNotFound || r.status == http.StatusMethodNotAllowed || r.status == http.StatusNotImplemented):
		return nil, false, fmt.Errorf("redfish %s: login: POST %s answered HTTP %d: %w; use HTTP Basic auth (or auto)", c.cfg.Endpoint, sp, r.status, ErrNoSessionService)
	case r.status == http.StatusUnauthorized || r.status == http.StatusForbidden:
		err := c.statusOf("login", "POST "+sp, r)
		c.authErr = fmt.Errorf("redfish: credentials refused by the BMC (Redfish session login): %w", err)
		return nil, false, c.authErr
	case r.status/100 == 2:
		return nil, false, &bmc.BMCError{BMC: c.cfg.Endpoint, Op: "login", Request: "POST " + sp, Status: r.status, Message: "session created without an X-Auth-Token header"}
	}
	return nil, false, c.statusOf("login", "POST "+sp, r)
}

// statusOf turns a non-2xx raw answer into a classified *statusError.
func (c *conn) statusOf(op, request string, r *response) error {
	se := &schemas.Error{HTTPReturnedStatusCode: r.status}
	if e := obj(r.body, "error"); e != nil {
		se.Code, se.Message = strv(e, "code"), strv(e, "message")
		if infos, ok := e["@Message.ExtendedInfo"].([]any); ok {
			for _, i := range infos {
				m, _ := i.(map[string]any)
				ei := schemas.ErrExtendedInfo{MessageID: strv(m, "MessageId"), Message: strv(m, "Message")}
				se.ExtendedInfos = append(se.ExtendedInfos, ei)
			}
		}
	}
	if se.Message == "" {
		se.Message = http.StatusText(r.status)
	}
	return classify(c.cfg.Endpoint, op, request, se, r.header)
}

// client returns the logged-in client, logging in on first use.
func (c *conn) client(ctx context.Context) (*gofish.APIClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.api != nil {
		return c.api, nil
	}
	api, err := c.login(ctx)
	if err != nil {
		return nil, err
	}
	c.api = api
	return api, nil
}

// relogin replaces the session after a 401 (expired or deleted on the BMC).
// The dead session is not deleted: the BMC has already dropped it.
func (c *conn) relogin(ctx context.Context, stale *gofish.APIClient) (*gofish.APIClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.api != stale && c.api != nil {
		return c.api, nil
	}
	c.api = nil
	api, err := c.login(ctx)
	if err != nil {
		return nil, err
	}
	c.api = api
	return api, nil
}

func (c *conn) usingBasic() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.basic || c.scheme == "none"
}

// Scheme returns the authentication scheme in use: "session", "basic",
// "none" (no credentials configured), or "" before the first login.
func (c *conn) Scheme() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.scheme
}

// close deletes the session, if any.
func (c *conn) close(ctx context.Context) {
	c.mu.Lock()
	api := c.api
	c.api = nil
	c.mu.Unlock()
	defer c.http.CloseIdleConnections() // also after Basic auth or a failed login
	if api == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	api.WithContext(ctx).Logout()
}

// reqOpts modify one request.
type reqOpts struct {
	ifMatch string
	// once disables retries on connection errors: the request may have
	// been applied (a reset), so the caller re-reads state instead.
	once bool
	// reuse, when set, keeps the last answer's body and its decode: an
	// answer byte for byte equal to the kept one is not decoded again.
	reuse *bodyCache
}

// bodyCache keeps the raw bytes and the decoded object of the last answer
// to one GET (the selected ComputerSystem, read several times per boot
// override and power action: before the PATCH, after it, before the
// reset and while polling PowerState). A BMC answers the same bytes while
// nothing on the System changed, and decoding a vendor's System (Dell's
// iDRAC 9 about 15 KB, with its Oem sections) into a generic map is the
// driver's largest CPU cost; equal bytes decode to an equal map, so it is
// handed out again. The kept map is shared: callers only read decoded
// bodies (no accessor in decode.go writes).
//
// The answer is kept through a weak pointer: it lasts until the next
// garbage collection, so reads milliseconds apart (one boot override and
// power action) share a decode, and a fleet of idle cached drivers holds
// no decoded Systems (about 80 KB each for iDRAC 9).
type bodyCache struct {
	// project, when set, decodes an answer in place of decodeObject
	// (projectSystem: only the properties the power and boot override
	// paths read).
	project func([]byte) map[string]any

	mu   sync.Mutex
	last weak.Pointer[keptBody]
}

// keptBody is one answer's bytes and their decode.
type keptBody struct {
	raw  []byte
	body map[string]any
}

// decode returns raw decoded as a JSON object (nil when it is not one),
// the kept decode when raw equals the kept bytes.
func (c *bodyCache) decode(raw []byte) map[string]any {
	c.mu.Lock()
	k := c.last.Value()
	c.mu.Unlock()
	if k != nil && bytes.Equal(k.raw, raw) {
		return k.body
	}
	dec := decodeObject
	if c.project != nil {
		dec = c.project
	}
	m := dec(raw)
	if m != nil {
		c.mu.Lock()
		c.last = weak.Make(&keptBody{raw: raw, body: m})
		c.mu.Unlock()
	}
	return m
}

// decodeObject decodes raw as a JSON object; nil when it is not one.
func decodeObject(raw []byte) map[string]any {
	var m map[string]any
	if json.Unmarshal(raw, &m) != nil {
		return nil
	}
	return m
}

// stateProps are the ComputerSystem properties the boot override and
// power paths read (Driver.sysState): Boot (the override, its
// @Redfish.AllowableValues), @Redfish.Settings (a settings object to
// PATCH), Actions (#ComputerSystem.Reset), PowerState, LastResetTime and
// BootProgress (reset evidence) and Manufacturer (the quirk row).
var stateProps = [...]string{"Boot", "@Redfish.Settings", "Actions", "PowerState", "LastResetTime", "BootProgress", "Manufacturer"}

// projectSystem decodes raw as a JSON object keeping only stateProps,
// each decoded as decodeObject would (so the tolerant accessors read
// them alike, and a property of the wrong type still reads as unknown);
// nil when raw is not a valid JSON object. raw is validated whole
// (json.Valid), then its top-level members are walked by a byte skipper
// and only stateProps are decoded: the rest of the System (iDRAC 9's
// Links, Oem and PCIe lists, most of its 15 KB) is neither decoded into
// maps nor scanned a second time, which is what made a generic decode
// the driver's largest CPU cost. Keys match exactly, escapes unquoted,
// and the last of duplicate keys wins, as in a map decode.
func projectSystem(raw []byte) map[string]any {
	if !json.Valid(raw) {
		return nil
	}
	i := skipSpace(raw, 0)
	if raw[i] != '{' {
		return nil
	}
	out := make(map[string]any, len(stateProps))
	for i = skipSpace(raw, i+1); raw[i] != '}'; {
		ke := skipString(raw, i)
		key := raw[i+1 : ke-1]
		vs := skipSpace(raw, skipSpace(raw, ke)+1) // past the ':'
		ve := skipValue(raw, vs)
		if k := stateProp(key); k != "" {
			var v any
			if json.Unmarshal(raw[vs:ve], &v) == nil {
				out[k] = v
			}
		}
		i = skipSpace(raw, ve)
		if raw[i] == ',' {
			i = skipSpace(raw, i+1)
		}
	}
	return out
}

// stateProp returns the member of stateProps the raw (quoted, maybe
// escaped) key names, "" when none.
func stateProp(key []byte) string {
	k := string(key)
	if strings.IndexByte(k, '\\') >= 0 {
		if json.Unmarshal([]byte(`"`+k+`"`), &k) != nil {
			return ""
		}
	}
	for _, p := range stateProps {
		if k == p {
			return p
		}
	}
	return ""
}

// skipSpace returns the index of the first byte at or after i that is
// not JSON white space.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just past the string starting at b[i]
// (a '"'). b is valid JSON.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return i
}

// skipValue returns the index just past the value starting at b[i]. b is
// valid JSON, so brackets balance outside strings.
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
		i++
	}
	return i
}

// do sends one request with retries: 503/502/504 answers (honouring
// Retry-After) and, unless o.once, connection errors and timeouts are
// retried with exponential backoff and jitter; a 401 re-creates the session
// once. Non-2xx answers become *bmc.BMCError.
func (c *conn) do(ctx context.Context, op, method, path string, body any, o reqOpts) (*response, error) {
	if method != http.MethodGet {
		// A write may change the System: no read from before it may
		// choose a request after it (bmc.ShareReads).
		bmc.SharedReads(ctx).Forget(c)
	}
	var lastErr error
	relogged := false
	for attempt := 0; attempt <= c.cfg.Retries; attempt++ {
		if attempt > 0 {
			d := backoff(c.cfg.RetryBase, attempt, lastErr)
			c.cfg.Logger.Debug("redfish retry", "op", op, "attempt", attempt, "delay", d, "err", lastErr)
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, fmt.Errorf("redfish: %s: %w (last error: %w)", op, ctx.Err(), lastErr)
			case <-t.C:
			}
		}
		api, err := c.client(ctx)
		if err != nil {
			if bmc.IsTransient(err) && !errors.Is(err, bmc.ErrAuth) {
				lastErr = err
				continue
			}
			return nil, err
		}
		resp, err := c.once(ctx, api, op, method, path, body, o)
		if err == nil {
			return resp, nil
		}
		lastErr = err
		var be *bmc.BMCError
		switch {
		case errors.As(err, &be) && (be.Status == http.StatusUnauthorized || be.Status == http.StatusForbidden) && c.usingBasic():
			// Basic credentials travel with every request: this is the one
			// failed attempt; remember it so the operation tries no more.
			c.mu.Lock()
			scheme := "HTTP Basic"
			if c.scheme == "none" {
				scheme = "no credentials configured"
			}
			if be.Status == http.StatusUnauthorized || c.scheme == "none" {
				c.authErr = fmt.Errorf("redfish: credentials refused by the BMC (%s): %w", scheme, err)
				c.api = nil
				err = c.authErr
			}
			c.mu.Unlock()
			return nil, err
		case errors.As(err, &be) && be.Status == http.StatusUnauthorized && !relogged:
			relogged = true
			if _, lerr := c.relogin(ctx, api); lerr != nil {
				return nil, lerr
			}
			attempt-- // a re-login is not a retry
			continue
		case errors.As(err, &be) && (be.Status == http.StatusServiceUnavailable || be.Status == http.StatusBadGateway || be.Status == http.StatusGatewayTimeout):
			continue // the BMC did not process the request
		case errors.Is(err, bmc.ErrUnreachable) && !o.once && ctx.Err() == nil:
			continue
		}
		return nil, err
	}
	return nil, lastErr
}

// once sends one request through gofish, bounded by cfg.Timeout.
func (c *conn) once(ctx context.Context, api *gofish.APIClient, op, method, path string, body any, o reqOpts) (*response, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	var hdr http.Header
	ctx = context.WithValue(ctx, captureKey{}, &hdr)
	cl := api.WithContext(ctx)
	h := map[string]string{}
	if o.ifMatch != "" {
		h["If-Match"] = o.ifMatch
	}
	var resp *http.Response
	var err error
	switch method {
	case http.MethodGet:
		resp, err = cl.GetWithHeaders(path, h)
	case http.MethodPost:
		resp, err = cl.PostWithHeaders(path, body, h)
	case http.MethodPatch:
		resp, err = cl.PatchWithHeaders(path, body, h)
	case http.MethodDelete:
		resp, err = cl.DeleteWithHeaders(path, h)
	case methodMultipart:
		parts, _ := body.(map[string]io.Reader)
		resp, err = cl.PostMultipartWithHeaders(path, parts, h)
	default:
		return nil, fmt.Errorf("redfish: %s: method %s not supported", op, method)
	}
	if err != nil {
		return nil, classify(c.cfg.Endpoint, op, method+" "+path, err, hdr)
	}
	defer resp.Body.Close()
	raw, err := readBody(resp)
	if err != nil {
		return nil, classify(c.cfg.Endpoint, op, method+" "+path, err, hdr)
	}
	out := &response{status: resp.StatusCode, request: method + " " + path, header: resp.Header}
	if len(raw) > 0 {
		if o.reuse != nil && method == http.MethodGet && resp.StatusCode == http.StatusOK {
			out.body = o.reuse.decode(raw)
		} else {
			out.body = decodeObject(raw)
		}
	}
	return out, nil
}

// methodMultipart makes once POST body (a map[string]io.Reader) as
// multipart/form-data; a *os.File part is sent as a file.
const methodMultipart = "POST-MULTIPART"

// maxBody caps a response body; the largest fixture is far below it.
const maxBody = 8 << 20

// readBody reads resp's body, at most maxBody bytes. When the BMC sent a
// Content-Length within the cap the buffer is made that size at once
// (io.ReadAll grows from 512 bytes by doubling: a 6 KiB System answer
// cost 15 KiB of allocations); a body longer than its Content-Length is
// still read whole, up to the cap.
func readBody(resp *http.Response) ([]byte, error) {
	body := io.LimitReader(resp.Body, maxBody)
	n := resp.ContentLength
	if n <= 0 || n > maxBody {
		return io.ReadAll(body)
	}
	b := make([]byte, 0, n+1) // +1: the read that finds EOF needs no growth
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // longer than announced: grow as io.ReadAll does
		}
		m, err := body.Read(b[len(b):cap(b)])
		b = b[:len(b)+m]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// classify turns a gofish or transport error into a *bmc.BMCError or a
// wrapped sentinel. hdr holds the answer's headers when there was one.
func classify(bmcName, op, request string, err error, hdr http.Header) error {
	if errors.Is(err, ErrSchemeMismatch) {
		return err
	}
	var se *schemas.Error
	if errors.As(err, &se) && se.HTTPReturnedStatusCode == http.StatusBadRequest {
		if e := schemeMismatch(bmcName, nil, se.Message); e != nil {
			return e
		}
	}
	if e := schemeMismatch(bmcName, err, ""); e != nil {
		return e
	}
	if errors.As(err, &se) && se.HTTPReturnedStatusCode != 0 {
		be := &bmc.BMCError{BMC: bmcName, Op: op, Request: request, Status: se.HTTPReturnedStatusCode, Code: se.Code, Message: se.Message}
		if len(se.ExtendedInfos) > 0 {
			ei := se.ExtendedInfos[0]
			if ei.MessageID != "" {
				be.Code = ei.MessageID
			}
			if ei.Message != "" {
				be.Message = ei.Message
			}
		}
		be.Message = sanitize(be.Message)
		switch se.HTTPReturnedStatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			be.Kind = bmc.ErrAuth
		case http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout, http.StatusTooManyRequests:
			be.Kind = bmc.ErrTransient
		case http.StatusMethodNotAllowed, http.StatusNotImplemented:
			be.Kind = bmc.ErrUnsupported
		}
		se2 := &statusError{BMCError: be, after: retryAfter(hdr), header: hdr}
		se2.infos = se.ExtendedInfos
		for _, ei := range se.ExtendedInfos {
			se2.args = append(se2.args, ei.MessageArgs...)
			se2.ids = append(se2.ids, ei.MessageID)
		}
		return se2
	}
	where := op
	if request != "" {
		where += ": " + request
	}
	if bmcName != "" {
		where = bmcName + ": " + where
	}
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("redfish %s: %w", where, err)
	}
	var cve *tls.CertificateVerificationError
	var uae x509.UnknownAuthorityError
	var hne x509.HostnameError
	var cie x509.CertificateInvalidError
	if errors.As(err, &cve) || errors.As(err, &uae) || errors.As(err, &hne) || errors.As(err, &cie) {
		return fmt.Errorf("redfish %s: %w: %s", where, ErrTLS, sanitize(err.Error()))
	}
	var ne net.Error
	var ue *url.Error
	if errors.As(err, &ne) || errors.As(err, &ue) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("redfish %s: %w: %s", where, bmc.ErrUnreachable, sanitize(err.Error()))
	}
	return fmt.Errorf("redfish %s: %s", where, sanitize(err.Error()))
}

// schemeMismatch returns an ErrSchemeMismatch error naming the scheme to
// use when err (a transport error) or body (a 400 answer's text) shows the
// BMC speaks the other scheme on endpoint's port; nil otherwise:
//
//   - https:// to a plain-HTTP port: the TLS ClientHello is answered with
//     "HTTP/..." (net/http: "server gave HTTP response to HTTPS client",
//     or a tls.RecordHeaderError whose header starts "HTTP/");
//   - http:// to a TLS port: the answer is a TLS alert or handshake record
//     (net/http: malformed HTTP response "\x15\x03..."), or a 400 whose
//     text says so (Go's "Client sent an HTTP request to an HTTPS server",
//     nginx's "The plain HTTP request was sent to HTTPS port", Apache's
//     "speaking plain HTTP to an SSL-enabled server port").
//
// Retrying cannot help, so it is detected on the first answer.
func schemeMismatch(endpoint string, err error, body string) error {
	want := ""
	if err != nil {
		var rh tls.RecordHeaderError
		msg := err.Error()
		switch {
		case strings.Contains(msg, "server gave HTTP response to HTTPS client"),
			errors.As(err, &rh) && strings.HasPrefix(string(rh.RecordHeader[:]), "HTTP/"):
			want = "http"
		case strings.Contains(msg, `malformed HTTP response "\x15\x03`), strings.Contains(msg, `malformed HTTP response "\x16\x03`):
			want = "https"
		}
	} else {
		b := strings.ToLower(body)
		if strings.Contains(b, "http request to an https server") || strings.Contains(b, "plain http request was sent to https port") ||
			strings.Contains(b, "speaking plain http to an ssl-enabled server port") {
			want = "https"
		}
	}
	if want == "" {
		return nil
	}
	u, perr := url.Parse(endpoint)
	if perr != nil || u.Host == "" {
		return fmt.Errorf("%w: the BMC speaks %s on this port: use an %s:// address", ErrSchemeMismatch, want, want)
	}
	have := u.Scheme
	u.Scheme = want
	return fmt.Errorf("%w: %s://%s speaks %s, not %s: use %s", ErrSchemeMismatch, have, u.Host, strings.ToUpper(want), strings.ToUpper(have), u.String())
}

// statusError is a *bmc.BMCError with what the driver needs from the
// answer: Retry-After, headers, and the MessageIds and MessageArgs of every
// @Message.ExtendedInfo entry.
type statusError struct {
	*bmc.BMCError
	after  time.Duration
	header http.Header
	ids    []string
	args   []string
	// infos are the @Message.ExtendedInfo entries as sent (per-attribute
	// refusals name the attribute in RelatedProperties or MessageArgs).
	infos []schemas.ErrExtendedInfo
}

func (e *statusError) Unwrap() error { return e.BMCError }

// retryAfter parses Retry-After as delta-seconds (RFC 9110 §10.2.3); dates
// and garbage give 0. Capped at one minute.
func retryAfter(h http.Header) time.Duration {
	if h == nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(h.Get("Retry-After")))
	if err != nil || n < 0 {
		return 0
	}
	return min(time.Duration(n)*time.Second, time.Minute)
}

// backoff is base·2^(attempt-1) with ±50% jitter, capped at 30s, and never
// less than a Retry-After the BMC sent.
func backoff(base time.Duration, attempt int, last error) time.Duration {
	d := base << (attempt - 1)
	if d > 30*time.Second || d <= 0 {
		d = 30 * time.Second
	}
	d = d/2 + time.Duration(rand.Int64N(int64(d)+1))
	var ra *statusError
	if errors.As(last, &ra) && ra.after > d {
		d = ra.after
	}
	return d
}

// sanitize drops anything that looks like a URL query or userinfo from a
// BMC message, so credentials in an echoed image URL never reach logs.
func sanitize(s string) string {
	if len(s) > 512 {
		s = s[:512]
	}
	f := strings.Fields(s)
	for i, w := range f {
		if j := strings.Index(w, "://"); j >= 0 {
			rest := w[j+3:]
			if at := strings.Index(rest, "@"); at >= 0 && at < strings.IndexAny(rest+"/", "/") {
				rest = "<redacted>@" + rest[at+1:]
			}
			if q := strings.IndexAny(rest, "?#"); q >= 0 {
				rest = rest[:q] + "?<redacted>"
			}
			f[i] = w[:j+3] + rest
		}
	}
	return strings.Join(f, " ")
}
