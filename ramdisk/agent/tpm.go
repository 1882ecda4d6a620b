package agent

import (
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/google/go-attestation/attest"

	v1 "github.com/machina-metal/machina/api/v1"
)

// TPM is the machine's TPM 2.0 as the agent uses it for attestation
// (api/v1 attest.go): its endorsement key (EK) and certificate, and an
// attestation key (AK) created for this boot. The AK is a restricted
// signing key under the TPM's storage root key; it is never written
// anywhere: each boot creates one and proves it to the controller by
// credential activation against the EK. Safe for concurrent use (calls
// are serialised: a TPM runs one command at a time).
type TPM struct {
	mu  sync.Mutex
	tpm *attest.TPM
	ek  attest.EK
	ak  *attest.AK
}

// OpenTPM opens the TPM 2.0 through cc, or the kernel's resource manager
// (/dev/tpmrm0, whose event log is
// /sys/kernel/security/tpm0/binary_bios_measurements) when cc is nil, reads
// the EK and creates an AK. It returns (nil, nil) when the machine has no
// TPM 2.0: the agent goes on without attestation, which the controller
// accepts only where the server's policy is optional or off.
func OpenTPM(cc attest.CommandChannelTPM20) (*TPM, error) {
	cfg := &attest.OpenConfig{CommandChannel: cc}
	t, err := attest.OpenTPM(cfg)
	if errors.Is(err, attest.ErrTPMNotAvailable) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("tpm: open: %w", err)
	}
	eks, err := t.EKs()
	if err != nil || len(eks) == 0 {
		_ = t.Close()
		return nil, fmt.Errorf("tpm: read EK: %v (%d found)", err, len(eks))
	}
	ek := eks[0]
	for _, e := range eks {
		// Prefer the EK that has a certificate: the controller may check
		// it against the vendor's CA.
		if e.Certificate != nil {
			ek = e
			break
		}
	}
	ak, err := t.NewAK(nil)
	if err != nil {
		_ = t.Close()
		return nil, fmt.Errorf("tpm: create AK: %w", err)
	}
	return &TPM{tpm: t, ek: ek, ak: ak}, nil
}

// Close flushes the AK and closes the TPM.
func (t *TPM) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return errors.Join(t.ak.Close(t.tpm), t.tpm.Close())
}

// EKFingerprint is the EK's identity as the inventory pins it: "sha256:"
// and the hex SHA-256 of the public key's PKIX DER.
func (t *TPM) EKFingerprint() (string, error) {
	der, err := x509.MarshalPKIXPublicKey(t.ek.Public)
	if err != nil {
		return "", fmt.Errorf("tpm: EK public: %w", err)
	}
	return fingerprint(der), nil
}

// Attest proves to the controller, for the request token gates, which TPM
// this is and what the machine booted: it sends the EK and AK, activates
// the credential the controller answers, and quotes all PCRs over its
// nonce with the firmware's event log. It returns nil when the server's
// policy is off (v1.CodeAttestationOff), and an error wrapping
// v1.ErrAgentTokenRefused when the controller refused the evidence.
func (t *TPM) Attest(ctx context.Context, c *v1.AgentClient, token, bootMAC string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	ekDER, err := x509.MarshalPKIXPublicKey(t.ek.Public)
	if err != nil {
		return fmt.Errorf("tpm: EK public: %w", err)
	}
	req := v1.AttestRequest{BootMAC: bootMAC, EKPublic: ekDER}
	if t.ek.Certificate != nil {
		req.EKCertificate = t.ek.Certificate.Raw
	}
	p := t.ak.AttestationParameters()
	req.AK = v1.AKParameters{Public: p.Public, CreateData: p.CreateData, CreateAttestation: p.CreateAttestation, CreateSignature: p.CreateSignature}
	ch, err := c.Attest(ctx, token, req)
	var se *v1.AgentStatusError
	if errors.As(err, &se) && se.Code == http.StatusConflict && strings.Contains(se.Body, v1.CodeAttestationOff) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("tpm: attest: %w", err)
	}
	secret, err := t.ak.ActivateCredentialWithEK(t.tpm, attest.EncryptedCredential{Credential: ch.Credential, Secret: ch.Secret}, t.ek)
	if err != nil {
		return fmt.Errorf("tpm: activate credential: %w", err)
	}
	pp, err := t.tpm.AttestPlatform(t.ak, ch.Nonce, nil)
	if err != nil {
		return fmt.Errorf("tpm: quote: %w", err)
	}
	ev := v1.AttestEvidence{ID: ch.ID, Secret: secret, EventLog: pp.EventLog}
	for _, q := range pp.Quotes {
		ev.Quotes = append(ev.Quotes, v1.TPMQuote{Quote: q.Quote, Signature: q.Signature})
	}
	for _, pcr := range pp.PCRs {
		alg, ok := map[crypto.Hash]string{crypto.SHA1: "sha1", crypto.SHA256: "sha256", crypto.SHA384: "sha384", crypto.SHA512: "sha512"}[pcr.DigestAlg]
		if !ok {
			continue
		}
		ev.PCRs = append(ev.PCRs, v1.TPMPCR{Index: pcr.Index, Alg: alg, Digest: pcr.Digest})
	}
	if err := c.AttestQuote(ctx, token, ev); err != nil {
		return fmt.Errorf("tpm: attest quote: %w", err)
	}
	return nil
}

// fingerprint is attest.Fingerprint (the agent links api/v1 only of the
// project): "sha256:" and the hex SHA-256 of a PKIX DER public key.
func fingerprint(der []byte) string {
	h := sha256.Sum256(der)
	return "sha256:" + hex.EncodeToString(h[:])
}

// attested runs r.TPM's attestation for the request token gates, then
// the request (f); nothing but f without a TPM. A request answered 403
// attestation_required (the attestation expired, or a controller that took
// over under HA does not know it) attests once more and is sent again.
func (r *Runner) attested(ctx context.Context, token string, f func() error) error {
	if r.TPM == nil {
		return f()
	}
	for attempt := 0; ; attempt++ {
		if err := r.TPM.Attest(ctx, r.Client, token, r.BootMAC); err != nil {
			return err
		}
		err := f()
		var se *v1.AgentStatusError
		if attempt == 0 && errors.As(err, &se) && se.Code == http.StatusForbidden && strings.Contains(se.Body, v1.CodeAttestationRequired) {
			r.log().Warn("controller asks for a new attestation; attesting again", "err", err)
			continue
		}
		return err
	}
}
