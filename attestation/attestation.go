// Package attestation verifies TPM 2.0 evidence for the controller: which TPM a
// machine runs on (its endorsement key, EK, and the EK certificate's chain
// to vendor CAs) and what it booted (a quote over the PCRs, signed by an
// attestation key, AK, proven to live in that TPM, and the firmware's TCG
// event log replayed against the quoted PCRs).
//
// The protocol is that of go-attestation (github.com/google/go-attestation):
// the agent sends the EK and a fresh AK's creation parameters
// (v1.AttestRequest); [Verifier.Challenge] checks the EK and the AK's
// parameters and answers TPM2_MakeCredential's blobs and a nonce
// (v1.AttestChallenge); the agent recovers the secret with
// TPM2_ActivateCredential, which succeeds only in the TPM holding both keys
// (TPM 2.0 Part 1 §24), and quotes the PCRs over the nonce;
// [Verifier.Verify] checks the secret, the quote's signature, nonce and PCR
// digest, replays the event log, and matches the boot chain when the
// controller knows it. A challenge is single-use and expires.
//
// It holds no persistent state: which EK a server must have comes from the
// caller (the inventory's pin), and the EK fingerprint of a verified
// attestation goes back to the caller to record. A leaf: it imports api/v1
// only of the project.
package attestation

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/asn1"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	gattest "github.com/google/go-attestation/attest"

	v1 "github.com/machina-metal/machina/api/v1"
)

// Refusal sentinels; every error Challenge and Verify return wraps one, and
// [Reason] names it for a metric label.
var (
	// ErrEKMismatch: the EK is not the one pinned for the server.
	ErrEKMismatch = errors.New("EK is not the one pinned for this server")
	// ErrEKCertificate: the EK certificate does not chain to a configured
	// vendor CA, does not certify the EK, or is missing while CAs are set.
	ErrEKCertificate = errors.New("EK certificate refused")
	// ErrAKParameters: the AK is not a restricted signing key the TPM
	// created (go-attestation CheckAKParameters), or a field is malformed.
	ErrAKParameters = errors.New("AK parameters refused")
	// ErrChallenge: no such challenge for this server and token: unknown,
	// already used, or expired.
	ErrChallenge = errors.New("challenge unknown, used or expired")
	// ErrActivation: the secret is not the one the credential carried, so
	// the AK is not in the TPM that holds the EK.
	ErrActivation = errors.New("credential activation failed")
	// ErrQuote: a quote's signature, nonce or PCR digest does not verify
	// with the activated AK, or the quotes miss a SHA-256 bank over PCRs 0-9.
	ErrQuote = errors.New("quote refused")
	// ErrEventLog: the event log does not parse or does not replay to the
	// quoted PCRs, or a boot PCR (0-9) holds a value no event explains.
	ErrEventLog = errors.New("event log does not replay")
	// ErrBootChain: the event log names a boot application or initrd the
	// controller did not serve.
	ErrBootChain = errors.New("boot chain not the one served")
)

// Reason names the refusal sentinel err wraps ("ek_mismatch", "quote", ...),
// for a metric label; "other" when none.
func Reason(err error) string {
	for _, r := range []struct {
		err  error
		name string
	}{{ErrEKMismatch, "ek_mismatch"}, {ErrEKCertificate, "ek_certificate"}, {ErrAKParameters, "ak_parameters"},
		{ErrChallenge, "challenge"}, {ErrActivation, "activation"}, {ErrQuote, "quote"}, {ErrEventLog, "event_log"},
		{ErrBootChain, "boot_chain"}} {
		if errors.Is(err, r.err) {
			return r.name
		}
	}
	return "other"
}

// Reasons lists every value [Reason] returns, for pre-declaring metric labels.
var Reasons = []string{"ek_mismatch", "ek_certificate", "ak_parameters", "challenge", "activation", "quote", "event_log", "boot_chain", "other"}

// Fingerprint is the EK's identity as the inventory pins it: "sha256:" and
// the lower-case hex SHA-256 of the public key's PKIX DER
// (SubjectPublicKeyInfo, RFC 5280 §4.1.2.7).
func Fingerprint(ekPKIX []byte) string {
	h := sha256.Sum256(ekPKIX)
	return "sha256:" + hex.EncodeToString(h[:])
}

// Config configures a Verifier. The zero value is usable: no vendor CAs
// (EK certificates are not required; the EK is identified by its
// fingerprint alone), 2-minute challenges, 4096 pending at most.
type Config struct {
	// EKRoots are the TPM vendors' EK CA certificates the operator trusts.
	// When set, an EK must come with a certificate that chains to one of
	// them (through EKIntermediates) and certifies that EK; when empty,
	// certificates are not checked.
	EKRoots []*x509.Certificate
	// EKIntermediates are intermediate CA certificates for the chains.
	EKIntermediates []*x509.Certificate
	// ChallengeTTL bounds how long a challenge can be answered, and how
	// long a verified attestation releases the request that follows; zero
	// means 2 minutes.
	ChallengeTTL time.Duration
	// MaxPending bounds the outstanding challenges and verified
	// attestations (each); the oldest is dropped past it. Zero means 4096.
	MaxPending int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// BootChain is what the controller served a server to boot, as the
// firmware and the Linux EFI stub measure it. The zero value checks
// nothing beyond the replay.
type BootChain struct {
	// Applications are the SHA-256 digests of the EFI applications the
	// firmware may start (the boot loader, and a kernel started through
	// LoadImage), as UEFI measures them into PCR 4 with
	// EV_EFI_BOOT_SERVICES_APPLICATION: the PE image's Authenticode hash
	// (TCG PC Client PFP §10.4.4, UEFI §32.2.3). When set, the log must
	// hold at least one such event and every one must be in this set.
	Applications [][]byte
	// Initrds are the SHA-256 digests of the initrds the controller
	// served, as Linux's EFI stub (5.17 and later) measures the initrd it
	// loads through LoadFile2 into PCR 9 (EV_EVENT_TAG, "Linux initrd").
	// When set, every such event must be in this set. GRUB's initrds (the
	// Secure Boot chain) are matched here too: see Kernels.
	Initrds [][]byte
	// Kernels are the SHA-256 digests of the kernel files the controller
	// served, as GRUB 2.06's tpm module measures every file it reads into
	// PCR 9 (EV_IPL, the event data the path as the command named it)
	// after logging the command itself into PCR 8 (EV_IPL,
	// "grub_cmd: linux PATH ARGS"; recorded from Debian 12's signed
	// grubnetx64 2.06-13+deb12u2 under OVMF and swtpm). The PCR 9 event
	// whose path a `linux` command named is the kernel, checked against
	// this set when it is set; one an `initrd` command named is an initrd,
	// checked against Initrds. Other files GRUB reads (its configuration
	// and the per-machine script, which holds a single-use token) are
	// measured but not matched: under Secure Boot they can only start
	// what shim verifies.
	Kernels [][]byte
}

// Result is a verified attestation.
type Result struct {
	// EK is the EK's Fingerprint.
	EK string
	// EKIssuer is the EK certificate's issuer (RFC 2253), "" without one.
	EKIssuer string
	// Applications are the hex SHA-256 digests of the replayed
	// EV_EFI_BOOT_SERVICES_APPLICATION events, in log order.
	Applications []string
	// Kernels are the hex SHA-256 digests of the kernels GRUB loaded
	// (BootChain.Kernels), in log order; empty when no GRUB booted.
	Kernels []string
	// Events is the number of replayed events.
	Events int
}

type challenge struct {
	server, binding string
	ek              string
	issuer          string
	secret, nonce   []byte
	akPublic        []byte
	expires         time.Time
}

type verified struct {
	server  string
	res     Result
	expires time.Time
}

// Verifier issues and checks challenges. Safe for concurrent use. Its
// state (outstanding challenges, fresh results) is in memory: a controller
// that restarts or loses leadership forgets them, and the agent's retry
// starts a new challenge.
type Verifier struct {
	cfg   Config
	roots *x509.CertPool
	inter *x509.CertPool

	mu       sync.Mutex
	pending  map[string]*challenge
	order    []string
	verified map[string]verified // by binding
	vorder   []string
}

// New returns a Verifier for cfg.
func New(cfg Config) *Verifier {
	if cfg.ChallengeTTL <= 0 {
		cfg.ChallengeTTL = 2 * time.Minute
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = 4096
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	v := &Verifier{cfg: cfg, pending: map[string]*challenge{}, verified: map[string]verified{}}
	if len(cfg.EKRoots) > 0 {
		v.roots, v.inter = x509.NewCertPool(), x509.NewCertPool()
		for _, c := range cfg.EKRoots {
			v.roots.AddCert(c)
		}
		for _, c := range cfg.EKIntermediates {
			v.inter.AddCert(c)
		}
	}
	return v
}

// Challenge checks req's EK (against pinned, a Fingerprint, when not "";
// against the vendor CAs when configured) and AK, and answers a challenge
// bound to server and binding (the bearer token's ID): only Verify with
// both the same may answer it. It returns the EK's fingerprint with the
// challenge, and with an ErrEKMismatch refusal so that the caller can
// record what was seen.
func (v *Verifier) Challenge(server, binding, pinned string, req v1.AttestRequest) (v1.AttestChallenge, string, error) {
	pub, err := x509.ParsePKIXPublicKey(req.EKPublic)
	if err != nil {
		return v1.AttestChallenge{}, "", fmt.Errorf("attestation: ekPublic: %w: %v", ErrEKCertificate, err)
	}
	fp := Fingerprint(req.EKPublic)
	if pinned != "" && !strings.EqualFold(pinned, fp) {
		return v1.AttestChallenge{}, fp, fmt.Errorf("attestation: EK %s, pinned %s: %w", fp, pinned, ErrEKMismatch)
	}
	issuer, err := v.checkEKCertificate(pub, req.EKCertificate)
	if err != nil {
		return v1.AttestChallenge{}, fp, err
	}
	ap := gattest.ActivationParameters{EK: pub, AK: gattest.AttestationParameters{Public: req.AK.Public,
		CreateData: req.AK.CreateData, CreateAttestation: req.AK.CreateAttestation, CreateSignature: req.AK.CreateSignature}}
	secret, ec, err := ap.Generate()
	if err != nil {
		return v1.AttestChallenge{}, fp, fmt.Errorf("attestation: %w: %v", ErrAKParameters, err)
	}
	nonce := make([]byte, 32)
	id := make([]byte, 16)
	if _, err := rand.Read(nonce); err != nil {
		return v1.AttestChallenge{}, fp, fmt.Errorf("attestation: nonce: %w", err)
	}
	_, _ = rand.Read(id)
	c := &challenge{server: server, binding: binding, ek: fp, issuer: issuer, secret: secret, nonce: nonce,
		akPublic: req.AK.Public, expires: v.cfg.Now().Add(v.cfg.ChallengeTTL)}
	key := hex.EncodeToString(id)
	v.mu.Lock()
	v.pending[key] = c
	v.order = bound(append(v.order, key), v.cfg.MaxPending, func(k string) { delete(v.pending, k) })
	v.mu.Unlock()
	return v1.AttestChallenge{ID: key, Credential: ec.Credential, Secret: ec.Secret, Nonce: nonce}, fp, nil
}

// bound drops the oldest keys of order past max, calling drop for each.
func bound(order []string, max int, drop func(string)) []string {
	for len(order) > max {
		drop(order[0])
		order = order[1:]
	}
	return order
}

// oidSAN is subjectAltName (RFC 5280 §4.2.1.6). TCG EK certificates carry
// the TPM's manufacturer, model and version in it as a directoryName and
// mark it critical when the subject is empty (TCG EK Credential Profile
// §3.2.9), which crypto/x509 does not parse; the chain is still checked.
var oidSAN = asn1.ObjectIdentifier{2, 5, 29, 17}

// checkEKCertificate verifies certDER chains to a vendor root and
// certifies pub; with no roots configured it checks nothing. It returns
// the issuer.
func (v *Verifier) checkEKCertificate(pub crypto.PublicKey, certDER []byte) (string, error) {
	if v.roots == nil {
		if len(certDER) == 0 {
			return "", nil
		}
		cert, err := gattest.ParseEKCertificate(certDER)
		if err != nil {
			return "", nil // informational only without CAs
		}
		return cert.Issuer.String(), nil
	}
	if len(certDER) == 0 {
		return "", fmt.Errorf("attestation: vendor CAs are configured and the TPM sent no EK certificate: %w", ErrEKCertificate)
	}
	cert, err := gattest.ParseEKCertificate(certDER)
	if err != nil {
		return "", fmt.Errorf("attestation: %w: %v", ErrEKCertificate, err)
	}
	cert.UnhandledCriticalExtensions = slices.DeleteFunc(slices.Clone(cert.UnhandledCriticalExtensions),
		func(o asn1.ObjectIdentifier) bool { return o.Equal(oidSAN) })
	if _, err := cert.Verify(x509.VerifyOptions{Roots: v.roots, Intermediates: v.inter, CurrentTime: v.cfg.Now(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return "", fmt.Errorf("attestation: %w: %v", ErrEKCertificate, err)
	}
	certPub, err := x509.MarshalPKIXPublicKey(cert.PublicKey)
	if err != nil {
		return "", fmt.Errorf("attestation: %w: certificate key: %v", ErrEKCertificate, err)
	}
	ekPub, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil || !bytes.Equal(certPub, ekPub) {
		return "", fmt.Errorf("attestation: %w: the certificate is for another key", ErrEKCertificate)
	}
	return cert.Issuer.String(), nil
}

// bootPCRs are the PCRs of the static root of trust: firmware (0-7) and
// the boot loader's measurements (8-9). A non-zero value among them that
// no event explains means the log is incomplete.
const bootPCRs = 10

// Verify checks ev against the challenge it answers, which must have been
// issued for server and binding; the challenge is used up whatever the
// outcome (an answer naming another server or binding does not use it). On success the result is also kept for binding until the
// challenge's TTL (see [Verifier.Attested]).
func (v *Verifier) Verify(server, binding string, ev v1.AttestEvidence, chain BootChain) (Result, error) {
	v.mu.Lock()
	c, ok := v.pending[ev.ID]
	// Only an answer with the challenge's own server and token uses it
	// up: another token cannot spend a machine's challenge.
	ok = ok && c.server == server && c.binding == binding
	if ok {
		delete(v.pending, ev.ID)
		v.order = slices.DeleteFunc(v.order, func(k string) bool { return k == ev.ID })
	}
	v.mu.Unlock()
	if !ok || v.cfg.Now().After(c.expires) {
		return Result{}, fmt.Errorf("attestation: %w", ErrChallenge)
	}
	if subtle.ConstantTimeCompare(c.secret, ev.Secret) != 1 {
		return Result{}, fmt.Errorf("attestation: %w: the secret does not match", ErrActivation)
	}
	res, err := verifyPlatform(c.akPublic, c.nonce, ev, chain)
	if err != nil {
		return Result{}, err
	}
	res.EK, res.EKIssuer = c.ek, c.issuer
	v.mu.Lock()
	if _, seen := v.verified[binding]; !seen {
		v.vorder = bound(append(v.vorder, binding), v.cfg.MaxPending, func(k string) { delete(v.verified, k) })
	}
	v.verified[binding] = verified{server: server, res: res, expires: c.expires}
	v.mu.Unlock()
	return res, nil
}

// Take returns the result of a verified attestation for server and
// binding that has not expired, and forgets it: one attestation releases
// one answer. A request sent again with the same binding (a retry, or a
// replay captured off the network) needs a new attestation over a new
// nonce, which only the TPM holding the enrolled AK can give.
func (v *Verifier) Take(server, binding string) (Result, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	res, ok := v.attestedLocked(server, binding)
	if ok {
		delete(v.verified, binding)
	}
	return res, ok
}

// Attested returns the result of a verified attestation for server and
// binding that has not expired.
func (v *Verifier) Attested(server, binding string) (Result, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.attestedLocked(server, binding)
}

// attestedLocked is Attested with v.mu held.
func (v *Verifier) attestedLocked(server, binding string) (Result, bool) {
	a, ok := v.verified[binding]
	if !ok || a.server != server || v.cfg.Now().After(a.expires) {
		return Result{}, false
	}
	return a.res, true
}

// verifyPlatform checks the quotes with the AK over nonce, replays the
// event log and matches chain.
func verifyPlatform(akPublic, nonce []byte, ev v1.AttestEvidence, chain BootChain) (Result, error) {
	ak, err := gattest.ParseAKPublic(akPublic)
	if err != nil {
		return Result{}, fmt.Errorf("attestation: %w: AK public: %v", ErrQuote, err)
	}
	if len(ev.Quotes) == 0 {
		return Result{}, fmt.Errorf("attestation: %w: no quote", ErrQuote)
	}
	quotes := make([]gattest.Quote, len(ev.Quotes))
	for i, q := range ev.Quotes {
		quotes[i] = gattest.Quote{Quote: q.Quote, Signature: q.Signature}
	}
	pcrs := make([]gattest.PCR, 0, len(ev.PCRs))
	for _, p := range ev.PCRs {
		h, ok := map[string]crypto.Hash{"sha1": crypto.SHA1, "sha256": crypto.SHA256, "sha384": crypto.SHA384, "sha512": crypto.SHA512}[p.Alg]
		if !ok || p.Index < 0 || p.Index > 23 || len(p.Digest) != h.Size() {
			return Result{}, fmt.Errorf("attestation: %w: PCR %d %q: bad bank or digest size", ErrQuote, p.Index, p.Alg)
		}
		pcrs = append(pcrs, gattest.PCR{Index: p.Index, Digest: p.Digest, DigestAlg: h})
	}
	if err := ak.VerifyAll(quotes, pcrs, nonce); err != nil {
		return Result{}, fmt.Errorf("attestation: %w: %v", ErrQuote, err)
	}
	// Only PCRs a quote covered count, and the SHA-256 bank must cover the
	// boot PCRs: the log is replayed against it.
	var sha256PCRs []gattest.PCR
	for _, p := range pcrs {
		if p.DigestAlg == crypto.SHA256 && p.QuoteVerified() {
			sha256PCRs = append(sha256PCRs, p)
		}
	}
	quoted := map[int][]byte{}
	for _, p := range sha256PCRs {
		quoted[p.Index] = p.Digest
	}
	for i := range bootPCRs {
		if _, ok := quoted[i]; !ok {
			return Result{}, fmt.Errorf("attestation: %w: the SHA-256 bank's quote does not cover PCR %d", ErrQuote, i)
		}
	}
	el, err := gattest.ParseEventLog(ev.EventLog)
	if err != nil {
		return Result{}, fmt.Errorf("attestation: %w: %v", ErrEventLog, err)
	}
	events, err := el.Verify(sha256PCRs)
	if err != nil {
		return Result{}, fmt.Errorf("attestation: %w: %v", ErrEventLog, err)
	}
	// go-attestation replays the PCRs that have events; a boot PCR with a
	// value but no event would pass it, so an empty or truncated log must
	// not: every non-zero boot PCR needs an event.
	seen := map[int]bool{}
	for _, e := range events {
		seen[e.Index] = true
	}
	zero := make([]byte, sha256.Size)
	for i := range bootPCRs {
		if !seen[i] && !bytes.Equal(quoted[i], zero) {
			return Result{}, fmt.Errorf("attestation: %w: PCR %d is %x but the log has no event for it", ErrEventLog, i, quoted[i])
		}
	}
	res := Result{Events: len(events)}
	if err := matchChain(events, chain, &res); err != nil {
		return Result{}, err
	}
	return res, nil
}

// TCG PC Client PFP event types (§10.4.1, Table 9) that matchChain reads.
const (
	evIPL                        gattest.EventType = 0x0000000d
	pcrGRUBCommands                                = 8
	evEventTag                   gattest.EventType = 0x00000006
	evEFIBootServicesApplication gattest.EventType = 0x80000003
	pcrBootApplications                            = 4
	pcrKernelData                                  = 9
	linuxInitrdTag                                 = "Linux initrd"
)

// matchChain records the replayed boot applications in res and checks them
// and the initrd against chain.
func matchChain(events []gattest.Event, chain BootChain, res *Result) error {
	known := func(set [][]byte, d []byte) bool {
		return slices.ContainsFunc(set, func(k []byte) bool { return bytes.Equal(k, d) })
	}
	var grub grubFiles
	for _, e := range events {
		switch {
		case e.Index == pcrGRUBCommands && e.Type == evIPL:
			grub.command(e.Data)
		case e.Index == pcrKernelData && e.Type == evIPL:
			switch grub.kind(e.Data) {
			case "kernel":
				res.Kernels = append(res.Kernels, hex.EncodeToString(e.Digest))
				if len(chain.Kernels) > 0 && !known(chain.Kernels, e.Digest) {
					return fmt.Errorf("attestation: %w: kernel %x (GRUB, %s) was not served", ErrBootChain, e.Digest, eventPath(e.Data))
				}
			case "initrd":
				if len(chain.Initrds) > 0 && !known(chain.Initrds, e.Digest) {
					return fmt.Errorf("attestation: %w: initrd %x (GRUB, %s) was not served", ErrBootChain, e.Digest, eventPath(e.Data))
				}
			}
		case e.Index == pcrBootApplications && e.Type == evEFIBootServicesApplication:
			res.Applications = append(res.Applications, hex.EncodeToString(e.Digest))
			if len(chain.Applications) > 0 && !known(chain.Applications, e.Digest) {
				return fmt.Errorf("attestation: %w: boot application %x was not served", ErrBootChain, e.Digest)
			}
		case e.Index == pcrKernelData && e.Type == evEventTag && bytes.Contains(e.Data, []byte(linuxInitrdTag)):
			if len(chain.Initrds) > 0 && !known(chain.Initrds, e.Digest) {
				return fmt.Errorf("attestation: %w: initrd %x was not served", ErrBootChain, e.Digest)
			}
		}
	}
	if len(chain.Applications) > 0 && len(res.Applications) == 0 {
		return fmt.Errorf("attestation: %w: the log names no boot application", ErrBootChain)
	}
	return nil
}

// grubFiles remembers the paths GRUB's `linux` and `initrd` commands named
// (PCR 8 "grub_cmd: ..." events), to tell the kernel and initrd among the
// files GRUB measures into PCR 9. Debian's GRUB also knows the commands as
// linuxefi and initrdefi.
type grubFiles struct {
	kernels, initrds []string
}

func (g *grubFiles) command(data []byte) {
	cmd, ok := bytes.CutPrefix(bytes.TrimRight(data, "\x00"), []byte("grub_cmd: "))
	if !ok {
		return
	}
	f := strings.Fields(string(cmd))
	if len(f) < 2 {
		return
	}
	switch f[0] {
	case "linux", "linuxefi":
		g.kernels = append(g.kernels, f[1])
	case "initrd", "initrdefi":
		for _, p := range f[1:] {
			if !strings.HasPrefix(p, "-") { // GRUB 2.06 initrd options: --newc:NAME
				g.initrds = append(g.initrds, p)
			}
		}
	}
}

// kind returns "kernel" or "initrd" when a PCR 9 file event's path is one
// a command named, "" otherwise.
func (g *grubFiles) kind(data []byte) string {
	p := eventPath(data)
	switch {
	case slices.Contains(g.kernels, p):
		return "kernel"
	case slices.Contains(g.initrds, p):
		return "initrd"
	}
	return ""
}

// eventPath is a GRUB file event's path: the event data without its NUL.
func eventPath(data []byte) string { return string(bytes.TrimRight(data, "\x00")) }
