package api_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/attestation"
	"github.com/machina-metal/machina/attestation/attestationtest"
	"github.com/machina-metal/machina/ramdisk/agent"
	"github.com/machina-metal/machina/state"
)

// secretPlanner answers a plan carrying a join token and counts the plans
// it made.
type secretPlanner struct{ made atomic.Int32 }

func (p *secretPlanner) DeployPlan(_ context.Context, srv state.Server) (v1.Plan, error) {
	p.made.Add(1)
	return v1.Plan{ImageURL: "http://img/x.raw", ImageSHA256: strings.Repeat("a", 64), ImageSizeBytes: 1,
		Seed: v1.Seed{Hostname: srv.Name, SSHKeys: []string{"ssh-ed25519 AAAA ops"}, JoinToken: "join-secret-0123456789"}}, nil
}

type rules map[string]api.AttestRule

func (r rules) AttestRule(server string) api.AttestRule { return r[server] }

// deployingServerTPM creates a server walked to deploying.
func deployingServerTPM(t *testing.T, st *state.Store, name, mac string) {
	t.Helper()
	if _, err := st.CreateServer(state.Server{Name: name, BootMAC: mac}); err != nil {
		t.Fatal(err)
	}
	for _, to := range []state.Lifecycle{state.LifecycleCommissioning, state.LifecycleReady, state.LifecycleAllocated, state.LifecycleDeploying} {
		s, _ := st.Server(name)
		if _, err := st.Transition(name, s.Lifecycle, to, "test"); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPlanNeedsAttestationSWTPM: under attestation: required the deploy
// plan (SSH keys, join token) is released only after the agent's TPM
// attested with the token; a machine without a TPM, a TPM other than the
// pinned one, and a boot chain other than the served one are refused with
// no plan made, the token unspent and the server still deploying; the EK
// is recorded on the server.
func TestPlanNeedsAttestationSWTPM(t *testing.T) {
	f := newFixture(t, state.Options{})
	pl := &secretPlanner{}
	sw := attestationtest.Start(t, false)
	sw.Measure(t, attestationtest.Boot("ipxe.efi", "vmlinuz", "initrd")...)
	other := attestationtest.Start(t, false)
	other.Measure(t, attestationtest.Boot("ipxe.efi", "vmlinuz", "initrd")...)
	tpm, err := agent.OpenTPM(sw.Channel(t))
	if err != nil || tpm == nil {
		t.Fatalf("OpenTPM: %v", err)
	}
	defer tpm.Close()
	otherTPM, err := agent.OpenTPM(other.Channel(t))
	if err != nil || otherTPM == nil {
		t.Fatalf("OpenTPM: %v", err)
	}
	defer otherTPM.Close()
	ek, _ := tpm.EKFingerprint()

	served := attestation.BootChain{Applications: [][]byte{attestationtest.Sum("ipxe.efi"), attestationtest.Sum("vmlinuz")}}
	pol := rules{"r1-n01": {Mode: api.AttestRequired, Chain: served}}
	m, err := api.NewMachine(api.MachineConfig{Store: f.store, Planner: pl, AttestPolicy: pol})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Mount(f.api); err != nil {
		t.Fatal(err)
	}
	const mac = "52:54:00:00:00:01"
	deployingServerTPM(t, f.store, "r1-n01", mac)
	tok, _, err := f.store.IssueToken(state.TokenSpec{Purpose: state.PurposePlan, Server: "r1-n01", MAC: mac})
	if err != nil {
		t.Fatal(err)
	}
	c := &v1.AgentClient{BaseURL: f.srv.URL}
	ctx := context.Background()
	refusedPlan := func(why string) {
		t.Helper()
		_, err := c.Plan(ctx, tok)
		var se *v1.AgentStatusError
		if !errors.As(err, &se) || se.Code != http.StatusForbidden || strings.Contains(se.Body, "join-secret") {
			t.Fatalf("%s: plan = %v, want 403 without the plan", why, err)
		}
		if n := pl.made.Load(); n != 0 {
			t.Fatalf("%s: %d plans made", why, n)
		}
		s, _ := f.store.Server("r1-n01")
		if s.Lifecycle != state.LifecycleDeploying || s.Deploy != nil {
			t.Fatalf("%s: server %s, deploy %+v: changed", why, s.Lifecycle, s.Deploy)
		}
	}

	// No TPM (no attestation): refused.
	refusedPlan("no attestation")
	if got := m.AttestRefusals()["missing"]; got != 1 {
		t.Errorf("missing refusals = %d, want 1", got)
	}

	// A TPM whose log names a kernel the controller did not serve.
	evil := attestationtest.Start(t, false)
	evil.Measure(t, attestationtest.Boot("ipxe.efi", "evil-kernel", "initrd")...)
	evilTPM, err := agent.OpenTPM(evil.Channel(t))
	if err != nil {
		t.Fatal(err)
	}
	defer evilTPM.Close()
	if err := evilTPM.Attest(ctx, c, tok, mac); !errors.Is(err, v1.ErrAgentTokenRefused) {
		t.Fatalf("attest with another kernel = %v, want refused", err)
	}
	refusedPlan("other kernel")
	if got := m.AttestRefusals()["boot_chain"]; got != 1 {
		t.Errorf("boot_chain refusals = %d, want 1", got)
	}

	// The pinned EK is this TPM's: the other TPM is refused before any
	// challenge, with a condition on the server.
	pol["r1-n01"] = api.AttestRule{Mode: api.AttestRequired, PinnedEK: ek, Chain: served}
	if err := otherTPM.Attest(ctx, c, tok, mac); !errors.Is(err, v1.ErrAgentTokenRefused) {
		t.Fatalf("attest with another TPM = %v, want refused", err)
	}
	refusedPlan("other TPM")
	s, _ := f.store.Server("r1-n01")
	otherEK, _ := otherTPM.EKFingerprint()
	if s.TPM == nil || s.TPM.RefusedEK != otherEK || !strings.Contains(s.TPM.Refused, "pinned") {
		t.Errorf("server TPM after a mismatched EK = %+v", s.TPM)
	}
	// Again: refused, counted, and the record is not written again.
	if err := otherTPM.Attest(ctx, c, tok, mac); !errors.Is(err, v1.ErrAgentTokenRefused) {
		t.Fatalf("attest with another TPM again = %v, want refused", err)
	}
	if s2, _ := f.store.Server("r1-n01"); !s2.UpdatedAt.Equal(s.UpdatedAt) || m.AttestRefusals()["ek_mismatch"] != 2 {
		t.Errorf("second mismatch: record updated %s -> %s, ek_mismatch %d", s.UpdatedAt, s2.UpdatedAt, m.AttestRefusals()["ek_mismatch"])
	}

	// The right TPM: attested, then the plan is released once.
	t0 := time.Now()
	if err := tpm.Attest(ctx, c, tok, mac); err != nil {
		t.Fatalf("attest: %v", err)
	}
	t.Logf("one attestation (challenge, activation, quote, verification) against swtpm: %s", time.Since(t0).Round(time.Millisecond))
	p, err := c.Plan(ctx, tok)
	if err != nil || p.Seed.JoinToken == "" || p.DoneToken == "" {
		t.Fatalf("plan after attestation = %+v, %v", p, err)
	}
	s, _ = f.store.Server("r1-n01")
	if s.TPM == nil || s.TPM.EK != ek || s.TPM.Refused != "" || len(s.TPM.BootApplications) != 2 {
		t.Errorf("server TPM = %+v, want EK %s recorded", s.TPM, ek)
	}
	// The same plan request again (a spoofer at the server's address
	// replaying the plan token it read off the network, while the server
	// deploys): the attestation released one answer, so this one is
	// refused and carries no secret.
	if p2, err := c.Plan(ctx, tok); !errors.As(err, new(*v1.AgentStatusError)) || p2.Seed.JoinToken != "" {
		t.Fatalf("replayed plan after the attested one = %+v, %v; want refused", p2, err)
	} else if se := (*v1.AgentStatusError)(nil); errors.As(err, &se) && (se.Code != http.StatusForbidden || !strings.Contains(se.Body, v1.CodeAttestationRequired)) {
		t.Fatalf("replayed plan = %v, want 403 %s", err, v1.CodeAttestationRequired)
	}

	// done needs its own attestation with the done token.
	res := v1.DeployResult{BootMAC: mac, OK: true, BytesWritten: 1, SHA256: strings.Repeat("a", 64), ReadBackSHA256: strings.Repeat("a", 64)}
	err = c.Done(ctx, p.DoneToken, res)
	var se *v1.AgentStatusError
	if !errors.As(err, &se) || se.Code != http.StatusForbidden {
		t.Fatalf("done without attestation = %v, want 403", err)
	}
	if s, _ := f.store.Server("r1-n01"); s.Lifecycle != state.LifecycleDeploying {
		t.Fatalf("done without attestation moved the server to %s", s.Lifecycle)
	}
	if err := tpm.Attest(ctx, c, p.DoneToken, mac); err != nil {
		t.Fatalf("attest for done: %v", err)
	}
	if err := c.Done(ctx, p.DoneToken, res); err != nil {
		t.Fatalf("done after attestation: %v", err)
	}
	if s, _ := f.store.Server("r1-n01"); s.Lifecycle != state.LifecycleDeployed {
		t.Fatalf("after done: %s", s.Lifecycle)
	}
}

// TestAttestationOptionalAndOff: a server without a TPM gets its plan
// under optional and off; off answers the attestation endpoint 409
// attestation_off, which the agent takes as "go on".
func TestAttestationOptionalAndOff(t *testing.T) {
	for _, mode := range []string{api.AttestOptional, api.AttestOff, ""} {
		t.Run("mode="+mode, func(t *testing.T) {
			f := newFixture(t, state.Options{})
			pl := &secretPlanner{}
			m, err := api.NewMachine(api.MachineConfig{Store: f.store, Planner: pl, AttestPolicy: rules{"r1-n01": {Mode: mode}}})
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Mount(f.api); err != nil {
				t.Fatal(err)
			}
			deployingServerTPM(t, f.store, "r1-n01", "52:54:00:00:00:01")
			tok, _, _ := f.store.IssueToken(state.TokenSpec{Purpose: state.PurposePlan, Server: "r1-n01", MAC: "52:54:00:00:00:01"})
			c := &v1.AgentClient{BaseURL: f.srv.URL}
			if mode == api.AttestOff {
				_, err := c.Attest(context.Background(), tok, v1.AttestRequest{BootMAC: "52:54:00:00:00:01"})
				var se *v1.AgentStatusError
				if !errors.As(err, &se) || se.Code != http.StatusConflict || !strings.Contains(se.Body, v1.CodeAttestationOff) {
					t.Fatalf("attest under off = %v, want 409 %s", err, v1.CodeAttestationOff)
				}
			}
			if _, err := c.Plan(context.Background(), tok); err != nil {
				t.Fatalf("plan without a TPM under %q: %v", mode, err)
			}
		})
	}
}

// recorder keeps the bodies of the attestation evidence the agent posts.
type recorder struct {
	evidence [][]byte
}

func (rec *recorder) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == v1.PathAgentAttestQuote && r.Body != nil {
		b, _ := io.ReadAll(r.Body)
		rec.evidence = append(rec.evidence, b)
		r.Body = io.NopCloser(bytes.NewReader(b))
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestCommissioningEnrolsTPMSWTPM: at commissioning under required the
// report is refused until the TPM attested; the attested EK is recorded on
// the server (enrolment, event tpm.enrolled). Replayed evidence, and an
// event log that does not replay, are refused and release nothing: the
// report and wipe plan stay refused, the lifecycle does not move.
func TestCommissioningEnrolsTPMSWTPM(t *testing.T) {
	f := newFixture(t, state.Options{})
	sw := attestationtest.Start(t, false)
	sw.Measure(t, attestationtest.Boot("ipxe.efi", "vmlinuz", "initrd")...)
	tpm, err := agent.OpenTPM(sw.Channel(t))
	if err != nil || tpm == nil {
		t.Fatalf("OpenTPM: %v", err)
	}
	defer tpm.Close()
	m, err := api.NewMachine(api.MachineConfig{Store: f.store, Wiper: fixedWiper{}, AttestPolicy: rules{"r1-n07": {Mode: api.AttestRequired}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Mount(f.api); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.CreateServer(state.Server{Name: "r1-n07", BootMAC: onceMAC}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Transition("r1-n07", state.LifecycleNew, state.LifecycleCommissioning, "test"); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	c := &v1.AgentClient{BaseURL: f.srv.URL, HTTP: &http.Client{Transport: rec}}
	ctx := context.Background()
	tok := issueFor(t, f, state.PurposeReport)
	stillCommissioning := func(why string) {
		t.Helper()
		s, _ := f.store.Server("r1-n07")
		if s.Lifecycle != state.LifecycleCommissioning || s.Hardware != nil {
			t.Fatalf("%s: server %s, hardware %v: changed", why, s.Lifecycle, s.Hardware)
		}
	}
	if _, err := c.Report(ctx, tok, goodReport()); !errors.Is(err, v1.ErrAgentTokenRefused) {
		t.Fatalf("report without attestation = %v, want 403", err)
	}
	stillCommissioning("no attestation")

	// An event log that does not replay (the log the TPM has is swapped
	// for one naming another kernel).
	good := sw.EventLog
	var l attestationtest.Log
	forged := l.Header()
	for _, e := range attestationtest.Boot("ipxe.efi", "other-kernel", "initrd") {
		forged = append(forged, l.Event(e)...)
	}
	sw.EventLog = forged
	if err := tpm.Attest(ctx, c, tok, onceMAC); !errors.Is(err, v1.ErrAgentTokenRefused) {
		t.Fatalf("attest with a forged log = %v, want refused", err)
	}
	sw.EventLog = good
	if _, err := c.Report(ctx, tok, goodReport()); !errors.Is(err, v1.ErrAgentTokenRefused) {
		t.Fatalf("report after a refused log = %v, want 403", err)
	}
	stillCommissioning("log does not replay")
	if got := m.AttestRefusals()["event_log"]; got != 1 {
		t.Errorf("event_log refusals = %d, want 1", got)
	}

	// The good attestation, then the report: ready, EK enrolled.
	if err := tpm.Attest(ctx, c, tok, onceMAC); err != nil {
		t.Fatalf("attest: %v", err)
	}
	ack, err := c.Report(ctx, tok, goodReport())
	if err != nil || ack.Lifecycle != string(state.LifecycleReady) {
		t.Fatalf("report after attestation = %+v, %v", ack, err)
	}
	ek, _ := tpm.EKFingerprint()
	s, _ := f.store.Server("r1-n07")
	if s.TPM == nil || s.TPM.EK != ek {
		t.Fatalf("EK not enrolled: %+v", s.TPM)
	}
	evs, _ := f.store.Events(state.EventQuery{Server: "r1-n07"})
	enrolled := 0
	for _, e := range evs {
		if e.Kind == "tpm.enrolled" && strings.Contains(e.Message, ek) {
			enrolled++
		}
	}
	if enrolled != 1 {
		t.Errorf("tpm.enrolled events = %d, want 1", enrolled)
	}

	// Replayed evidence: the last quote posted again, for the same token
	// and for a fresh wipe token, is refused; the wipe plan stays refused.
	if _, err := f.store.UpdateServer("r1-n07", func(s *state.Server) error { s.NeedsWipe = true; return nil }); err != nil {
		t.Fatal(err)
	}
	wipeTok := issueFor(t, f, state.PurposeWipe)
	last := rec.evidence[len(rec.evidence)-1]
	for _, tk := range []string{tok, wipeTok} {
		code, _, body := f.do(t, http.MethodPost, v1.PathAgentAttestQuote, tk, string(last))
		if code != http.StatusForbidden {
			t.Errorf("replayed evidence: %d %s, want 403", code, body)
		}
	}
	if _, err := c.WipePlan(ctx, wipeTok); !errors.Is(err, v1.ErrAgentTokenRefused) {
		t.Fatalf("wipe plan after replayed evidence = %v, want 403", err)
	}
	if got := m.AttestRefusals()["challenge"]; got != 1 {
		t.Errorf("challenge refusals = %d, want 1 (the used token is refused before)", got)
	}
	if err := tpm.Attest(ctx, c, wipeTok, onceMAC); err != nil {
		t.Fatalf("attest for the wipe: %v", err)
	}
	if p, err := c.WipePlan(ctx, wipeTok); err != nil || p.DoneToken == "" {
		t.Fatalf("wipe plan after attestation = %+v, %v", p, err)
	}
}
