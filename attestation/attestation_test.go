package attestation_test

import (
	"crypto"
	"crypto/x509"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	gattest "github.com/google/go-attestation/attest"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/attestation"
	"github.com/machina-metal/machina/attestation/attestationtest"
)

// machine plays the agent's part with go-attestation against a swtpm.
type machine struct {
	t   *testing.T
	sw  *attestationtest.SWTPM
	tpm *gattest.TPM
	ek  gattest.EK
	ak  *gattest.AK
}

func newMachine(t *testing.T, sw *attestationtest.SWTPM) *machine {
	t.Helper()
	tpm, err := gattest.OpenTPM(&gattest.OpenConfig{CommandChannel: sw.Channel(t)})
	if err != nil {
		t.Fatalf("OpenTPM: %v", err)
	}
	t.Cleanup(func() { _ = tpm.Close() })
	eks, err := tpm.EKs()
	if err != nil || len(eks) == 0 {
		t.Fatalf("EKs: %v, %d", err, len(eks))
	}
	ak, err := tpm.NewAK(nil)
	if err != nil {
		t.Fatalf("NewAK: %v", err)
	}
	return &machine{t: t, sw: sw, tpm: tpm, ek: eks[0], ak: ak}
}

func (m *machine) request() v1.AttestRequest {
	der, err := x509.MarshalPKIXPublicKey(m.ek.Public)
	if err != nil {
		m.t.Fatal(err)
	}
	p := m.ak.AttestationParameters()
	req := v1.AttestRequest{EKPublic: der, AK: v1.AKParameters{Public: p.Public, CreateData: p.CreateData, CreateAttestation: p.CreateAttestation, CreateSignature: p.CreateSignature}}
	if m.ek.Certificate != nil {
		req.EKCertificate = m.ek.Certificate.Raw
	}
	return req
}

// answer activates ch's credential and quotes over its nonce with ak.
func (m *machine) answer(ch v1.AttestChallenge, ak *gattest.AK) v1.AttestEvidence {
	m.t.Helper()
	secret, err := m.ak.ActivateCredentialWithEK(m.tpm, gattest.EncryptedCredential{Credential: ch.Credential, Secret: ch.Secret}, m.ek)
	if err != nil {
		m.t.Fatalf("ActivateCredential: %v", err)
	}
	pp, err := m.tpm.AttestPlatform(ak, ch.Nonce, nil)
	if err != nil {
		m.t.Fatalf("AttestPlatform: %v", err)
	}
	ev := v1.AttestEvidence{ID: ch.ID, Secret: secret, EventLog: pp.EventLog}
	for _, q := range pp.Quotes {
		ev.Quotes = append(ev.Quotes, v1.TPMQuote{Quote: q.Quote, Signature: q.Signature})
	}
	for _, p := range pp.PCRs {
		alg := map[crypto.Hash]string{crypto.SHA1: "sha1", crypto.SHA256: "sha256"}[p.DigestAlg]
		ev.PCRs = append(ev.PCRs, v1.TPMPCR{Index: p.Index, Alg: alg, Digest: p.Digest})
	}
	return ev
}

func served() attestation.BootChain {
	return attestation.BootChain{Applications: [][]byte{attestationtest.Sum("ipxe.efi"), attestationtest.Sum("vmlinuz")}, Initrds: [][]byte{attestationtest.Sum("initrd")}}
}

func TestEnrolAndQuoteSWTPM(t *testing.T) {
	sw := attestationtest.Start(t, true)
	sw.Measure(t, attestationtest.Boot("ipxe.efi", "vmlinuz", "initrd")...)
	m := newMachine(t, sw)
	v := attestation.New(attestation.Config{EKRoots: []*x509.Certificate{sw.CARoot}, EKIntermediates: []*x509.Certificate{sw.CAIssuer}})
	req := m.request()
	if len(req.EKCertificate) == 0 {
		t.Fatal("swtpm_setup --create-ek-cert made no EK certificate the TPM returns")
	}
	ch, fp, err := v.Challenge("r1-n01", "tok1", "", req)
	if err != nil {
		t.Fatalf("Challenge: %v", err)
	}
	if fp != attestation.Fingerprint(req.EKPublic) || !strings.HasPrefix(fp, "sha256:") || len(fp) != 71 {
		t.Errorf("fingerprint %q", fp)
	}
	ev := m.answer(ch, m.ak)
	res, err := v.Verify("r1-n01", "tok1", ev, served())
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if res.EK != fp || len(res.Applications) != 2 || res.EKIssuer == "" {
		t.Errorf("result %+v", res)
	}
	if _, ok := v.Attested("r1-n01", "tok1"); !ok {
		t.Error("Attested false after a good Verify")
	}
	if _, ok := v.Attested("r1-n02", "tok1"); ok {
		t.Error("Attested true for another server")
	}
	// The pinned EK matches: a second challenge verifies too.
	ch2, _, err := v.Challenge("r1-n01", "tok2", fp, req)
	if err != nil {
		t.Fatalf("Challenge with the pinned EK: %v", err)
	}
	if _, err := v.Verify("r1-n01", "tok2", m.answer(ch2, m.ak), served()); err != nil {
		t.Fatalf("Verify 2: %v", err)
	}

	t.Run("replayed nonce", func(t *testing.T) {
		// The same evidence again: its challenge is used up.
		if _, err := v.Verify("r1-n01", "tok1", ev, served()); !errors.Is(err, attestation.ErrChallenge) {
			t.Fatalf("Verify replay = %v, want ErrChallenge", err)
		}
		// An old quote under a new challenge: the nonce differs.
		ch3, _, err := v.Challenge("r1-n01", "tok3", "", req)
		if err != nil {
			t.Fatal(err)
		}
		fresh := m.answer(ch3, m.ak)
		old := fresh
		old.Quotes, old.PCRs = ev.Quotes, ev.PCRs
		if _, err := v.Verify("r1-n01", "tok3", old, served()); !errors.Is(err, attestation.ErrQuote) {
			t.Fatalf("Verify old quote = %v, want ErrQuote", err)
		}
		if _, ok := v.Attested("r1-n01", "tok3"); ok {
			t.Error("Attested after a refused Verify")
		}
	})
	t.Run("other server or token", func(t *testing.T) {
		ch, _, err := v.Challenge("r1-n01", "tok4", "", req)
		if err != nil {
			t.Fatal(err)
		}
		ev := m.answer(ch, m.ak)
		if _, err := v.Verify("r1-n01", "tok5", ev, served()); !errors.Is(err, attestation.ErrChallenge) {
			t.Fatalf("Verify with another token = %v, want ErrChallenge", err)
		}
		if _, err := v.Verify("r1-n02", "tok4", ev, served()); !errors.Is(err, attestation.ErrChallenge) {
			t.Fatalf("Verify for another server = %v, want ErrChallenge", err)
		}
		// Neither spent the machine's challenge.
		if _, err := v.Verify("r1-n01", "tok4", ev, served()); err != nil {
			t.Fatalf("Verify by its own token after another's try: %v", err)
		}
	})
	t.Run("wrong AK", func(t *testing.T) {
		// A second AK in the same TPM signs the quote: it is not the
		// activated one.
		other, err := m.tpm.NewAK(nil)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close(m.tpm)
		ch, _, err := v.Challenge("r1-n01", "tok6", "", req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := v.Verify("r1-n01", "tok6", m.answer(ch, other), served()); !errors.Is(err, attestation.ErrQuote) {
			t.Fatalf("Verify quote by another AK = %v, want ErrQuote", err)
		}
	})
	t.Run("wrong secret", func(t *testing.T) {
		ch, _, err := v.Challenge("r1-n01", "tok7", "", req)
		if err != nil {
			t.Fatal(err)
		}
		ev := m.answer(ch, m.ak)
		ev.Secret = append([]byte{}, ev.Secret...)
		ev.Secret[0] ^= 1
		if _, err := v.Verify("r1-n01", "tok7", ev, served()); !errors.Is(err, attestation.ErrActivation) {
			t.Fatalf("Verify wrong secret = %v, want ErrActivation", err)
		}
	})
	t.Run("boot chain not served", func(t *testing.T) {
		ch, _, err := v.Challenge("r1-n01", "tok8", "", req)
		if err != nil {
			t.Fatal(err)
		}
		chain := attestation.BootChain{Applications: [][]byte{attestationtest.Sum("ipxe.efi"), attestationtest.Sum("other-kernel")}}
		if _, err := v.Verify("r1-n01", "tok8", m.answer(ch, m.ak), chain); !errors.Is(err, attestation.ErrBootChain) {
			t.Fatalf("Verify other kernel = %v, want ErrBootChain", err)
		}
		ch, _, _ = v.Challenge("r1-n01", "tok9", "", req)
		chain = attestation.BootChain{Initrds: [][]byte{attestationtest.Sum("other-initrd")}}
		if _, err := v.Verify("r1-n01", "tok9", m.answer(ch, m.ak), chain); !errors.Is(err, attestation.ErrBootChain) {
			t.Fatalf("Verify other initrd = %v, want ErrBootChain", err)
		}
	})
	t.Run("expired", func(t *testing.T) {
		now := time.Now()
		v := attestation.New(attestation.Config{ChallengeTTL: time.Minute, Now: func() time.Time { return now }})
		ch, _, err := v.Challenge("r1-n01", "t", "", req)
		if err != nil {
			t.Fatal(err)
		}
		now = now.Add(2 * time.Minute)
		if _, err := v.Verify("r1-n01", "t", m.answer(ch, m.ak), served()); !errors.Is(err, attestation.ErrChallenge) {
			t.Fatalf("Verify after the TTL = %v, want ErrChallenge", err)
		}
	})
}

// TestMismatchedEK: a second TPM's EK against the first one's pin is
// refused before any challenge is made, and its fingerprint is returned
// for the event.
func TestMismatchedEKSWTPM(t *testing.T) {
	a, b := attestationtest.Start(t, false), attestationtest.Start(t, false)
	ma, mb := newMachine(t, a), newMachine(t, b)
	pinned := attestation.Fingerprint(ma.request().EKPublic)
	v := attestation.New(attestation.Config{})
	ch, fp, err := v.Challenge("r1-n01", "tok", pinned, mb.request())
	if !errors.Is(err, attestation.ErrEKMismatch) || ch.ID != "" {
		t.Fatalf("Challenge with another TPM = %v, %+v; want ErrEKMismatch and no challenge", err, ch)
	}
	if fp == pinned || fp != attestation.Fingerprint(mb.request().EKPublic) {
		t.Errorf("fingerprint %s, pinned %s", fp, pinned)
	}
	if attestation.Reason(err) != "ek_mismatch" {
		t.Errorf("Reason = %q", attestation.Reason(err))
	}
	// Machine B answering a challenge made for A's EK cannot activate it:
	// TPM2_ActivateCredential fails in another TPM.
	chA, _, err := v.Challenge("r1-n01", "tokA", pinned, ma.request())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mb.ak.ActivateCredentialWithEK(mb.tpm, gattest.EncryptedCredential{Credential: chA.Credential, Secret: chA.Secret}, mb.ek); err == nil {
		t.Fatal("another TPM activated the credential made for the pinned EK")
	}
	// Claiming A's EK with B's AK: the challenge is made, but B cannot
	// recover the secret, so no answer verifies.
	claim := mb.request()
	claim.EKPublic = ma.request().EKPublic
	chX, _, err := v.Challenge("r1-n01", "tokX", pinned, claim)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mb.ak.ActivateCredentialWithEK(mb.tpm, gattest.EncryptedCredential{Credential: chX.Credential, Secret: chX.Secret}, mb.ek); err == nil {
		t.Fatal("a TPM activated a credential made for another TPM's EK")
	}
}

// TestEKCertificateRefused: with vendor CAs configured, an EK without a
// certificate, or with one from another CA, is refused.
func TestEKCertificateRefusedSWTPM(t *testing.T) {
	withCert, other := attestationtest.Start(t, true), attestationtest.Start(t, true)
	m := newMachine(t, withCert)
	v := attestation.New(attestation.Config{EKRoots: []*x509.Certificate{other.CARoot}, EKIntermediates: []*x509.Certificate{other.CAIssuer}})
	if _, _, err := v.Challenge("r1-n01", "t", "", m.request()); !errors.Is(err, attestation.ErrEKCertificate) {
		t.Fatalf("Challenge with another vendor's certificate = %v, want ErrEKCertificate", err)
	}
	req := m.request()
	req.EKCertificate = nil
	v = attestation.New(attestation.Config{EKRoots: []*x509.Certificate{withCert.CARoot}, EKIntermediates: []*x509.Certificate{withCert.CAIssuer}})
	if _, _, err := v.Challenge("r1-n01", "t", "", req); !errors.Is(err, attestation.ErrEKCertificate) {
		t.Fatalf("Challenge without a certificate = %v, want ErrEKCertificate", err)
	}
	// Another TPM's certificate, chaining to the right CA, with this EK.
	req = m.request()
	req.EKCertificate = newMachine(t, other).request().EKCertificate
	v = attestation.New(attestation.Config{EKRoots: []*x509.Certificate{other.CARoot}, EKIntermediates: []*x509.Certificate{other.CAIssuer}})
	if _, _, err := v.Challenge("r1-n01", "t", "", req); !errors.Is(err, attestation.ErrEKCertificate) {
		t.Fatalf("Challenge with another TPM's certificate = %v, want ErrEKCertificate", err)
	}
}

// TestEventLogDoesNotReplay: a log whose events do not extend to the
// quoted PCRs, an empty log, and a log missing a PCR's events are refused.
func TestEventLogDoesNotReplaySWTPM(t *testing.T) {
	sw := attestationtest.Start(t, false)
	sw.Measure(t, attestationtest.Boot("ipxe.efi", "vmlinuz", "initrd")...)
	good := sw.EventLog
	m := newMachine(t, sw)
	v := attestation.New(attestation.Config{})
	var l attestationtest.Log
	cases := map[string][]byte{
		// The log claims the served kernel; the TPM measured another.
		"claims another kernel": func() []byte {
			b := l.Header()
			for _, e := range attestationtest.Boot("ipxe.efi", "evil-kernel", "initrd") {
				b = append(b, l.Event(e)...)
			}
			return b
		}(),
		"empty":     l.Header(),
		"truncated": good[:len(good)-len(l.Event(attestationtest.Initrd("initrd")))],
		"garbage":   []byte(strings.Repeat("not an event log ", 8)),
	}
	for name, log := range cases {
		t.Run(name, func(t *testing.T) {
			ch, _, err := v.Challenge("r1-n01", name, "", m.request())
			if err != nil {
				t.Fatal(err)
			}
			sw.EventLog = log
			ev := m.answer(ch, m.ak)
			sw.EventLog = good
			if _, err := v.Verify("r1-n01", name, ev, attestation.BootChain{}); !errors.Is(err, attestation.ErrEventLog) {
				t.Fatalf("Verify = %v, want ErrEventLog", err)
			}
			if _, ok := v.Attested("r1-n01", name); ok {
				t.Error("Attested after a refused log")
			}
		})
	}
}

// TestRecordedFirmwareLogSWTPM replays a firmware event log recorded on a
// real machine into the swtpm's PCRs and verifies the quote against it:
// go-attestation's test vector ubuntu_2104_shielded_vm_no_secure_boot_eventlog
// (Ubuntu 21.04 on a Google Compute Engine Shielded VM, UEFI firmware,
// crypto-agile SHA-1 and SHA-256; github.com/google/go-attestation
// attest/testdata, Apache-2.0), copied to testdata/.
func TestRecordedFirmwareLogSWTPM(t *testing.T) {
	log, err := os.ReadFile("testdata/ubuntu_2104_shielded_vm_no_secure_boot_eventlog")
	if err != nil {
		t.Fatal(err)
	}
	sw := attestationtest.Start(t, false)
	sw.Replay(t, log)
	m := newMachine(t, sw)
	v := attestation.New(attestation.Config{})
	ch, _, err := v.Challenge("r1-n01", "t", "", m.request())
	if err != nil {
		t.Fatal(err)
	}
	res, err := v.Verify("r1-n01", "t", m.answer(ch, m.ak), attestation.BootChain{})
	if err != nil {
		t.Fatalf("Verify recorded log: %v", err)
	}
	if len(res.Applications) == 0 || res.Events < 20 {
		t.Errorf("result %+v: want the shim/GRUB applications and the firmware's events", res)
	}
	t.Logf("recorded log: %d events replayed, boot applications %v", res.Events, res.Applications)
	// Serving another boot loader than the log's: refused.
	ch, _, _ = v.Challenge("r1-n01", "t2", "", m.request())
	if _, err := v.Verify("r1-n01", "t2", m.answer(ch, m.ak), attestation.BootChain{Applications: [][]byte{attestationtest.Sum("ipxe.efi")}}); !errors.Is(err, attestation.ErrBootChain) {
		t.Fatalf("Verify with another served loader = %v, want ErrBootChain", err)
	}
}
