package gitops

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/machina-metal/machina/state"
)

// TestStatusTPM: a server's attested EK is in its status file as tpm.ek
// (the value to pin in servers.yaml), without the attestation time; an
// attestation refused for another EK is a TPMAttested=False condition.
func TestStatusTPM(t *testing.T) {
	ek := "sha256:" + strings.Repeat("ab", 32)
	b := &StatusBuilder{since: map[string]time.Time{}}
	s := state.Server{Name: "r1-n01", Lifecycle: state.LifecycleReady, TPM: &state.TPM{EK: ek, EKIssuer: "CN=vendor", AttestedAt: time.Now()}}
	ss := b.serverStatus(&s, nil, time.Now(), map[string]bool{})
	out := renderServer(ss, 0)
	var v map[string]any
	if err := yamlUnmarshal(out, &v); err != nil {
		t.Fatalf("does not parse: %v\n%s", err, out)
	}
	if d := cmp.Diff(map[string]any{"ek": ek, "ekIssuer": "CN=vendor"}, v["tpm"]); d != "" {
		t.Errorf("tpm block (-want +got):\n%s\n%s", d, out)
	}
	for _, c := range ss.Conditions {
		if c.Type == "TPMAttested" {
			t.Errorf("condition %+v without a refusal", c)
		}
	}
	s.TPM.Refused, s.TPM.RefusedEK, s.TPM.RefusedAt = "attestation refused: EK is not the one pinned", "sha256:"+strings.Repeat("cd", 32), time.Now()
	ss = b.serverStatus(&s, nil, time.Now(), map[string]bool{})
	found := false
	for _, c := range ss.Conditions {
		if c.Type == "TPMAttested" && c.Status == "False" && c.Reason == "EKMismatch" && strings.Contains(c.Message, "pinned") {
			found = true
		}
	}
	if !found {
		t.Errorf("no TPMAttested=False condition: %+v", ss.Conditions)
	}
	if out := renderServer(ServerStatus{Name: "r1-n02", Lifecycle: "ready"}, 0); yamlHasKey(t, out, "tpm") {
		t.Errorf("a server never attested has a tpm block:\n%s", out)
	}
}
