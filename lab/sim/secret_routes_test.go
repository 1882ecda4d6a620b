package sim_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/state"
)

// TestSecretNeverInAnyRoute: no route of the muxes `machina serve` builds
// (controller.Run: the admin API, the reconciler's admin routes, the
// machine-facing and boot endpoints, images, the console, every web
// console route, and the join listener) answers with a secret, whether
// asked with an admin token and a UI session, with nothing, or with the
// secret itself as the bearer token and in the body (error paths). The
// secrets: the simulated BMCs' password (stored as bmc-redfish) and a
// known extra one. api.TestSecretNeverInResponses covers the api
// package's own routes in depth; before this test nothing covered the
// routes mounted by the controller, the UI or the join listener.
func TestSecretNeverInAnyRoute(t *testing.T) {
	r := startRig(t, rigOptions{})
	const known = "Kn0wn-S3cret-for-the-route-sweep"
	if _, err := r.run.Store.PutSecret("leak-test", state.Credential{Username: "leak", Password: known}, "test"); err != nil {
		t.Fatal(err)
	}
	_, bmcPass := r.lab.Credentials()
	secrets := []string{known, bmcPass}
	snap := r.waitFor("servers registered", time.Minute, func(s state.Snapshot) bool { return len(s.Servers) > 0 })
	var server string
	for name := range snap.Servers {
		server = name
		break
	}
	tok, _, err := r.run.Store.CreateAdminToken("route-sweep", "test")
	if err != nil {
		t.Fatal(err)
	}
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar, Timeout: 5 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // the join listener's CA is pinned by fingerprint elsewhere; loopback only
	// A UI session, so the pages render with data instead of redirecting.
	form := url.Values{"token": {tok}}
	req, _ := http.NewRequest(http.MethodPost, r.run.URL+"/ui/login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", r.run.URL)
	if resp, err := hc.Do(req); err != nil || resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("UI login: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	wild := regexp.MustCompile(`\{[^}]*\}`)
	type target struct{ base, pattern string }
	var targets []target
	for _, p := range r.run.Routes {
		targets = append(targets, target{r.run.URL, p})
	}
	for _, p := range r.run.JoinRoutes {
		targets = append(targets, target{r.run.JoinURL, p})
	}
	// Logging out ends the session: last.
	sort.SliceStable(targets, func(i, j int) bool {
		return !strings.Contains(targets[i].pattern, "logout") && strings.Contains(targets[j].pattern, "logout")
	})
	if len(targets) < 40 {
		t.Fatalf("only %d routes: %v", len(targets), targets)
	}
	covered := map[string]bool{}
	for _, tg := range targets {
		method, path, ok := strings.Cut(tg.pattern, " ")
		if !ok {
			method, path = http.MethodGet, tg.pattern
		}
		path = strings.ReplaceAll(path, "{$}", "")
		path = wild.ReplaceAllStringFunc(path, func(w string) string {
			if w == "{name}" {
				return server
			}
			return "x"
		})
		if strings.HasSuffix(path, "/") && path != "/ui/" {
			path += "x"
		}
		for _, mode := range []string{"admin", "none", "secret"} {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			var body io.Reader
			if method != http.MethodGet {
				body = strings.NewReader(fmt.Sprintf(`{"password":%q,"revision":%q,"name":%q}`, known, known, known))
			}
			req, _ := http.NewRequestWithContext(ctx, method, tg.base+path, body)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Origin", tg.base)
			c := hc
			switch mode {
			case "admin":
				req.Header.Set("Authorization", "Bearer "+tok)
			case "none":
				c = &http.Client{Timeout: 5 * time.Second, Transport: hc.Transport, CheckRedirect: hc.CheckRedirect}
			case "secret":
				req.Header.Set("Authorization", "Bearer "+known)
				c = &http.Client{Timeout: 5 * time.Second, Transport: hc.Transport, CheckRedirect: hc.CheckRedirect}
			}
			resp, err := c.Do(req)
			if err != nil {
				cancel()
				t.Errorf("%s %s (%s): %v", method, path, mode, err)
				continue
			}
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20)) // streams end at the 3 s deadline
			resp.Body.Close()
			cancel()
			covered[tg.pattern] = true
			for _, s := range secrets {
				if strings.Contains(string(b), s) {
					t.Errorf("%s %s (%s, %d): body carries a secret", method, path, mode, resp.StatusCode)
				}
				for k, vs := range resp.Header {
					if strings.Contains(strings.Join(vs, " "), s) {
						t.Errorf("%s %s (%s): header %s carries a secret", method, path, mode, k)
					}
				}
			}
		}
	}
	for _, must := range []string{"GET /ui/{$}", "GET /ui/servers/{name}", "POST /hosts/join", "GET /api/v1/images", "POST /api/v1/approve"} {
		if !covered[must] {
			t.Errorf("route %q not covered (routes: %v)", must, targets)
		}
	}
	t.Logf("%d routes, 3 requests each, no secret in any answer", len(covered))
}
