package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
)

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type fixture struct {
	store  *state.Store
	api    *api.Server
	srv    *httptest.Server
	token  string
	client *v1.Client
	logs   *syncBuffer
}

func newFixture(t testing.TB, opts state.Options) *fixture {
	t.Helper()
	logs := &syncBuffer{}
	var sink io.Writer = logs
	if _, fuzzing := t.(*testing.F); !fuzzing { // fuzz workers would print every request
		sink = io.MultiWriter(logs, t.Output())
	}
	log := slog.New(slog.NewTextHandler(sink, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if opts.Logger == nil {
		opts.Logger = log
	}
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	a, err := api.New(api.Config{Store: st, Logger: log, Heartbeat: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(a.Handler())
	t.Cleanup(func() {
		hs.Close()
		if err := st.Check(); err != nil {
			t.Errorf("integrity: %v", err)
		}
		st.Close()
	})
	tok, _, err := st.CreateAdminToken("ops", state.ActorLocal)
	if err != nil {
		t.Fatal(err)
	}
	c, err := v1.NewClient(hs.URL, tok)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{store: st, api: a, srv: hs, token: tok, client: c, logs: logs}
}

// do sends a raw request and returns status, headers and body.
func (f *fixture) do(t testing.TB, method, path, token, body string) (int, http.Header, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, f.srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, data
}

func TestAuth(t *testing.T) {
	f := newFixture(t, state.Options{})
	for _, tc := range []struct{ name, token string }{{"none", ""}, {"wrong", "mna_wrong"}} {
		code, h, body := f.do(t, "GET", "/api/v1/servers", tc.token, "")
		var e v1.Error
		if code != 401 || json.Unmarshal(body, &e) != nil || e.Code != v1.CodeUnauthorized || h.Get("WWW-Authenticate") == "" {
			t.Errorf("%s token: %d %s", tc.name, code, body)
		}
	}
	// healthz and metrics need no token.
	if code, _, body := f.do(t, "GET", "/healthz", "", ""); code != 200 || !strings.Contains(string(body), `"ok"`) {
		t.Errorf("healthz: %d %s", code, body)
	}
	// Revocation takes effect on the next request.
	if _, err := f.client.ListServers(context.Background(), v1.ListServersOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := f.store.RevokeAdminToken("ops", "test"); err != nil {
		t.Fatal(err)
	}
	_, err := f.client.ListServers(context.Background(), v1.ListServersOptions{})
	if !v1.IsCode(err, v1.CodeUnauthorized) {
		t.Errorf("after revoke: %v", err)
	}
}

func TestServersListGetFilters(t *testing.T) {
	f := newFixture(t, state.Options{NoSync: true})
	ctx := context.Background()
	for _, s := range []state.Server{{Name: "a1", Zone: "zone-a"}, {Name: "a2", Zone: "zone-a"}, {Name: "b1", Zone: "zone-b"}} {
		if _, err := f.store.CreateServer(s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.store.Transition("a2", state.LifecycleNew, state.LifecycleCommissioning, ""); err != nil {
		t.Fatal(err)
	}
	names := func(l v1.ServerList) []string {
		var out []string
		for _, s := range l.Servers {
			out = append(out, s.Name)
		}
		return out
	}
	cases := []struct {
		opts v1.ListServersOptions
		want []string
		next string
	}{
		{v1.ListServersOptions{}, []string{"a1", "a2", "b1"}, ""},
		{v1.ListServersOptions{Zone: "zone-a"}, []string{"a1", "a2"}, ""},
		{v1.ListServersOptions{Lifecycle: "commissioning"}, []string{"a2"}, ""},
		{v1.ListServersOptions{Limit: 1}, []string{"a1"}, "a1"},
		{v1.ListServersOptions{Limit: 1, After: "a1"}, []string{"a2"}, "a2"},
		{v1.ListServersOptions{Zone: "zone-c"}, nil, ""},
	}
	for _, c := range cases {
		got, err := f.client.ListServers(ctx, c.opts)
		if err != nil {
			t.Fatalf("ListServers(%+v) = %v", c.opts, err)
		}
		if diff := cmp.Diff(c.want, names(got)); diff != "" || got.Next != c.next {
			t.Errorf("ListServers(%+v) next=%q (-want +got):\n%s", c.opts, got.Next, diff)
		}
	}
	for _, q := range []string{"?lifecycle=bogus", "?limit=0", "?limit=x", "?limit=10001"} {
		if code, _, body := f.do(t, "GET", "/api/v1/servers"+q, f.token, ""); code != 400 || !strings.Contains(string(body), v1.CodeBadRequest) {
			t.Errorf("GET servers%s = %d %s, want 400", q, code, body)
		}
	}
	got, err := f.client.Server(ctx, "a2")
	if err != nil || got.Lifecycle != "commissioning" || got.Zone != "zone-a" || got.Power.State != "registered" {
		t.Errorf("Server(a2) = %+v, %v", got, err)
	}
	if _, err := f.client.Server(ctx, "nope"); !v1.IsCode(err, v1.CodeNotFound) {
		t.Errorf("Server(nope) = %v", err)
	}
}

func TestTransitionEndpoint(t *testing.T) {
	f := newFixture(t, state.Options{})
	ctx := context.Background()
	if _, err := f.store.CreateServer(state.Server{Name: "n1"}); err != nil {
		t.Fatal(err)
	}
	// A move the reconciler would not carry out (nothing would boot the
	// server) is refused with what does it (before, new or
	// ready → commissioning was applied and failed the server 30 minutes
	// later).
	var ae *v1.APIError
	_, err := f.client.Transition(ctx, "n1", v1.TransitionRequest{From: "new", To: "commissioning", Reason: "operator request"})
	if !errors.As(err, &ae) || ae.StatusCode != 409 || !strings.Contains(ae.Body.Message, "actions.commission") {
		t.Fatalf("new → commissioning through the API: %v, want 409 naming actions.commission", err)
	}
	if _, err := f.store.Transition("n1", "new", "commissioning", "the reconciler"); err != nil {
		t.Fatal(err)
	}
	got, err := f.client.Transition(ctx, "n1", v1.TransitionRequest{From: "commissioning", To: "failed", Reason: "operator request"})
	if err != nil || got.Lifecycle != "failed" {
		t.Fatalf("Transition = %+v, %v", got, err)
	}
	// Stale: the server already left "commissioning".
	_, err = f.client.Transition(ctx, "n1", v1.TransitionRequest{From: "commissioning", To: "failed"})
	if !errors.As(err, &ae) || ae.StatusCode != 409 || ae.Body.Code != v1.CodeConflict || ae.Body.Lifecycle != "failed" {
		t.Errorf("stale move: %v", err)
	}
	// Illegal: not in the table.
	_, err = f.client.Transition(ctx, "n1", v1.TransitionRequest{From: "failed", To: "ready"})
	if !errors.As(err, &ae) || ae.StatusCode != 409 || ae.Body.Lifecycle != "failed" {
		t.Errorf("illegal move: %v", err)
	}
	for _, to := range []string{"allocated", "deploying", "deployed"} {
		if _, err := f.client.Transition(ctx, "n1", v1.TransitionRequest{From: "failed", To: to}); !errors.As(err, &ae) || ae.StatusCode != 409 || ae.Body.Lifecycle != "" {
			t.Errorf("failed → %s: %v, want 409 naming what does it", to, err)
		}
	}
	if _, err := f.client.Transition(ctx, "ghost", v1.TransitionRequest{From: "new", To: "failed"}); !v1.IsCode(err, v1.CodeNotFound) {
		t.Errorf("missing server: %v", err)
	}
	for _, body := range []string{`{"from":"new","to":"sideways"}`, `{"from":"new"`, `{"from":"new","to":"commissioning","extra":1}`,
		`{"from":"new","to":"commissioning"} {}`, `{"from":"new","to":"commissioning","reason":"` + strings.Repeat("x", 2000) + `"}`} {
		if code, _, resp := f.do(t, "POST", "/api/v1/servers/n1/transitions", f.token, body); code != 400 {
			t.Errorf("POST %.40s = %d %s, want 400", body, code, resp)
		}
	}
	if code, _, _ := f.do(t, "POST", "/api/v1/servers/n1/transitions", f.token, `{"reason":"`+strings.Repeat("x", 70000)+`"}`); code != 413 {
		t.Errorf("huge body = %d, want 413", code)
	}
	// Audit: the move's event names the token's name, never the token.
	evs, err := f.client.ServerEvents(ctx, "n1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	last := evs.Events[len(evs.Events)-1]
	if last.Kind != "lifecycle" || last.Actor != "ops" || last.Message != "operator request" || last.From != "commissioning" || last.To != "failed" {
		t.Errorf("audit event = %+v", last)
	}
	all, _ := f.store.Events(state.EventQuery{Limit: 1000})
	for _, e := range all {
		if strings.Contains(e.Actor+e.Message, f.token) {
			t.Errorf("event carries the token: %+v", e)
		}
	}
	if _, err := f.client.ServerEvents(ctx, "ghost", 0, 0); !v1.IsCode(err, v1.CodeNotFound) {
		t.Errorf("events of missing server: %v", err)
	}
}

// TestTransitionReleaseWipes: deployed → ready through the API is a
// release like the reconciler's: the allocation is dropped, the
// server is marked for the release wipe (so it is not allocated before the
// ramdisk wipes it), its host is marked released with its certificate
// forgotten; hosts of other servers and other moves are untouched.
func TestTransitionReleaseWipes(t *testing.T) {
	f := newFixture(t, state.Options{})
	ctx := context.Background()
	for _, name := range []string{"d1", "d2"} {
		if _, err := f.store.CreateServer(state.Server{Name: name}); err != nil {
			t.Fatal(err)
		}
		for _, m := range []state.Move{{From: state.LifecycleNew, To: state.LifecycleCommissioning}, {From: state.LifecycleCommissioning, To: state.LifecycleReady},
			{From: state.LifecycleReady, To: state.LifecycleAllocated, Update: func(s *state.Server) error {
				s.Allocation = &state.Allocation{Profile: "hypervisor", Reason: "provision", At: time.Now(), Erase: "zero",
					EraseDisks: []state.EraseDisk{{Name: "nvme0n1", WWN: "eui.0025388b91234567", Method: "secure"}}}
				return nil
			}},
			{From: state.LifecycleAllocated, To: state.LifecycleDeploying}, {From: state.LifecycleDeploying, To: state.LifecycleDeployed}} {
			m.Server = name
			if _, err := f.store.Apply(m); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := f.store.PutHost(state.Host{Name: "h-" + name, Server: name, CertFingerprint: "fp-" + name, JoinStatus: "joined"}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := f.client.Transition(ctx, "d1", v1.TransitionRequest{From: "deployed", To: "ready", Reason: "give back provisioned server"})
	if err != nil || got.Lifecycle != "ready" {
		t.Fatalf("release = %+v, %v", got, err)
	}
	d1, _ := f.store.Server("d1")
	if d1.Lifecycle != state.LifecycleReady || d1.Allocation != nil || !d1.NeedsWipe || d1.WipeErase != "zero" || len(d1.WipeEraseDisks) != 1 || d1.WipeEraseDisks[0].Method != "secure" {
		t.Errorf("d1 after release: lifecycle %s allocation %+v needsWipe %v erase %q per disk %+v; want ready, none, true, the allocation's zero and nvme0n1 secure", d1.Lifecycle, d1.Allocation, d1.NeedsWipe, d1.WipeErase, d1.WipeEraseDisks)
	}
	if h, _ := f.store.Host("h-d1"); h.JoinStatus != state.HostReleased || h.CertFingerprint != "" {
		t.Errorf("host of released d1 = %+v, want released without a fingerprint", h)
	}
	// The other deployed server is untouched; retiring it is not a release.
	if _, err := f.client.Transition(ctx, "d2", v1.TransitionRequest{From: "deployed", To: "retired"}); err != nil {
		t.Fatal(err)
	}
	if d2, _ := f.store.Server("d2"); d2.NeedsWipe {
		t.Errorf("d2 retired but marked for a release wipe")
	}
	if h, _ := f.store.Host("h-d2"); h.JoinStatus != "joined" || h.CertFingerprint != "fp-d2" {
		t.Errorf("host of d2 changed by d1's release: %+v", h)
	}
}

func TestJSONErrorsForUnknownRoutes(t *testing.T) {
	f := newFixture(t, state.Options{})
	cases := []struct {
		method, path string
		code         int
		errCode      string
	}{
		{"GET", "/api/v1/nothing", 404, v1.CodeNotFound},
		{"DELETE", "/api/v1/servers", 405, v1.CodeMethodNotAllowed},
		{"GET", "/api/v1/servers/x/transitions", 405, v1.CodeMethodNotAllowed},
	}
	for _, c := range cases {
		code, h, body := f.do(t, c.method, c.path, f.token, "")
		var e v1.Error
		if code != c.code || json.Unmarshal(body, &e) != nil || e.Code != c.errCode || h.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s = %d %s", c.method, c.path, code, body)
		}
	}
}

func TestSecretsEndpointAndStatus(t *testing.T) {
	f := newFixture(t, state.Options{})
	ctx := context.Background()
	sec, err := f.client.PutSecret(ctx, "bmc-default", v1.SecretRequest{Username: "admin", Password: "pw-123456"})
	if err != nil || sec.Name != "bmc-default" || sec.Sealed || sec.UpdatedBy != "ops" {
		t.Fatalf("PutSecret = %+v, %v", sec, err)
	}
	cred, err := f.store.Secret("bmc-default")
	if err != nil || cred.Password != "pw-123456" {
		t.Errorf("stored = %v, %v", cred, err)
	}
	st, err := f.client.Status(ctx)
	if err != nil || st.Secrets.Sealing || st.Secrets.Unsealed != 1 {
		t.Errorf("Status = %+v, %v; want unsealed reported", st, err)
	}
	if _, err := f.client.PutSecret(ctx, "Bad_Name", v1.SecretRequest{Username: "a", Password: "b"}); !v1.IsCode(err, v1.CodeBadRequest) {
		t.Errorf("bad name: %v", err)
	}
	if _, err := f.client.PutSecret(ctx, "x", v1.SecretRequest{Username: "a"}); !v1.IsCode(err, v1.CodeBadRequest) {
		t.Errorf("no password: %v", err)
	}
	list, err := f.client.Secrets(ctx)
	if err != nil || len(list.Secrets) != 1 {
		t.Errorf("Secrets = %+v, %v", list, err)
	}
	if err := f.client.DeleteSecret(ctx, "bmc-default"); err != nil {
		t.Error(err)
	}
	if err := f.client.DeleteSecret(ctx, "bmc-default"); !v1.IsCode(err, v1.CodeNotFound) {
		t.Errorf("delete twice: %v", err)
	}
	evs, _ := f.client.Events(ctx, 0, 0)
	var kinds []string
	for _, e := range evs.Events {
		if e.Actor == "ops" {
			kinds = append(kinds, e.Kind)
		}
	}
	if diff := cmp.Diff([]string{"secret.set", "secret.deleted"}, kinds); diff != "" {
		t.Errorf("audit events by ops (-want +got):\n%s", diff)
	}
}

func TestMetrics(t *testing.T) {
	f := newFixture(t, state.Options{})
	if _, err := f.store.CreateServer(state.Server{Name: "m1"}); err != nil {
		t.Fatal(err)
	}
	f.do(t, "GET", "/api/v1/servers", f.token, "")
	f.do(t, "GET", "/api/v1/servers", "bad", "")
	code, _, body := f.do(t, "GET", "/metrics", "", "")
	if code != 200 {
		t.Fatalf("metrics: %d", code)
	}
	for _, want := range []string{
		`machina_api_requests_total{code="200",route="GET /api/v1/servers"} 1`,
		`machina_api_requests_total{code="401",route="GET /api/v1/servers"} 1`,
		`machina_api_auth_failures_total 1`,
		`machina_servers{lifecycle="new"} 1`,
		`machina_secrets_sealing 0`,
		`machina_api_request_duration_seconds_bucket`,
		`go_goroutines`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// readSSE reads one SSE event (id, event, data) from r.
func readSSE(t testing.TB, r *bufio.Reader) (id, kind, data string) {
	t.Helper()
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("read SSE: %v", err)
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "" && data != "":
			return id, kind, data
		case strings.HasPrefix(line, "id: "):
			id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "event: "):
			kind = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = strings.TrimPrefix(line, "data: ")
		}
	}
}

func TestEventStream(t *testing.T) {
	f := newFixture(t, state.Options{})
	if _, err := f.store.CreateServer(state.Server{Name: "s1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Transition("s1", state.LifecycleNew, state.LifecycleCommissioning, "the reconciler"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", f.srv.URL+"/api/v1/events/stream?server=s1", nil)
	req.Header.Set("Authorization", "Bearer "+f.token)
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	br := bufio.NewReader(resp.Body)
	// The "retry:" preamble arrives once the handler subscribed; only then move.
	if line, _ := br.ReadString('\n'); !strings.HasPrefix(line, "retry:") {
		t.Fatalf("preamble %q", line)
	}
	if _, err := f.client.Transition(ctx, "s1", v1.TransitionRequest{From: "commissioning", To: "failed"}); err != nil {
		t.Fatal(err)
	}
	id, kind, data := readSSE(t, br)
	var e v1.Event
	if err := json.Unmarshal([]byte(data), &e); err != nil {
		t.Fatal(err)
	}
	if kind != "lifecycle" || e.To != "failed" || e.Actor != "ops" || id == "" {
		t.Errorf("SSE event id=%s kind=%s %+v", id, kind, e)
	}

	// Resume with Last-Event-ID: only events after it.
	if _, err := f.store.Transition("s1", state.LifecycleFailed, state.LifecycleRetired, "x"); err != nil {
		t.Fatal(err)
	}
	req2, _ := http.NewRequestWithContext(ctx, "GET", f.srv.URL+"/api/v1/events/stream", nil)
	req2.Header.Set("Authorization", "Bearer "+f.token)
	req2.Header.Set("Last-Event-ID", id)
	resp2, err := f.srv.Client().Do(req2)
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	_, _, data = readSSE(t, bufio.NewReader(resp2.Body))
	if err := json.Unmarshal([]byte(data), &e); err != nil || e.To != "retired" {
		t.Errorf("resumed event = %+v, %v", e, err)
	}
}

// TestServeStopsOnCancel: Serve returns nil after ctx is done, closing an
// open SSE stream.
func TestServeStopsOnCancel(t *testing.T) {
	f := newFixture(t, state.Options{})
	ln, err := netListen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.api.Serve(ctx, ln) }()
	c, _ := v1.NewClient("http://"+ln.Addr().String(), f.token)
	if _, err := c.Health(context.Background()); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+"/api/v1/events/stream", nil)
	req.Header.Set("Authorization", "Bearer "+f.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve = %v, want nil", err)
	}
	if _, err := io.ReadAll(br); err != nil {
		t.Logf("stream ended: %v", err)
	}
}

// TestStreamEndsOnRevoke: revoking the token closes its open streams.
func TestStreamEndsOnRevoke(t *testing.T) {
	f := newFixture(t, state.Options{})
	req, _ := http.NewRequest("GET", f.srv.URL+"/api/v1/events/stream", nil)
	req.Header.Set("Authorization", "Bearer "+f.token)
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if err := f.store.RevokeAdminToken("ops", "test"); err != nil { // writes an event: wakes the stream
		t.Fatal(err)
	}
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("stream after revoke: %v", err)
	}
	if strings.Contains(string(rest), "admin_token.revoked") {
		t.Errorf("revoked stream delivered further events: %q", rest)
	}
}

// TestEventStreamUnnamed: with unnamed=1 every event comes without an
// "event:" line (a browser's EventSource then delivers any kind as
// "message"), kinds outside the state package's constants included; a bad
// value is a 400 naming the parameter.
func TestEventStreamUnnamed(t *testing.T) {
	f := newFixture(t, state.Options{})
	if _, err := f.store.CreateServer(state.Server{Name: "s1"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func(q string) *http.Response {
		req, _ := http.NewRequestWithContext(ctx, "GET", f.srv.URL+"/api/v1/events/stream?"+q, nil)
		req.Header.Set("Authorization", "Bearer "+f.token)
		resp, err := f.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	if resp := open("unnamed=yes"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("unnamed=yes: %s, want 400", resp.Status)
	} else if b, _ := io.ReadAll(resp.Body); !strings.Contains(string(b), "unnamed") {
		t.Errorf("unnamed=yes: body %s does not name the parameter", b)
	}
	resp := open("server=s1&unnamed=1")
	br := bufio.NewReader(resp.Body)
	if line, _ := br.ReadString('\n'); !strings.HasPrefix(line, "retry:") {
		t.Fatalf("preamble %q", line)
	}
	if _, err := f.store.AppendEvent(state.Event{Server: "s1", Kind: "wipe.done", Message: "wiped sda"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.ObserveBMC("s1", time.Now(), state.PowerOn, "Warning"); err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for range 3 {
		id, kind, data := readSSE(t, br)
		var e v1.Event
		if err := json.Unmarshal([]byte(data), &e); err != nil {
			t.Fatal(err)
		}
		if kind != "" || id == "" {
			t.Errorf("event id=%q has an event line %q", id, kind)
		}
		kinds = append(kinds, e.Kind)
	}
	if want := []string{"wipe.done", "power", "health"}; strings.Join(kinds, " ") != strings.Join(want, " ") {
		t.Errorf("kinds %q, want %q", kinds, want)
	}
}

// TestApprovalsRoute: GET /api/v1/approvals lists the recorded approvals
// (prefix and actor), and ApprovalList.Approves matches a full digest by
// any recorded prefix only.
func TestApprovalsRoute(t *testing.T) {
	f := newFixture(t, state.Options{})
	ctx := context.Background()
	if got, err := f.client.Approvals(ctx); err != nil || len(got.Approvals) != 0 {
		t.Fatalf("no approvals yet: %+v, %v", got, err)
	}
	if err := f.store.Approve("c4c0915ede48", "ops"); err != nil {
		t.Fatal(err)
	}
	got, err := f.client.Approvals(ctx)
	if err != nil || len(got.Approvals) != 1 || got.Approvals[0] != (v1.Approval{Revision: "c4c0915ede48", Actor: "ops"}) {
		t.Fatalf("approvals %+v, %v", got, err)
	}
	for digest, want := range map[string]bool{
		"sha256:c4c0915ede48aa00": true, "c4c0915ede48ff": true, "sha256:c4c0915ede49": false, "": false,
	} {
		if got.Approves(digest) != want {
			t.Errorf("Approves(%q) = %v, want %v", digest, !want, want)
		}
	}
}
