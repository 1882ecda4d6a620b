package state

import "time"

// TPM is what the controller verified of a server's TPM 2.0 (package
// attestation): the EK it attested with last, and the last refused
// attestation whose EK was not the one pinned in servers.yaml.
type TPM struct {
	// EK is the endorsement key's fingerprint ("sha256:" and the hex
	// SHA-256 of its PKIX DER) from the last verified attestation; ""
	// before one.
	EK string `json:"ek,omitempty"`
	// EKIssuer is the EK certificate's issuer, "" without a certificate.
	EKIssuer string `json:"ekIssuer,omitempty"`
	// AttestedAt is when the last attestation verified (UTC).
	AttestedAt time.Time `json:"attestedAt,omitzero"`
	// BootApplications are the hex SHA-256 digests of the EFI
	// applications the last verified event log names (PCR 4).
	BootApplications []string `json:"bootApplications,omitempty"`
	// Refused is why the last attestation with another EK than the pinned
	// one was refused, RefusedEK that EK, RefusedAt when; cleared when an
	// attestation with the pinned EK verifies.
	Refused   string    `json:"refused,omitempty"`
	RefusedEK string    `json:"refusedEK,omitempty"`
	RefusedAt time.Time `json:"refusedAt,omitzero"`
	// Proposed is the EK whose servers.yaml pin was proposed for review,
	// on ProposalBranch; "" before a proposal.
	Proposed       string `json:"proposed,omitempty"`
	ProposalBranch string `json:"proposalBranch,omitempty"`
}
