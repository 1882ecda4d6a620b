package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/boot"
	"github.com/machina-metal/machina/state"
)

type fixedWiper struct{ hint v1.RootDeviceHint }

func (f fixedWiper) WipeHint(context.Context, state.Server) (v1.RootDeviceHint, error) {
	return f.hint, nil
}

// releasedServer creates a server walked to ready with NeedsWipe, as the
// reconciler's release leaves it.
func releasedServer(t testing.TB, f *fixture, name, mac string) {
	t.Helper()
	if _, err := f.store.CreateServer(state.Server{Name: name, BootMAC: mac}); err != nil {
		t.Fatal(err)
	}
	for _, to := range []state.Lifecycle{state.LifecycleCommissioning, state.LifecycleReady} {
		s, _ := f.store.Server(name)
		if _, err := f.store.Transition(name, s.Lifecycle, to, "test"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.store.UpdateServer(name, func(s *state.Server) error { s.NeedsWipe = true; return nil }); err != nil {
		t.Fatal(err)
	}
}

// TestWipeEndpoints: the wipe token is single-use and bound to its purpose;
// the wipe plan carries the hint and a single-use wiped token; a failed
// wipe is counted with its reason and keeps NeedsWipe; a good one clears
// it; a server not waiting for a wipe is refused with 409.
func TestWipeEndpoints(t *testing.T) {
	f := newFixture(t, state.Options{})
	m, err := api.NewMachine(api.MachineConfig{Store: f.store, Wiper: fixedWiper{v1.RootDeviceHint{Serial: "S1"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Mount(f.api); err != nil {
		t.Fatal(err)
	}
	releasedServer(t, f, "r1-n01", "52:54:00:00:00:01")

	issue := func(p state.Purpose) string {
		tok, _, err := f.store.IssueToken(state.TokenSpec{Purpose: p, Server: "r1-n01", MAC: "52:54:00:00:00:01"})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	// A token of another purpose is refused.
	if code, _, _ := f.do(t, http.MethodGet, v1.PathAgentWipe, issue(state.PurposePlan), ""); code != http.StatusForbidden {
		t.Errorf("wipe plan with a deploy token: %d, want 403", code)
	}
	wipeTok := issue(state.PurposeWipe)
	code, _, body := f.do(t, http.MethodGet, v1.PathAgentWipe, wipeTok, "")
	var plan v1.WipePlan
	if code != http.StatusOK || json.Unmarshal(body, &plan) != nil {
		t.Fatalf("wipe plan: %d %s", code, body)
	}
	if plan.RootDevice.Serial != "S1" || plan.DoneToken == "" {
		t.Errorf("wipe plan = %+v", plan)
	}
	// A retry of the same request (its answer lost) gets the plan again
	// (at-least-once requests), with a fresh wiped token that
	// revokes the first one.
	code, _, body = f.do(t, http.MethodGet, v1.PathAgentWipe, wipeTok, "")
	var again v1.WipePlan
	if code != http.StatusOK || json.Unmarshal(body, &again) != nil || again.DoneToken == "" || again.DoneToken == plan.DoneToken {
		t.Fatalf("wipe plan retried: %d %s, want 200 with a new wiped token", code, body)
	}
	if code, _, _ := f.do(t, http.MethodPost, v1.PathAgentWiped, plan.DoneToken, `{"ok":true}`); code != http.StatusForbidden {
		t.Errorf("the first answer's wiped token after the retry: %d, want 403 (revoked)", code)
	}
	plan = again
	// A malformed outcome does not use the token up.
	if code, _, _ := f.do(t, http.MethodPost, v1.PathAgentWiped, plan.DoneToken, `{"ok":true,"extra":1}`); code != http.StatusBadRequest {
		t.Errorf("malformed outcome: %d, want 400", code)
	}
	code, _, body = f.do(t, http.MethodPost, v1.PathAgentWiped, plan.DoneToken, `{"bootMAC":"52:54:00:00:00:01","ok":false,"reason":"sda: input/output error","durationNs":1}`)
	if code != http.StatusNoContent {
		t.Fatalf("failed outcome: %d %s", code, body)
	}
	s, _ := f.store.Server("r1-n01")
	if !s.NeedsWipe || s.WipeFailures != 1 || s.WipeFailedAt.IsZero() || !strings.Contains(s.LastError, "input/output error") {
		t.Errorf("after a failed wipe: needsWipe %v failures %d failedAt %v lastError %q", s.NeedsWipe, s.WipeFailures, s.WipeFailedAt, s.LastError)
	}
	if code, _, _ := f.do(t, http.MethodPost, v1.PathAgentWiped, plan.DoneToken, `{"ok":true}`); code != http.StatusForbidden {
		t.Errorf("wiped token reused: %d, want 403", code)
	}

	// Second attempt succeeds.
	code, _, body = f.do(t, http.MethodGet, v1.PathAgentWipe, issue(state.PurposeWipe), "")
	if code != http.StatusOK || json.Unmarshal(body, &plan) != nil {
		t.Fatalf("wipe plan: %d %s", code, body)
	}
	if code, _, body := f.do(t, http.MethodPost, v1.PathAgentWiped, plan.DoneToken, `{"bootMAC":"52:54:00:00:00:01","ok":true,"disks":["pci-0000:00:1f.2-ata-1"],"durationNs":1}`); code != http.StatusNoContent {
		t.Fatalf("good outcome: %d %s", code, body)
	}
	s, _ = f.store.Server("r1-n01")
	if s.NeedsWipe || s.WipeFailures != 0 || s.LastError != "" || s.Power.State != state.PowerOff {
		t.Errorf("after a good wipe: needsWipe %v failures %d lastError %q power %s", s.NeedsWipe, s.WipeFailures, s.LastError, s.Power.State)
	}
	// Nothing left to wipe: a new wipe token gets 409.
	if code, _, _ := f.do(t, http.MethodGet, v1.PathAgentWipe, issue(state.PurposeWipe), ""); code != http.StatusConflict {
		t.Errorf("wipe plan for a wiped server: %d, want 409", code)
	}
}

// FuzzWipedBody feeds arbitrary wipe outcomes to /v1/agent/wiped with a
// fresh token each time: the answer is 204, 400 or 413; a refused body
// changes nothing (NeedsWipe and the failure count stay), an accepted one
// clears NeedsWipe (ok) or counts one failure.
func FuzzWipedBody(f *testing.F) {
	for _, s := range []string{`{"bootMAC":"52:54:00:00:00:09","ok":true,"disks":["sda"],"durationNs":5}`, `{"ok":false,"reason":"EIO"}`,
		`{}`, `{"ok":"yes"}`, `[`, `{"ok":true} x`, `{"ok":true,"unknown":1}`, ""} {
		f.Add(s)
	}
	fx := newFixture(f, state.Options{NoSync: true})
	m, err := api.NewMachine(api.MachineConfig{Store: fx.store, PerIP: boot.Limit{Burst: 1 << 30, Every: time.Nanosecond}})
	if err != nil {
		f.Fatal(err)
	}
	if err := m.Mount(fx.api); err != nil {
		f.Fatal(err)
	}
	releasedServer(f, fx, "fz", "52:54:00:00:00:09")
	h := fx.api.Handler()
	f.Fuzz(func(t *testing.T, body string) {
		if len(body) > 1<<17 {
			return
		}
		if _, err := fx.store.UpdateServer("fz", func(s *state.Server) error { s.NeedsWipe, s.WipeFailures = true, 0; return nil }); err != nil {
			t.Fatal(err)
		}
		tok, _, err := fx.store.IssueToken(state.TokenSpec{Purpose: state.PurposeWiped, Server: "fz"})
		if err != nil {
			t.Fatal(err)
		}
		req := httptest.NewRequest("POST", v1.PathAgentWiped, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		s, _ := fx.store.Server("fz")
		switch rec.Code {
		case http.StatusNoContent:
			var res v1.WipeResult
			if json.Unmarshal([]byte(body), &res) != nil {
				t.Fatalf("accepted an unparsable body %q", body)
			}
			if res.OK == s.NeedsWipe || (!res.OK && s.WipeFailures != 1) {
				t.Fatalf("ok=%v: needsWipe %v failures %d", res.OK, s.NeedsWipe, s.WipeFailures)
			}
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			if !s.NeedsWipe || s.WipeFailures != 0 {
				t.Fatalf("refused body changed the server: needsWipe %v failures %d", s.NeedsWipe, s.WipeFailures)
			}
		default:
			t.Fatalf("status %d for body %q: %s", rec.Code, body, rec.Body)
		}
	})
}
