package uitest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// APITarget is a Target for a controller running in another process
// (`machina sim` once it exists): transitions go through the admin API's
// POST /api/v1/servers/{name}/transitions with the admin token.
type APITarget struct {
	BaseURL    string       // e.g. "http://127.0.0.1:8080"
	AdminToken string       // an admin token of that controller
	Client     *http.Client // nil means a client with a 10s timeout
}

// URL implements Target.
func (a *APITarget) URL() string { return a.BaseURL }

// Token implements Target.
func (a *APITarget) Token() string { return a.AdminToken }

// Transition implements Target. Errors carry the API's status and message.
func (a *APITarget) Transition(ctx context.Context, server, from, to, reason string) error {
	body, err := json.Marshal(map[string]string{"from": from, "to": to, "reason": reason})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.BaseURL+"/api/v1/servers/"+server+"/transitions", bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("uitest: transition %s: %w", server, err)
	}
	req.Header.Set("Authorization", "Bearer "+a.AdminToken)
	req.Header.Set("Content-Type", "application/json")
	c := a.Client
	if c == nil {
		c = &http.Client{Timeout: 10 * time.Second}
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("uitest: transition %s: %w", server, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("uitest: transition %s %s→%s: HTTP %d: %s", server, from, to, resp.StatusCode, bytes.TrimSpace(msg))
	}
	return nil
}
