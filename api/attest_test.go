package api_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

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

	// The right TPM: attested, then the plan is released once.
	if err := tpm.Attest(ctx, c, tok, mac); err != nil {
		t.Fatalf("attest: %v", err)
	}
	p, err := c.Plan(ctx, tok)
	if err != nil || p.Seed.JoinToken == "" || p.DoneToken == "" {
		t.Fatalf("plan after attestation = %+v, %v", p, err)
	}
	s, _ = f.store.Server("r1-n01")
	if s.TPM == nil || s.TPM.EK != ek || s.TPM.Refused != "" || len(s.TPM.BootApplications) != 2 {
		t.Errorf("server TPM = %+v, want EK %s recorded", s.TPM, ek)
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
