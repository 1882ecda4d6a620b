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

// ErrAgentTokenRefused is returned (wrapped in a *AgentStatusError) when the controller
// answers 401 or 403: the token is wrong, used up or expired.
var ErrAgentTokenRefused = errors.New("token refused")

// AgentStatusError is a non-2xx answer from the controller. Body is the first
// 512 bytes of the response body, for diagnostics only.
type AgentStatusError struct {
	Op   string
	Code int
	Body string
}

func (e *AgentStatusError) Error() string {
	return fmt.Sprintf("%s: HTTP %d: %s", e.Op, e.Code, e.Body)
}

// Unwrap returns ErrAgentTokenRefused for 401 and 403, else nil.
func (e *AgentStatusError) Unwrap() error {
	if e.Code == http.StatusUnauthorized || e.Code == http.StatusForbidden {
		return ErrAgentTokenRefused
	}
	return nil
}

// AgentClient talks to the machine-facing endpoints. The zero value is not
// usable: set BaseURL. Safe for concurrent use if HTTP is.
type AgentClient struct {
	// BaseURL is the controller's base URL, e.g. "http://10.0.0.1:8080".
	BaseURL string
	// HTTP is the client used; nil means http.DefaultClient. Bound requests
	// with the ctx passed to each method.
	HTTP *http.Client
}

func (c *AgentClient) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// URL joins path to BaseURL.
func (c *AgentClient) URL(path string) string {
	return strings.TrimRight(c.BaseURL, "/") + path
}

func (c *AgentClient) do(ctx context.Context, op, method, u, token string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("%s: encode: %w", op, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return &AgentStatusError{Op: op, Code: resp.StatusCode, Body: strings.TrimSpace(string(b))}
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	dec := json.NewDecoder(io.LimitReader(resp.Body, MaxReportBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return fmt.Errorf("%s: decode: %w", op, err)
	}
	return nil
}

// Report posts r with the single-use commissioning token.
func (c *AgentClient) Report(ctx context.Context, token string, r AgentReport) (ReportAck, error) {
	var ack ReportAck
	err := c.do(ctx, "post report", http.MethodPost, c.URL(PathAgentReport), token, r, &ack)
	return ack, err
}

// Plan fetches the deploy plan with the single-use deploy token.
func (c *AgentClient) Plan(ctx context.Context, token string) (Plan, error) {
	var p Plan
	err := c.do(ctx, "get plan", http.MethodGet, c.URL(PathAgentPlan), token, nil, &p)
	return p, err
}

// Done posts the deploy outcome with the plan's DoneToken.
func (c *AgentClient) Done(ctx context.Context, token string, r DeployResult) error {
	return c.do(ctx, "post done", http.MethodPost, c.URL(PathAgentDone), token, r, nil)
}

// Progress posts how far a long deploy step is, with the plan's
// ImageToken. A 429 (reported sooner than the controller takes) is an
// *AgentStatusError like any refusal.
func (c *AgentClient) Progress(ctx context.Context, token string, p Progress) error {
	return c.do(ctx, "post progress", http.MethodPost, c.URL(PathAgentProgress), token, p, nil)
}

// WipePlan fetches the release wipe plan with the single-use wipe token.
func (c *AgentClient) WipePlan(ctx context.Context, token string) (WipePlan, error) {
	var p WipePlan
	err := c.do(ctx, "get wipe plan", http.MethodGet, c.URL(PathAgentWipe), token, nil, &p)
	return p, err
}

// Wiped posts the wipe outcome with the wipe plan's DoneToken.
func (c *AgentClient) Wiped(ctx context.Context, token string, r WipeResult) error {
	return c.do(ctx, "post wiped", http.MethodPost, c.URL(PathAgentWiped), token, r, nil)
}

// Payload opens a GET of n throughput-test bytes. The caller closes the body.
func (c *AgentClient) Payload(ctx context.Context, token string, n int64) (io.ReadCloser, error) {
	u := c.URL(PathAgentPayload) + "?bytes=" + strconv.FormatInt(n, 10)
	return c.Open(ctx, "get payload", u, token)
}

// Open issues an authorised GET of an absolute URL (the image) and returns
// the body of a 200 answer. Only http and https URLs are accepted.
func (c *AgentClient) Open(ctx context.Context, op, rawURL, token string) (io.ReadCloser, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%s: invalid URL", op)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, &AgentStatusError{Op: op, Code: resp.StatusCode, Body: strings.TrimSpace(string(b))}
	}
	return resp.Body, nil
}
