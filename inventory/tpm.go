package inventory

// TPM is a server's pinned TPM 2.0 (servers.yaml tpm:).
type TPM struct {
	// EK is the endorsement key's fingerprint: "sha256:" and the lower-case
	// hex SHA-256 of the EK public key's PKIX DER (package attestation's
	// Fingerprint). A machine whose TPM has another EK is refused.
	EK string `json:"ek"`
}
