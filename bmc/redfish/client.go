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

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/schemas"

	"github.com/machina-metal/machina/bmc"
)

// response is one decoded Redfish answer.
type response struct {
	status int
	header http.Header
	body   map[string]any // nil when the body is empty or not a JSON object
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
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxBody))
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

// conn is the authenticated gofish client for one BMC: one session, reused,
// re-created on 401, deleted by close. Safe for concurrent use.
type conn struct {
	cfg  *Config
	http *http.Client

	mu    sync.Mutex
	api   *gofish.APIClient
	basic bool // Basic auth fallback in use
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
	return &conn{cfg: cfg, http: &http.Client{Transport: captureTransport{next: rt}}}
}

// login opens a session (POST SessionService/Sessions via gofish), falling
// back to Basic auth when the BMC answers 405, 404, 501 or 503 there.
func (c *conn) login(ctx context.Context) (*gofish.APIClient, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	ctx = context.WithValue(ctx, loginKey{}, true)
	gc := gofish.ClientConfig{
		Endpoint: c.cfg.Endpoint, Username: c.cfg.Username, Password: c.cfg.Password,
		HTTPClient: c.http, NoModifyTransport: true, ReuseConnections: true, BasicAuth: c.basic,
	}
	api, err := gofish.ConnectContext(ctx, gc)
	var se *schemas.Error
	if err != nil && !c.basic && errors.As(err, &se) {
		switch se.HTTPReturnedStatusCode {
		case http.StatusMethodNotAllowed, http.StatusNotFound, http.StatusNotImplemented, http.StatusServiceUnavailable:
			c.cfg.Logger.Debug("redfish sessions unavailable, using basic auth", "status", se.HTTPReturnedStatusCode)
			c.basic = true
			gc.BasicAuth = true
			api, err = gofish.ConnectContext(ctx, gc)
		}
	}
	if err != nil {
		return nil, classify("login", err, nil)
	}
	return api, nil
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
	return c.basic
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
}

// do sends one request with retries: 503/502/504 answers (honouring
// Retry-After) and, unless o.once, connection errors and timeouts are
// retried with exponential backoff and jitter; a 401 re-creates the session
// once. Non-2xx answers become *bmc.BMCError.
func (c *conn) do(ctx context.Context, op, method, path string, body any, o reqOpts) (*response, error) {
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
		case errors.As(err, &be) && be.Status == http.StatusUnauthorized && !relogged && !c.usingBasic():
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
	default:
		return nil, fmt.Errorf("redfish: %s: method %s not supported", op, method)
	}
	if err != nil {
		return nil, classify(op, err, hdr)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, classify(op, err, hdr)
	}
	out := &response{status: resp.StatusCode, header: resp.Header}
	if len(raw) > 0 {
		var m map[string]any
		if json.Unmarshal(raw, &m) == nil {
			out.body = m
		}
	}
	return out, nil
}

// maxBody caps a response body; the largest fixture is far below it.
const maxBody = 8 << 20

// classify turns a gofish or transport error into a *bmc.BMCError or a
// wrapped sentinel. hdr holds the answer's headers when there was one.
func classify(op string, err error, hdr http.Header) error {
	var se *schemas.Error
	if errors.As(err, &se) && se.HTTPReturnedStatusCode != 0 {
		be := &bmc.BMCError{Op: op, Status: se.HTTPReturnedStatusCode, Code: se.Code, Message: se.Message}
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
		for _, ei := range se.ExtendedInfos {
			se2.args = append(se2.args, ei.MessageArgs...)
			se2.ids = append(se2.ids, ei.MessageID)
		}
		return se2
	}
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("redfish: %s: %w", op, err)
	}
	var cve *tls.CertificateVerificationError
	var uae x509.UnknownAuthorityError
	var hne x509.HostnameError
	var cie x509.CertificateInvalidError
	if errors.As(err, &cve) || errors.As(err, &uae) || errors.As(err, &hne) || errors.As(err, &cie) {
		return fmt.Errorf("redfish: %s: %w: %s", op, ErrTLS, sanitize(err.Error()))
	}
	var ne net.Error
	var ue *url.Error
	if errors.As(err, &ne) || errors.As(err, &ue) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("redfish: %s: %w: %s", op, bmc.ErrUnreachable, sanitize(err.Error()))
	}
	return fmt.Errorf("redfish: %s: %s", op, sanitize(err.Error()))
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
