package agent

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/attestation"
	"github.com/machina-metal/machina/attestation/attestationtest"
)

// TestAttestedRetriesOnceSWTPM: the agent attests with the request's token
// before the request; a request answered 403 attestation_required (a
// controller that took over under HA, with no record of the attestation)
// is attested and sent once more; a second such answer is final.
func TestAttestedRetriesOnceSWTPM(t *testing.T) {
	sw := attestationtest.Start(t, false)
	sw.Measure(t, attestationtest.Boot("ipxe.efi", "vmlinuz", "initrd")...)
	tpm, err := OpenTPM(sw.Channel(t))
	if err != nil || tpm == nil {
		t.Fatalf("OpenTPM = %v, %v", tpm, err)
	}
	defer tpm.Close()
	v := attestation.New(attestation.Config{})
	var attests, plans, refuse atomic.Int32
	mux := http.NewServeMux()
	tokenOf := func(r *http.Request) string { return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ") }
	mux.HandleFunc("POST "+v1.PathAgentAttest, func(w http.ResponseWriter, r *http.Request) {
		var req v1.AttestRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		ch, _, err := v.Challenge("n1", tokenOf(r), "", req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		_ = json.NewEncoder(w).Encode(ch)
	})
	mux.HandleFunc("POST "+v1.PathAgentAttestQuote, func(w http.ResponseWriter, r *http.Request) {
		var ev v1.AttestEvidence
		_ = json.NewDecoder(r.Body).Decode(&ev)
		if _, err := v.Verify("n1", tokenOf(r), ev, attestation.BootChain{}); err != nil {
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		attests.Add(1)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET "+v1.PathAgentPlan, func(w http.ResponseWriter, r *http.Request) {
		plans.Add(1)
		if _, ok := v.Attested("n1", tokenOf(r)); !ok || refuse.Add(-1) >= 0 {
			w.WriteHeader(http.StatusForbidden)
			_ = json.NewEncoder(w).Encode(v1.Error{Message: "attest first", Code: v1.CodeAttestationRequired})
			return
		}
		_ = json.NewEncoder(w).Encode(v1.Plan{ImageURL: "http://x/y"})
	})
	hs := httptest.NewServer(mux)
	defer hs.Close()
	r := &Runner{Client: &v1.AgentClient{BaseURL: hs.URL}, Token: "tok", BootMAC: "52:54:00:00:00:01", TPM: tpm}
	get := func() error {
		return r.attested(context.Background(), r.Token, func() error { _, err := r.Client.Plan(context.Background(), r.Token); return err })
	}
	refuse.Store(1) // the first plan is refused as if the attestation were unknown
	if err := get(); err != nil {
		t.Fatalf("plan after one refusal: %v", err)
	}
	if attests.Load() != 2 || plans.Load() != 2 {
		t.Errorf("attestations %d, plans %d; want 2 and 2", attests.Load(), plans.Load())
	}
	attests.Store(0)
	plans.Store(0)
	refuse.Store(2)
	if err := get(); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("plan refused twice = %v, want the 403", err)
	}
	if attests.Load() != 2 || plans.Load() != 2 {
		t.Errorf("attestations %d, plans %d; want 2 and 2 (one retry)", attests.Load(), plans.Load())
	}
	// Without a TPM the request goes alone.
	r.TPM = nil
	plans.Store(0)
	_ = get()
	if plans.Load() != 1 || attests.Load() != 2 {
		t.Errorf("without a TPM: plans %d, attestations %d", plans.Load(), attests.Load())
	}
}
