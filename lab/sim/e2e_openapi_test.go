package sim_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"
	verrors "github.com/pb33f/libopenapi-validator/errors"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/bmc/bmcsim"
	"github.com/machina-metal/machina/controller"
	"github.com/machina-metal/machina/discover"
	"github.com/machina-metal/machina/lab/sim"
	"github.com/machina-metal/machina/state"
)

// openAPIClient sends admin API requests to the running controller and
// validates each request and its answer against the OpenAPI document,
// recording which statuses each route pattern answered.
type openAPIClient struct {
	t      *testing.T
	base   string
	v      validator.Validator
	tokens map[state.Role]string
	seen   map[string][]int // pattern → statuses answered (and validated)
	// probe: the requests are deliberately outside the document (no
	// token, a placeholder body): only their answers are validated.
	probe bool
}

var wildcardRE = regexp.MustCompile(`\{[^}]+\}`)

// call sends method path (the pattern with its wildcards filled by args,
// in order) with body (JSON-encoded unless nil) and the token of role
// ("" sends none), validates request and answer, and returns the status
// and body. A stream (text/event-stream) is read for at most what
// streamRead returns, then cancelled.
func (c *openAPIClient) call(role state.Role, pattern string, query string, body any, args ...string) (int, []byte) {
	c.t.Helper()
	method, path, _ := strings.Cut(pattern, " ")
	i := 0
	path = wildcardRE.ReplaceAllStringFunc(path, func(string) string {
		a := url.PathEscape(args[i])
		i++
		return a
	})
	if query != "" {
		path += "?" + query
	}
	var raw []byte
	if body != nil {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			c.t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	newReq := func() *http.Request {
		req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(raw))
		if err != nil {
			c.t.Fatal(err)
		}
		if body == nil {
			req.Body, req.ContentLength = http.NoBody, 0
		} else {
			req.Header.Set("Content-Type", "application/json")
		}
		if role != "" {
			req.Header.Set("Authorization", "Bearer "+c.tokens[role])
		}
		return req
	}
	resp, err := http.DefaultClient.Do(newReq())
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var got []byte
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		got = readEvents(c.t, resp.Body, 3)
		cancel()
	} else if got, err = io.ReadAll(resp.Body); err != nil {
		c.t.Fatalf("%s %s: read: %v", method, path, err)
	}
	if ok, errs := c.v.ValidateHttpRequest(newReq()); !ok && !c.probe {
		for _, e := range errs {
			c.t.Errorf("%s %s as %q: request does not match the document: %s (%s)%s", method, path, role, e.Message, e.Reason, failures(e))
		}
	}
	check := *resp
	check.Body = io.NopCloser(bytes.NewReader(got))
	if ok, errs := c.v.ValidateHttpResponse(newReq(), &check); !ok {
		for _, e := range errs {
			c.t.Errorf("%s %s as %q: answer %d does not match the document: %s (%s)%s\n%s", method, path, role, resp.StatusCode, e.Message, e.Reason, failures(e), trim(got))
		}
	}
	c.seen[pattern] = append(c.seen[pattern], resp.StatusCode)
	return resp.StatusCode, got
}

// want is call that also requires the status code.
func (c *openAPIClient) want(code int, role state.Role, pattern, query string, body any, args ...string) []byte {
	c.t.Helper()
	got, b := c.call(role, pattern, query, body, args...)
	if got != code {
		c.t.Errorf("%s as %q (%v): %d, want %d: %s", pattern, role, args, got, code, trim(b))
	}
	return b
}

// failures lists a validation error's schema failures (where and why).
func failures(e *verrors.ValidationError) string {
	var b strings.Builder
	for _, f := range e.SchemaValidationErrors {
		fmt.Fprintf(&b, "\n\t%s: %s", f.FieldPath, f.Reason)
	}
	return b.String()
}

func trim(b []byte) string {
	if len(b) > 600 {
		return string(b[:600]) + "..."
	}
	return string(b)
}

// readEvents reads an SSE stream until n events ("data:" lines) came.
func readEvents(t *testing.T, r io.Reader, n int) []byte {
	t.Helper()
	var out bytes.Buffer
	buf := make([]byte, 4096)
	for strings.Count(out.String(), "\ndata: ")+boolInt(strings.HasPrefix(out.String(), "data: ")) < n {
		k, err := r.Read(buf)
		out.Write(buf[:k])
		if err != nil {
			t.Fatalf("event stream ended after %q: %v", out.String(), err)
		}
	}
	return out.Bytes()
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestOpenAPIRoundTrip drives every admin route of a running controller
// (the example site, steady, with joined hypervisors) with real requests
// and validates each request and each answer against the OpenAPI document
// the controller serves (libopenapi-validator, JSON Schema 2020-12, with
// format assertions): each route's success, a 401 without a token, for
// each route above viewer a 403 naming its role to a viewer's token, and
// the errors the flow meets (a 404, 409s). A route the controller serves
// behind an admin token that the test did not drive fails it.
func TestOpenAPIRoundTrip(t *testing.T) {
	// POST /api/v1/scan refuses loopback ranges: the controller's scan
	// sends the request's private range 10.0.40.0/30 to a simulated iDRAC9
	// (Redfish over HTTPS) on loopback instead, nowhere else.
	var trees bmcsim.Trees
	tree, err := bmcsim.TreeDir("", "dell-poweredge-r750-idrac9")
	if err != nil {
		t.Fatal(err)
	}
	labCfg := sim.Config{Username: "admin", Password: "openapi-sim"}
	idrac, err := trees.New(tree, bmcsim.Config{Username: labCfg.Username, Password: labCfg.Password})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewTLSServer(idrac)
	t.Cleanup(ts.Close)
	r := startRig(t, rigOptions{lab: labCfg, config: func(c *controller.Config) {
		c.Scan = func(ctx context.Context, cfg discover.Config) (*discover.Report, error) {
			if cfg.CIDR == "10.0.40.0/30" {
				cfg.AllowLoopback, cfg.Targets = true, []string{ts.Listener.Addr().String()}
			}
			return discover.Scan(ctx, cfg)
		}
	}})
	snap := r.steady()
	tokens := map[state.Role]string{}
	for _, role := range state.Roles() {
		tok, _, err := r.run.Store.CreateAdminTokenRole("openapi-"+string(role), role, state.ActorLocal)
		if err != nil {
			t.Fatal(err)
		}
		tokens[role] = tok
	}

	// The document the controller serves is the embedded one, and a valid
	// OpenAPI 3.1 document.
	req, _ := http.NewRequest(http.MethodGet, r.run.URL+"/api/v1/openapi.json", nil)
	req.Header.Set("Authorization", "Bearer "+tokens[state.RoleViewer])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	served, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Equal(served, api.OpenAPI()) {
		t.Fatalf("GET /api/v1/openapi.json: %s, %d bytes; want the %d embedded", resp.Status, len(served), len(api.OpenAPI()))
	}
	doc, err := libopenapi.NewDocument(served)
	if err != nil {
		t.Fatal(err)
	}
	v, errs := validator.NewValidator(doc, config.WithFormatAssertions(), config.WithRejectUndeclaredRequestBody())
	if len(errs) > 0 {
		t.Fatalf("validator: %v", errs)
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		for _, e := range verrs {
			t.Errorf("the document is not valid OpenAPI 3.1: %s (%s)", e.Message, e.Reason)
		}
		t.FailNow()
	}
	c := &openAPIClient{t: t, base: r.run.URL, v: v, tokens: tokens, seen: map[string][]int{}}
	const (
		viewer, operator, admin = state.RoleViewer, state.RoleOperator, state.RoleAdmin
	)

	// Reads.
	c.want(200, viewer, "GET /api/v1/status", "", nil)
	c.want(200, viewer, "GET /api/v1/openapi.json", "", nil)
	var page v1.ServerList
	if err := json.Unmarshal(c.want(200, viewer, "GET /api/v1/servers", "limit=5", nil), &page); err != nil || len(page.Servers) != 5 || page.Next == "" {
		t.Fatalf("servers page: %+v %v", page, err)
	}
	c.want(200, viewer, "GET /api/v1/servers", "lifecycle=deployed&after="+page.Next, nil)
	c.want(400, viewer, "GET /api/v1/servers", "lifecycle=sleeping", nil)
	// A deployed server to read; ready ones outside zone-a (the
	// hypervisors' zone, which the provision below needs) to retire: three
	// through the inventory (the safety brake holds them: 3 of 12 is over
	// its 20%), one through the API.
	var deployed string
	var ready []string
	for _, n := range slices.Sorted(maps.Keys(snap.Servers)) {
		switch s := record(snap, n); {
		case s.Lifecycle == state.LifecycleDeployed:
			deployed = n
		case s.Lifecycle == state.LifecycleReady && s.Zone != "zone-a":
			ready = append(ready, n)
		}
	}
	if deployed == "" || len(ready) < 4 {
		t.Fatalf("example site: deployed %q, ready outside zone-a %v", deployed, ready)
	}
	c.want(200, viewer, "GET /api/v1/servers/{name}", "", nil, deployed)
	c.want(404, viewer, "GET /api/v1/servers/{name}", "", nil, "no-such-server")
	c.want(200, viewer, "GET /api/v1/servers/{name}/events", "after=0&limit=20", nil, deployed)
	// The example site's profiles carry no firmware block, so nothing read
	// its BMC's firmware; record a read (its shape is what the BMC sweep
	// and the firmware step write: reconciler.ReadFirmware, tested against
	// the vendor trees there) to check the route's answer on the wire.
	if _, err := r.run.Store.UpdateServer(deployed, func(s *state.Server) error {
		s.Firmware = &state.Firmware{ReadAt: time.Now().UTC(),
			Components:  []state.FirmwareComponent{{ID: "BIOS", Name: "BIOS", Version: "2.19.1", Updateable: true}},
			SecureBoot:  &state.SecureBootState{Enable: true, CurrentBoot: "Enabled"},
			Unsupported: map[string]string{state.FirmwareAreaRAID: "no Storage controllers"}}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	c.want(200, viewer, "GET /api/v1/servers/{name}/firmware", "", nil, deployed)
	c.want(404, viewer, "GET /api/v1/servers/{name}/firmware", "", nil, "no-such-server")
	c.want(200, viewer, "GET /api/v1/events", "limit=50", nil)
	c.want(400, viewer, "GET /api/v1/events", "limit=0", nil)
	c.want(200, viewer, "GET /api/v1/events/stream", "after=0", nil)
	c.want(200, viewer, "GET /api/v1/plan", "", nil)
	c.want(200, viewer, "GET /api/v1/inventory", "", nil)
	c.want(200, viewer, "GET /api/v1/approvals", "", nil)
	c.want(200, viewer, "GET /api/v1/images", "", nil)
	c.want(200, viewer, "GET /api/v1/join/info", "", nil)

	// Operator's moves.
	c.want(202, operator, "POST /api/v1/reconcile", "", nil)
	c.want(409, operator, "POST /api/v1/approve", "", v1.ApproveRequest{Revision: "0123456789abcdef"})
	r.commit("retire three servers", func(dir string) {
		for _, v := range ready[:3] {
			r.setServer(dir, v, "want", "retired")
		}
	})
	r.waitFor("retirements held", time.Minute, func(state.Snapshot) bool { return len(r.run.Reconciler.LastPlan().Held) == 3 })
	var held struct {
		Held []json.RawMessage `json:"held"`
	}
	if err := json.Unmarshal(c.want(200, viewer, "GET /api/v1/plan", "", nil), &held); err != nil || len(held.Held) != 3 {
		t.Errorf("plan while held: %d held, %v", len(held.Held), err)
	}
	c.want(200, viewer, "GET /api/v1/inventory", "", nil)
	digest := strings.TrimPrefix(r.run.Reconciler.Desired().Digest, "sha256:")
	c.want(400, operator, "POST /api/v1/approve", "", v1.ApproveRequest{Revision: "not-hex"})
	c.want(200, operator, "POST /api/v1/approve", "", v1.ApproveRequest{Revision: digest[:12]})
	c.want(200, viewer, "GET /api/v1/approvals", "", nil)
	retired := count(snap, state.LifecycleRetired)
	r.waitFor("3 more retired", time.Minute, func(s state.Snapshot) bool { return count(s, state.LifecycleRetired) == retired+3 })
	c.want(200, operator, "POST /api/v1/servers/{name}/transitions", "", v1.TransitionRequest{From: "ready", To: "retired", Reason: "openapi round trip"}, ready[3])
	c.want(409, operator, "POST /api/v1/servers/{name}/transitions", "", v1.TransitionRequest{From: "ready", To: "retired", Reason: "stale"}, ready[3])
	var prov v1.ProvisionResponse
	if err := json.Unmarshal(c.want(200, operator, "POST /api/v1/provision", "", v1.ProvisionRequest{Profile: "hypervisor", Count: 1}), &prov); err != nil || len(prov.Servers) != 1 {
		t.Errorf("provision: %+v %v", prov, err)
	}
	c.want(409, operator, "POST /api/v1/provision", "", v1.ProvisionRequest{Profile: "hypervisor", Count: 50})

	// Hosts: the example's hypervisors join; fence one through its BMC
	// and lift the fence.
	var hosts v1.HostList
	r.waitFor("a joined host", time.Minute, func(state.Snapshot) bool {
		if err := json.Unmarshal(c.want(200, viewer, "GET /api/v1/hosts", "", nil), &hosts); err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(hosts.Items, func(h v1.Host) bool { return h.Server != "" })
	})
	host := hosts.Items[slices.IndexFunc(hosts.Items, func(h v1.Host) bool { return h.Server != "" })].Name
	c.want(200, operator, "POST /api/v1/hosts/{name}/fence", "", v1.FenceRequest{Reason: "openapi round trip"}, host)
	c.want(200, operator, "POST /api/v1/hosts/{name}/unfence", "", v1.FenceRequest{Reason: "openapi round trip done"}, host)
	c.want(409, operator, "POST /api/v1/hosts/{name}/unfence", "", v1.FenceRequest{Reason: "again"}, host)
	c.want(404, operator, "POST /api/v1/hosts/{name}/fence", "", v1.FenceRequest{Reason: "no such host"}, "no-such-host")
	c.want(400, operator, "POST /api/v1/hosts/{name}/fence", "", v1.FenceRequest{}, host)

	// Admin's.
	c.want(201, admin, "POST /api/v1/join/tokens", "", v1.EnrolmentRequest{TTL: "1h"})
	c.want(200, admin, "PUT /api/v1/secrets/{name}", "", v1.SecretRequest{Username: "u", Password: "p"}, "openapi-secret")
	c.want(200, admin, "GET /api/v1/secrets", "", nil)
	c.want(204, admin, "DELETE /api/v1/secrets/{name}", "", nil, "openapi-secret")
	c.want(404, admin, "DELETE /api/v1/secrets/{name}", "", nil, "openapi-secret")
	c.want(201, admin, "POST /api/v1/admin-tokens", "", v1.AdminTokenRequest{Name: "openapi-extra", Role: "viewer"})
	c.want(409, admin, "POST /api/v1/admin-tokens", "", v1.AdminTokenRequest{Name: "openapi-extra"})
	c.want(200, admin, "GET /api/v1/admin-tokens", "", nil)
	c.want(204, admin, "DELETE /api/v1/admin-tokens/{name}", "", nil, "openapi-extra")
	c.want(404, admin, "DELETE /api/v1/admin-tokens/{name}", "", nil, "openapi-extra")
	c.want(200, admin, "GET /api/v1/state/snapshot", "", nil)
	// A scan finding one Redfish BMC, proposed for the inventory.
	var scan struct {
		Results []struct {
			Status string `json:"status"`
		} `json:"results"`
		Registered *struct {
			Added []json.RawMessage `json:"added"`
		} `json:"registered"`
	}
	if err := json.Unmarshal(c.want(200, admin, "POST /api/v1/scan", "", v1.ScanRequest{CIDR: "10.0.40.0/30", Credentials: []string{"bmc-redfish"},
		InsecureTLS: true, Register: true, Zone: "zone-d"}), &scan); err != nil || len(scan.Results) != 1 || scan.Results[0].Status != "authenticated" || scan.Registered == nil || len(scan.Registered.Added) != 1 {
		t.Errorf("scan: %+v %v", scan, err)
	}
	c.want(400, admin, "POST /api/v1/scan", "", v1.ScanRequest{CIDR: "not-a-cidr", Credentials: []string{"bmc-redfish"}})

	// Every route: 401 without a token; 403 naming the role to a token
	// below it.
	routes := r.run.AdminRoutes
	c.probe = true
	for _, p := range routes {
		need, _ := api.RouteRole(p)
		args := make([]string, strings.Count(p, "{"))
		for i := range args {
			args[i] = "x"
		}
		var body any
		if strings.HasPrefix(p, "POST") || strings.HasPrefix(p, "PUT") {
			body = map[string]any{}
		}
		c.want(401, "", p, "", nil, args...)
		if need != viewer {
			low := viewer
			if need == admin {
				low = operator
			}
			var e v1.Error
			if err := json.Unmarshal(c.want(403, low, p, "", body, args...), &e); err != nil || e.Role != string(need) {
				t.Errorf("%s as %s: 403 %+v, want role %s", p, low, e, need)
			}
		}
	}

	// Every admin route was driven to a success (2xx).
	var lines []string
	for _, p := range routes {
		ok := slices.ContainsFunc(c.seen[p], func(code int) bool { return code >= 200 && code < 300 })
		if !ok {
			t.Errorf("%s: no successful request in the round trip (answers %v): drive it", p, c.seen[p])
		}
		lines = append(lines, fmt.Sprintf("%s %v", p, c.seen[p]))
	}
	sort.Strings(lines)
	n := 0
	for _, s := range c.seen {
		n += len(s)
	}
	t.Logf("%d admin routes, %d requests validated:\n%s", len(routes), n, strings.Join(lines, "\n"))
}
