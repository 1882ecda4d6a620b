package v1

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Client calls the admin API. The zero HTTP means http.DefaultClient.
// Safe for concurrent use.
type Client struct {
	base  *url.URL
	token string
	// HTTP is the client used for requests; nil means http.DefaultClient.
	HTTP *http.Client
}

// APIError is a non-2xx answer: the HTTP status and the decoded Error body.
type APIError struct {
	StatusCode int
	Body       Error
}

// Error names the status, code and message, and the current lifecycle on a 409.
func (e *APIError) Error() string {
	if e.Body.Lifecycle != "" {
		return fmt.Sprintf("api: %d %s: %s (current lifecycle %s)", e.StatusCode, e.Body.Code, e.Body.Message, e.Body.Lifecycle)
	}
	return fmt.Sprintf("api: %d %s: %s", e.StatusCode, e.Body.Code, e.Body.Message)
}

// NewClient returns a client for the API at baseURL (http or https, e.g.
// http://127.0.0.1:8080) authenticating with the admin bearer token.
func NewClient(baseURL, token string) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("api: base URL %q: want http(s)://host[:port]", baseURL)
	}
	if u.User != nil || u.RawQuery != "" {
		return nil, fmt.Errorf("api: base URL must not carry credentials or a query")
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	return &Client{base: u, token: token}, nil
}

// ListServersOptions filter and page ListServers; zero values mean none.
type ListServersOptions struct {
	Zone      string
	Lifecycle string
	After     string
	Limit     int
}

// ListServers calls GET /api/v1/servers.
func (c *Client) ListServers(ctx context.Context, o ListServersOptions) (ServerList, error) {
	q := url.Values{}
	setIf(q, "zone", o.Zone)
	setIf(q, "lifecycle", o.Lifecycle)
	setIf(q, "after", o.After)
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	var out ServerList
	return out, c.do(ctx, http.MethodGet, "/api/v1/servers", q, nil, &out)
}

// Server calls GET /api/v1/servers/{name}.
func (c *Client) Server(ctx context.Context, name string) (Server, error) {
	var out Server
	return out, c.do(ctx, http.MethodGet, "/api/v1/servers/"+url.PathEscape(name), nil, nil, &out)
}

// ServerEvents calls GET /api/v1/servers/{name}/events.
func (c *Client) ServerEvents(ctx context.Context, name string, after uint64, limit int) (EventList, error) {
	var out EventList
	return out, c.do(ctx, http.MethodGet, "/api/v1/servers/"+url.PathEscape(name)+"/events", pageQuery(after, limit), nil, &out)
}

// Events calls GET /api/v1/events.
func (c *Client) Events(ctx context.Context, after uint64, limit int) (EventList, error) {
	var out EventList
	return out, c.do(ctx, http.MethodGet, "/api/v1/events", pageQuery(after, limit), nil, &out)
}

// Transition calls POST /api/v1/servers/{name}/transitions. A refused move
// is an *APIError with StatusCode 409 and Body.Lifecycle set.
func (c *Client) Transition(ctx context.Context, name string, req TransitionRequest) (Server, error) {
	var out Server
	return out, c.do(ctx, http.MethodPost, "/api/v1/servers/"+url.PathEscape(name)+"/transitions", nil, req, &out)
}

// PutSecret calls PUT /api/v1/secrets/{name}. The answer describes the
// stored secret without its value.
func (c *Client) PutSecret(ctx context.Context, name string, req SecretRequest) (Secret, error) {
	var out Secret
	return out, c.do(ctx, http.MethodPut, "/api/v1/secrets/"+url.PathEscape(name), nil, req, &out)
}

// Secrets calls GET /api/v1/secrets.
func (c *Client) Secrets(ctx context.Context) (SecretList, error) {
	var out SecretList
	return out, c.do(ctx, http.MethodGet, "/api/v1/secrets", nil, nil, &out)
}

// DeleteSecret calls DELETE /api/v1/secrets/{name}.
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/api/v1/secrets/"+url.PathEscape(name), nil, nil, nil)
}

// Status calls GET /api/v1/status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var out Status
	return out, c.do(ctx, http.MethodGet, "/api/v1/status", nil, nil, &out)
}

// Provision calls POST /api/v1/provision. Too few fitting ready servers is
// an *APIError with StatusCode 409 and Code CodeInsufficientCapacity.
func (c *Client) Provision(ctx context.Context, req ProvisionRequest) (ProvisionResponse, error) {
	var out ProvisionResponse
	return out, c.do(ctx, http.MethodPost, "/api/v1/provision", nil, req, &out)
}

// Approve calls POST /api/v1/approve for the held plan of an inventory
// revision (its digest's first 12 to 64 hex digits).
func (c *Client) Approve(ctx context.Context, revision string) (ApproveResponse, error) {
	var out ApproveResponse
	err := c.do(ctx, http.MethodPost, "/api/v1/approve", nil, ApproveRequest{Revision: revision}, &out)
	return out, err
}

// Images calls GET /api/v1/images: the controller's images (the acting
// inventory's and its store's) with their import state.
func (c *Client) Images(ctx context.Context) (ImageList, error) {
	var out ImageList
	err := c.do(ctx, http.MethodGet, "/api/v1/images", nil, nil, &out)
	return out, err
}

// Reconcile calls POST /api/v1/reconcile: poll Git and plan now.
func (c *Client) Reconcile(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/api/v1/reconcile", nil, nil, nil)
}

// GetJSON calls GET on an admin route whose answer type lives outside v1
// (GET /api/v1/plan, GET /api/v1/inventory: the reconciler's types) and
// decodes the JSON answer into out. path starts with "/api/v1/" and is
// used as is (no query).
func (c *Client) GetJSON(ctx context.Context, path string, out any) error {
	if !strings.HasPrefix(path, "/api/v1/") {
		return fmt.Errorf("api: GET %s: path must start with /api/v1/", path)
	}
	return c.do(ctx, http.MethodGet, path, nil, nil, out)
}

// Health calls GET /healthz (no token needed).
func (c *Client) Health(ctx context.Context) (Health, error) {
	var out Health
	return out, c.do(ctx, http.MethodGet, "/healthz", nil, nil, &out)
}

func pageQuery(after uint64, limit int) url.Values {
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.FormatUint(after, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	return q
}

func setIf(q url.Values, k, v string) {
	if v != "" {
		q.Set(k, v)
	}
}

// maxResponse bounds a response body the client reads (64 MiB).
const maxResponse = 64 << 20

func (c *Client) do(ctx context.Context, method, path string, q url.Values, in, out any) error {
	// path arrives with its segments already escaped (url.PathEscape).
	u := *c.base
	u.RawPath = c.base.EscapedPath() + path
	unescaped, err := url.PathUnescape(u.RawPath)
	if err != nil {
		return fmt.Errorf("api: %s %s: %w", method, path, err)
	}
	u.Path = unescaped
	u.RawQuery = q.Encode()
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("api: %s %s: encode: %w", method, path, err)
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return fmt.Errorf("api: %s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("api: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return fmt.Errorf("api: %s %s: read: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		e := &APIError{StatusCode: resp.StatusCode}
		if json.Unmarshal(data, &e.Body) != nil || e.Body.Code == "" {
			e.Body = Error{Message: http.StatusText(resp.StatusCode), Code: "http_" + strconv.Itoa(resp.StatusCode)}
		}
		return e
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("api: %s %s: decode: %w", method, path, err)
	}
	return nil
}

// IsCode reports whether err is an *APIError with the given Error.Code.
func IsCode(err error, code string) bool {
	var e *APIError
	return errors.As(err, &e) && e.Body.Code == code
}

// AdminTokens calls GET /api/v1/admin-tokens.
func (c *Client) AdminTokens(ctx context.Context) (AdminTokenList, error) {
	var out AdminTokenList
	return out, c.do(ctx, http.MethodGet, "/api/v1/admin-tokens", nil, nil, &out)
}

// CreateAdminToken calls POST /api/v1/admin-tokens; the answer holds the
// token's value, shown this once.
func (c *Client) CreateAdminToken(ctx context.Context, name string) (AdminTokenCreated, error) {
	var out AdminTokenCreated
	return out, c.do(ctx, http.MethodPost, "/api/v1/admin-tokens", nil, AdminTokenRequest{Name: name}, &out)
}

// CreateAdminTokenRole is CreateAdminToken with the token's role
// (viewer, operator or admin; "" means admin).
func (c *Client) CreateAdminTokenRole(ctx context.Context, name, role string) (AdminTokenCreated, error) {
	var out AdminTokenCreated
	return out, c.do(ctx, http.MethodPost, "/api/v1/admin-tokens", nil, AdminTokenRequest{Name: name, Role: role}, &out)
}

// RevokeAdminToken calls DELETE /api/v1/admin-tokens/NAME.
func (c *Client) RevokeAdminToken(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/api/v1/admin-tokens/"+url.PathEscape(name), nil, nil, nil)
}

// Approvals calls GET /api/v1/approvals.
func (c *Client) Approvals(ctx context.Context) (ApprovalList, error) {
	var out ApprovalList
	return out, c.do(ctx, http.MethodGet, "/api/v1/approvals", nil, nil, &out)
}

// Snapshot calls GET /api/v1/state/snapshot and copies the state file's
// online copy to w, returning the bytes written. It fails when the answer
// is shorter than its Content-Length (the controller's read was cut), so
// a partial copy is never mistaken for a backup.
func (c *Client) Snapshot(ctx context.Context, w io.Writer) (int64, error) {
	u := *c.base
	u.Path = strings.TrimSuffix(c.base.Path, "/") + "/api/v1/state/snapshot"
	u.RawPath = ""
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return 0, fmt.Errorf("api: snapshot: %w", err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("api: snapshot: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
		e := &APIError{StatusCode: resp.StatusCode}
		if json.Unmarshal(data, &e.Body) != nil || e.Body.Code == "" {
			e.Body = Error{Message: http.StatusText(resp.StatusCode), Code: "http_" + strconv.Itoa(resp.StatusCode)}
		}
		return 0, e
	}
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("api: snapshot: read: %w", err)
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return n, fmt.Errorf("api: snapshot: got %d of %d bytes", n, resp.ContentLength)
	}
	return n, nil
}
