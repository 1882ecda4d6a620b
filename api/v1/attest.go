package v1

import (
	"context"
	"net/http"
)

// TPM 2.0 attestation endpoints of the ramdisk agent. Before a request that
// releases a secret or moves a server (PathAgentReport, PathAgentPlan,
// PathAgentDone, PathAgentWipe), an agent on a machine with a TPM proves
// which TPM it runs on and what the machine booted, in two steps gated by
// the same bearer token as the request that follows (the token is checked,
// not consumed):
//
//	POST PathAgentAttest       AttestRequest (EK, AK)  -> AttestChallenge
//	POST PathAgentAttestQuote  AttestEvidence          -> 204
//
// The controller encrypts a secret to the EK that only a TPM holding both
// the EK and the AK can recover (TPM2_MakeCredential / TPM2_ActivateCredential,
// TPM 2.0 Part 1 §24), and sends a nonce; the agent answers the recovered
// secret with a quote over all PCRs signed by the AK (TPM2_Quote) and the
// firmware's TCG event log (TCG PC Client Platform Firmware Profile §10).
// The controller verifies them, and the next request with the same token
// is then released. A challenge is single-use and short-lived.
const (
	// PathAgentAttest takes an AttestRequest (POST, JSON) and answers an
	// AttestChallenge; 409 with Code CodeAttestationOff when the server's
	// policy is off.
	PathAgentAttest = "/v1/agent/attest"
	// PathAgentAttestQuote takes an AttestEvidence (POST, JSON) and answers
	// 204 when the evidence verifies, 403 (Code CodeAttestationRefused)
	// when not.
	PathAgentAttestQuote = "/v1/agent/attest/quote"
)

// Limits of the attestation bodies.
const (
	// MaxAttestRequestBytes bounds an AttestRequest (64 KiB: an EK
	// certificate is 1-2 KiB).
	MaxAttestRequestBytes = 64 << 10
	// MaxAttestEvidenceBytes bounds an AttestEvidence (2 MiB: a server's
	// firmware event log is 20-200 KiB, base64 adds a third).
	MaxAttestEvidenceBytes = 2 << 20
)

// Error codes of the attestation endpoints (Error.Code).
const (
	// CodeAttestationOff: the server's profile says attestation: off; the
	// agent goes on without it.
	CodeAttestationOff = "attestation_off"
	// CodeAttestationRefused: the TPM's identity or evidence was refused
	// (another EK than the one pinned, a wrong secret, a bad quote, an event
	// log that does not replay, an unknown boot chain).
	CodeAttestationRefused = "attestation_refused"
	// CodeAttestationRequired: the request needs a verified attestation
	// first (policy required, or an EK pinned for the server).
	CodeAttestationRequired = "attestation_required"
)

// AttestRequest names the TPM and a fresh attestation key (AK).
type AttestRequest struct {
	// BootMAC is the NIC the ramdisk booted from, lower-case colon form.
	BootMAC string `json:"bootMAC"`
	// EKPublic is the endorsement key's public key, PKIX DER (RSA 2048 or
	// ECC P-256, TCG EK Credential Profile §2.2.1).
	EKPublic []byte `json:"ekPublic"`
	// EKCertificate is the EK certificate (DER) read from the TPM's NV
	// index (0x01c00002 RSA, 0x01c0000a ECC); empty where the TPM has none.
	EKCertificate []byte `json:"ekCertificate,omitempty"`
	// AK is the attestation key as the TPM created it.
	AK AKParameters `json:"ak"`
}

// AKParameters are the TPM 2.0 structures that describe an AK and prove the
// TPM created it (go-attestation's AttestationParameters): TPMT_PUBLIC,
// TPMS_CREATION_DATA, the TPMS_ATTEST of TPM2_CertifyCreation and its
// signature (TPM 2.0 Part 2 §12.2.4, §15.1, §10.12.12).
type AKParameters struct {
	Public            []byte `json:"public"`
	CreateData        []byte `json:"createData"`
	CreateAttestation []byte `json:"createAttestation"`
	CreateSignature   []byte `json:"createSignature"`
}

// AttestChallenge is the controller's answer to an AttestRequest.
type AttestChallenge struct {
	// ID names the challenge in the AttestEvidence.
	ID string `json:"id"`
	// Credential and Secret are TPM2_MakeCredential's credentialBlob and
	// secret, for TPM2_ActivateCredential with the AK and the EK.
	Credential []byte `json:"credential"`
	Secret     []byte `json:"secret"`
	// Nonce is the qualifying data the quote must carry (32 bytes).
	Nonce []byte `json:"nonce"`
}

// AttestEvidence is the answer to an AttestChallenge.
type AttestEvidence struct {
	// ID is AttestChallenge.ID.
	ID string `json:"id"`
	// Secret is what TPM2_ActivateCredential recovered.
	Secret []byte `json:"secret"`
	// Quotes hold one TPM2_Quote per PCR bank over all PCRs with
	// AttestChallenge.Nonce, signed by the AK: TPMS_ATTEST and TPMT_SIGNATURE.
	Quotes []TPMQuote `json:"quotes"`
	// PCRs are the quoted PCR values.
	PCRs []TPMPCR `json:"pcrs"`
	// EventLog is the firmware's TCG event log
	// (/sys/kernel/security/tpm0/binary_bios_measurements).
	EventLog []byte `json:"eventLog"`
}

// TPMQuote is one TPM2_Quote: the signed TPMS_ATTEST and its TPMT_SIGNATURE.
type TPMQuote struct {
	Quote     []byte `json:"quote"`
	Signature []byte `json:"signature"`
}

// TPMPCR is one PCR's value in one bank.
type TPMPCR struct {
	// Index is the PCR number, 0-23.
	Index int `json:"index"`
	// Alg is the bank: "sha1", "sha256", "sha384" or "sha512".
	Alg string `json:"alg"`
	// Digest is the PCR's value.
	Digest []byte `json:"digest"`
}

// Attest posts req with the bearer token of the request it is for.
func (c *AgentClient) Attest(ctx context.Context, token string, req AttestRequest) (AttestChallenge, error) {
	var ch AttestChallenge
	err := c.do(ctx, "post attest", http.MethodPost, c.URL(PathAgentAttest), token, req, &ch)
	return ch, err
}

// AttestQuote posts the evidence that answers a challenge, with the same token.
func (c *AgentClient) AttestQuote(ctx context.Context, token string, ev AttestEvidence) error {
	return c.do(ctx, "post attest quote", http.MethodPost, c.URL(PathAgentAttestQuote), token, ev, nil)
}
