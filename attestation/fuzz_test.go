package attestation

import (
	"encoding/json"
	"os"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
)

// FuzzAttestRequest: a machine's attestation request (EK, certificate, AK
// parameters), decoded as the endpoint does, never panics Challenge;
// whatever it answers, a challenge only comes with a nil error.
func FuzzAttestRequest(f *testing.F) {
	f.Add([]byte(`{"bootMAC":"52:54:00:00:00:01","ekPublic":"MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA","ak":{"public":"AAEACw=="}}`))
	f.Add([]byte(`{"ekPublic":"","ekCertificate":"MIIB","ak":{}}`))
	v := New(Config{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > v1.MaxAttestRequestBytes {
			return
		}
		var req v1.AttestRequest
		if json.Unmarshal(b, &req) != nil {
			return
		}
		ch, _, err := v.Challenge("n1", "t", "", req)
		if (err == nil) != (ch.ID != "") {
			t.Fatalf("Challenge = %+v, %v", ch, err)
		}
	})
}

// FuzzEvidence: quotes, PCRs and an event log from the machine never panic
// the verification, and never verify against an AK that signed nothing.
func FuzzEvidence(f *testing.F) {
	log, err := os.ReadFile("testdata/ubuntu_2104_shielded_vm_no_secure_boot_eventlog")
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte("AAEACw=="), []byte{0xff, 0x54, 0x43, 0x47}, []byte{0, 0x14}, log)
	f.Add([]byte{}, []byte{}, []byte{}, []byte{})
	f.Fuzz(func(t *testing.T, akPublic, quote, sig, eventLog []byte) {
		if len(eventLog) > v1.MaxAttestEvidenceBytes {
			return
		}
		ev := v1.AttestEvidence{Quotes: []v1.TPMQuote{{Quote: quote, Signature: sig}}, EventLog: eventLog,
			PCRs: []v1.TPMPCR{{Index: 0, Alg: "sha256", Digest: make([]byte, 32)}}}
		if _, err := verifyPlatform(akPublic, []byte("nonce"), ev, BootChain{}); err == nil {
			t.Fatal("evidence with no valid AK signature verified")
		}
	})
}
