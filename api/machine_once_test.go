package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/state"
)

const onceMAC = "52:54:00:00:00:07"

// flakyPlanner fails while failing is set, as a planner does while the
// image is not imported yet.
type flakyPlanner struct{ failing atomic.Bool }

func (p *flakyPlanner) DeployPlan(_ context.Context, srv state.Server) (v1.Plan, error) {
	if p.failing.Load() {
		return v1.Plan{}, errors.New("image not imported yet")
	}
	return v1.Plan{ImageURL: "http://127.0.0.1/img", ImageSHA256: strings.Repeat("ab", 32), ImageSizeBytes: 4 << 20,
		Seed: v1.Seed{InstanceID: "i-1", Hostname: srv.Name}}, nil
}

func machineFixture(t *testing.T, planner api.DeployPlanner) *fixture {
	t.Helper()
	f := newFixture(t, state.Options{})
	m, err := api.NewMachine(api.MachineConfig{Store: f.store, Planner: planner})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Mount(f.api); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.CreateServer(state.Server{Name: "r1-n07", BootMAC: onceMAC}); err != nil {
		t.Fatal(err)
	}
	return f
}

func walk(t *testing.T, f *fixture, to ...state.Lifecycle) {
	t.Helper()
	for _, lc := range to {
		s, _ := f.store.Server("r1-n07")
		if _, err := f.store.Transition("r1-n07", s.Lifecycle, lc, "test"); err != nil {
			t.Fatal(err)
		}
	}
}

func issueFor(t *testing.T, f *fixture, p state.Purpose) string {
	t.Helper()
	tok, _, err := f.store.IssueToken(state.TokenSpec{Purpose: p, Server: "r1-n07", MAC: onceMAC})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func goodReport() v1.AgentReport {
	return v1.AgentReport{BootMAC: onceMAC,
		Facts: v1.Facts{CPU: v1.CPU{Cores: 8}, Memory: v1.Memory{TotalBytes: 32 << 30}, Disks: []v1.Disk{{Name: "sda", SizeBytes: 200 << 30}}},
		Tests: []v1.TestResult{{Name: v1.TestCPU, Passed: true}, {Name: v1.TestMemory, Passed: true}, {Name: v1.TestDisk, Passed: true}, {Name: v1.TestNetwork, Passed: true}}}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReportExactlyOnce: a malformed report (JSON null, a test missing, a
// disk test that passed with no disk) is refused 400 and consumes nothing;
// the good report moves the server once; the same report again (its answer
// lost) gets the same answer and changes nothing; another body with the
// used token is refused. Before the fix, null consumed the token and
// replaced the hardware record with an empty one, and the retry got 403.
func TestReportExactlyOnce(t *testing.T) {
	f := machineFixture(t, nil)
	walk(t, f, state.LifecycleCommissioning)
	tok := issueFor(t, f, state.PurposeReport)

	missing := goodReport()
	missing.Tests = missing.Tests[:3]
	noDisk := goodReport()
	noDisk.Facts.Disks = nil
	for name, body := range map[string]string{
		"null": "null", "array": "[]", "missing test": mustJSON(t, missing), "disk test passed without a disk": mustJSON(t, noDisk),
	} {
		if code, _, b := f.do(t, http.MethodPost, v1.PathAgentReport, tok, body); code != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", name, code, b)
		}
	}
	if s, _ := f.store.Server("r1-n07"); s.Lifecycle != state.LifecycleCommissioning || s.Hardware != nil {
		t.Fatalf("after malformed reports: %s hardware %v, want commissioning and none", s.Lifecycle, s.Hardware)
	}

	body := mustJSON(t, goodReport())
	code, _, first := f.do(t, http.MethodPost, v1.PathAgentReport, tok, body)
	if code != http.StatusOK {
		t.Fatalf("report: %d %s", code, first)
	}
	s1, _ := f.store.Server("r1-n07")
	if s1.Lifecycle != state.LifecycleReady || s1.Hardware == nil || s1.Hardware.Cores != 8 || s1.LastHeard == "" {
		t.Fatalf("after the report: %+v", s1)
	}
	code, _, again := f.do(t, http.MethodPost, v1.PathAgentReport, tok, body)
	if code != http.StatusOK || string(again) != string(first) {
		t.Errorf("same report again: %d %s, want 200 %s", code, again, first)
	}
	if s2, _ := f.store.Server("r1-n07"); s2.Revision != s1.Revision {
		t.Errorf("same report again changed the server: revision %d → %d", s1.Revision, s2.Revision)
	}
	other := goodReport()
	other.Facts.CPU.Cores = 64
	if code, _, _ := f.do(t, http.MethodPost, v1.PathAgentReport, tok, mustJSON(t, other)); code != http.StatusForbidden {
		t.Errorf("another body with the used token: %d, want 403", code)
	}
}

// TestPlanNotConsumedOn503: the plan token survives a 503 (image not
// imported yet), so the agent's retry gets the plan; a retry of the plan
// request gets the plan again with fresh image and done tokens, and the
// earlier ones stop working. Before the fix the 503 consumed the token and
// the retry got 403.
func TestPlanNotConsumedOn503(t *testing.T) {
	pl := &flakyPlanner{}
	pl.failing.Store(true)
	f := machineFixture(t, pl)
	walk(t, f, state.LifecycleCommissioning, state.LifecycleReady, state.LifecycleAllocated, state.LifecycleDeploying)
	tok := issueFor(t, f, state.PurposePlan)
	if code, _, _ := f.do(t, http.MethodGet, v1.PathAgentPlan, tok, ""); code != http.StatusServiceUnavailable {
		t.Fatalf("plan while failing: %d, want 503", code)
	}
	pl.failing.Store(false)
	var p1, p2 v1.Plan
	code, _, b := f.do(t, http.MethodGet, v1.PathAgentPlan, tok, "")
	if code != http.StatusOK {
		t.Fatalf("plan after the 503: %d %s, want 200", code, b)
	}
	_ = json.Unmarshal(b, &p1)
	if !p1.ReadBack || p1.DoneToken == "" {
		t.Errorf("plan: readBack %v doneToken %q, want a read-back and a done token", p1.ReadBack, p1.DoneToken)
	}
	code, _, b = f.do(t, http.MethodGet, v1.PathAgentPlan, tok, "")
	if code != http.StatusOK {
		t.Fatalf("plan retried: %d %s, want 200", code, b)
	}
	_ = json.Unmarshal(b, &p2)
	if p2.ImageSHA256 != p1.ImageSHA256 || p2.DoneToken == p1.DoneToken {
		t.Errorf("plan retried: same digest %v, fresh done token %v", p2.ImageSHA256 == p1.ImageSHA256, p2.DoneToken != p1.DoneToken)
	}
	done := mustJSON(t, v1.DeployResult{BootMAC: onceMAC, OK: true, BytesWritten: 4 << 20, SHA256: p1.ImageSHA256, ReadBackSHA256: p1.ImageSHA256})
	if code, _, _ := f.do(t, http.MethodPost, v1.PathAgentDone, p1.DoneToken, done); code != http.StatusForbidden {
		t.Errorf("done with the first plan's revoked token: %d, want 403", code)
	}
	if code, _, b := f.do(t, http.MethodPost, v1.PathAgentDone, p2.DoneToken, done); code != http.StatusNoContent {
		t.Fatalf("done: %d %s", code, b)
	}
	s, _ := f.store.Server("r1-n07")
	if s.Lifecycle != state.LifecycleDeployed || s.Deploy == nil || !s.Deploy.Verified {
		t.Fatalf("after done: %s deploy %+v, want deployed and verified", s.Lifecycle, s.Deploy)
	}
	if code, _, _ := f.do(t, http.MethodPost, v1.PathAgentDone, p2.DoneToken, done); code != http.StatusNoContent {
		t.Errorf("done retried: %d, want the recorded 204", code)
	}
	if s2, _ := f.store.Server("r1-n07"); s2.Revision != s.Revision {
		t.Errorf("done retried changed the server: revision %d → %d", s.Revision, s2.Revision)
	}
	if code, _, _ := f.do(t, http.MethodGet, v1.PathAgentPlan, tok, ""); code != http.StatusConflict {
		t.Errorf("plan after deployed: %d, want 409", code)
	}
}

// TestDoneLiesRefused: a done whose digest, size or read-back digest is not
// the plan's fails the server with a reason naming both values. Before the
// fix ok:true, bytesWritten:1, sha256:"00" moved the server to deployed.
func TestDoneLiesRefused(t *testing.T) {
	want := strings.Repeat("ab", 32)
	for name, tc := range map[string]struct {
		res    v1.DeployResult
		reason []string
	}{
		"digest":    {v1.DeployResult{OK: true, BytesWritten: 4 << 20, SHA256: "00", ReadBackSHA256: want}, []string{`"00"`, want}},
		"size":      {v1.DeployResult{OK: true, BytesWritten: 1, SHA256: want, ReadBackSHA256: want}, []string{"1 bytes", "4194304"}},
		"read-back": {v1.DeployResult{OK: true, BytesWritten: 4 << 20, SHA256: want}, []string{`read-back sha256 ""`, want}},
	} {
		t.Run(name, func(t *testing.T) {
			f := machineFixture(t, &flakyPlanner{})
			walk(t, f, state.LifecycleCommissioning, state.LifecycleReady, state.LifecycleAllocated, state.LifecycleDeploying)
			var p v1.Plan
			_, _, b := f.do(t, http.MethodGet, v1.PathAgentPlan, issueFor(t, f, state.PurposePlan), "")
			if err := json.Unmarshal(b, &p); err != nil {
				t.Fatal(err)
			}
			tc.res.BootMAC = onceMAC
			if code, _, b := f.do(t, http.MethodPost, v1.PathAgentDone, p.DoneToken, mustJSON(t, tc.res)); code != http.StatusNoContent {
				t.Fatalf("done: %d %s", code, b)
			}
			s, _ := f.store.Server("r1-n07")
			if s.Lifecycle != state.LifecycleFailed {
				t.Fatalf("lifecycle %s, want failed", s.Lifecycle)
			}
			for _, w := range tc.reason {
				if !strings.Contains(s.LastError, w) {
					t.Errorf("reason %q does not name %s", s.LastError, w)
				}
			}
		})
	}
}

// TestDoneFromAnotherMAC: a done naming another boot MAC is refused 400
// and consumes nothing.
func TestDoneFromAnotherMAC(t *testing.T) {
	f := machineFixture(t, &flakyPlanner{})
	walk(t, f, state.LifecycleCommissioning, state.LifecycleReady, state.LifecycleAllocated, state.LifecycleDeploying)
	var p v1.Plan
	_, _, b := f.do(t, http.MethodGet, v1.PathAgentPlan, issueFor(t, f, state.PurposePlan), "")
	_ = json.Unmarshal(b, &p)
	want := strings.Repeat("ab", 32)
	res := v1.DeployResult{BootMAC: "52:54:00:00:00:99", OK: true, BytesWritten: 4 << 20, SHA256: want, ReadBackSHA256: want}
	if code, _, _ := f.do(t, http.MethodPost, v1.PathAgentDone, p.DoneToken, mustJSON(t, res)); code != http.StatusBadRequest {
		t.Errorf("done from another MAC: %d, want 400", code)
	}
	res.BootMAC = onceMAC
	if code, _, _ := f.do(t, http.MethodPost, v1.PathAgentDone, p.DoneToken, mustJSON(t, res)); code != http.StatusNoContent {
		t.Errorf("done from the server's MAC after the refusal: %d, want 204", code)
	}
}

type fixedLeases map[string]netip.Addr

func (l fixedLeases) LeasedIP(mac string) (netip.Addr, bool) { a, ok := l[mac]; return a, ok }

// TestPlanBoundToLease: with Machina serving DHCP, a plan request from an
// address other than the one leased to the server's boot MAC is refused
// (403, an event naming both addresses) and uses nothing; from the leased
// address it is served.
func TestPlanBoundToLease(t *testing.T) {
	leases := fixedLeases{onceMAC: netip.MustParseAddr("127.0.0.2")}
	f := newFixture(t, state.Options{})
	m, err := api.NewMachine(api.MachineConfig{Store: f.store, Planner: &flakyPlanner{}, Leases: leases})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Mount(f.api); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.CreateServer(state.Server{Name: "r1-n07", BootMAC: onceMAC}); err != nil {
		t.Fatal(err)
	}
	walk(t, f, state.LifecycleCommissioning, state.LifecycleReady, state.LifecycleAllocated, state.LifecycleDeploying)
	tok := issueFor(t, f, state.PurposePlan)
	if code, _, _ := f.do(t, http.MethodGet, v1.PathAgentPlan, tok, ""); code != http.StatusForbidden {
		t.Fatalf("plan from 127.0.0.1 with 127.0.0.2 leased: %d, want 403", code)
	}
	evs, _ := f.store.Events(state.EventQuery{Server: "r1-n07", Limit: 100})
	if last := evs[len(evs)-1]; !strings.Contains(last.Message, "request from 127.0.0.1, but 127.0.0.2 is leased to "+onceMAC) {
		t.Errorf("refusal event = %q", last.Message)
	}
	leases[onceMAC] = netip.MustParseAddr("127.0.0.1")
	if code, _, b := f.do(t, http.MethodGet, v1.PathAgentPlan, tok, ""); code != http.StatusOK {
		t.Fatalf("plan from the leased address: %d %s, want 200 (the refusal used nothing)", code, b)
	}
}

// TestUnknownTokenFloodWritesNothing: 500 plan requests with made-up
// tokens (a bounded flood) are refused 403 and counted, and write no
// event (before the fix each refusal was a write transaction, an fsync
// and an event: 2,000 requests, ~2,000 events).
func TestUnknownTokenFloodWritesNothing(t *testing.T) {
	f := newFixture(t, state.Options{})
	m, err := api.NewMachine(api.MachineConfig{Store: f.store, Planner: &flakyPlanner{}, PerIP: boot.Limit{Burst: 1000, Every: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Mount(f.api); err != nil {
		t.Fatal(err)
	}
	before, _ := f.store.Events(state.EventQuery{Limit: 10000})
	for i := range 500 {
		if code, _, _ := f.do(t, http.MethodGet, v1.PathAgentPlan, "made-up-"+strings.Repeat("x", i%40), ""); code != http.StatusForbidden {
			t.Fatalf("request %d: %d, want 403", i, code)
		}
	}
	after, _ := f.store.Events(state.EventQuery{Limit: 10000})
	if len(after) != len(before) {
		t.Errorf("500 unknown tokens wrote %d events, want none", len(after)-len(before))
	}
	if n := f.store.UnknownTokenRefusals(); n != 500 {
		t.Errorf("UnknownTokenRefusals = %d, want 500", n)
	}
}

// TestPerTokenLimit: one bearer token sent from many
// source addresses is limited per token, after the per-address limit; a
// request with another token from those addresses still gets through.
func TestPerTokenLimit(t *testing.T) {
	f := newFixture(t, state.Options{})
	m, err := api.NewMachine(api.MachineConfig{Store: f.store, Planner: &flakyPlanner{},
		PerIP: boot.Limit{Burst: 1000, Every: time.Millisecond}, PerToken: boot.Limit{Burst: 5, Every: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Mount(f.api); err != nil {
		t.Fatal(err)
	}
	get := func(i int, tok string) int {
		req := httptest.NewRequest(http.MethodGet, v1.PathAgentPlan, nil)
		req.RemoteAddr = fmt.Sprintf("10.77.%d.%d:4000", i/200, i%200+1)
		req.Header.Set("Authorization", "Bearer "+tok)
		rec := httptest.NewRecorder()
		f.api.Handler().ServeHTTP(rec, req)
		return rec.Code
	}
	limited := 0
	for i := range 20 {
		if get(i, "one-token-many-addresses") == http.StatusTooManyRequests {
			limited++
		}
	}
	if limited != 15 {
		t.Errorf("20 requests with one token from 20 addresses: %d answered 429, want 15 (burst 5)", limited)
	}
	if code := get(3, "another-token"); code == http.StatusTooManyRequests {
		t.Errorf("another token from an address of those: %d, want it past the limiter", code)
	}
}
