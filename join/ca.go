package join

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"

	"github.com/machina-metal/machina/state"
)

// CAStore is the part of *state.Store the CA needs.
type CAStore interface {
	CA() (state.CARecord, error)
	PutCA(state.CARecord) (state.CARecord, error)
}

// CA is the controller's certificate authority: an ECDSA P-256 key and a
// self-signed certificate valid for 20 years, made on first start and kept
// in the state store with its key sealed like other secrets. It signs the
// join listener's serving certificate and node client certificates. Safe
// for concurrent use.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	now  func() time.Time
}

// caValidity is the CA certificate's lifetime.
const caValidity = 20 * 365 * 24 * time.Hour

// LoadOrCreateCA returns the CA stored in st, creating and storing one on
// first use. now may be nil (time.Now). Errors: state errors (e.g.
// state.ErrMasterKeyRequired when the key is sealed and no master key is
// configured), or a stored CA that does not parse.
func LoadOrCreateCA(st CAStore, now func() time.Time) (*CA, error) {
	if now == nil {
		now = time.Now
	}
	rec, err := st.CA()
	if errors.Is(err, state.ErrNotFound) {
		rec, err = newCARecord(now())
		if err != nil {
			return nil, fmt.Errorf("join: create ca: %w", err)
		}
		rec, err = st.PutCA(rec)
	}
	if err != nil {
		return nil, fmt.Errorf("join: load ca: %w", err)
	}
	cert, err := x509.ParseCertificate(rec.CertDER)
	if err != nil {
		return nil, fmt.Errorf("join: load ca: certificate: %w", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(rec.KeyDER)
	if err != nil {
		return nil, fmt.Errorf("join: load ca: key: %w", err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("join: load ca: key does not match the certificate")
	}
	return &CA{Cert: cert, key: key, now: now}, nil
}

func newCARecord(now time.Time) (state.CARecord, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return state.CARecord{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "Machina controller CA", Organization: []string{"Machina"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return state.CARecord{}, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return state.CARecord{}, err
	}
	return state.CARecord{CertDER: der, KeyDER: kder}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return n
}

// Fingerprint returns the hex SHA-256 of the CA's DER SubjectPublicKeyInfo
// (the value curl's and openssl's "pkey -pubin -outform DER | sha256sum"
// print), which first-boot commands pin.
func (c *CA) Fingerprint() string { return SPKIFingerprint(c.Cert) }

// SPKIFingerprint returns the hex SHA-256 of cert's DER SubjectPublicKeyInfo.
func SPKIFingerprint(cert *x509.Certificate) string {
	s := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return hex.EncodeToString(s[:])
}

// CertFingerprint returns the hex SHA-256 of a whole DER certificate, as
// stored in state.Host.CertFingerprint.
func CertFingerprint(der []byte) string {
	s := sha256.Sum256(der)
	return hex.EncodeToString(s[:])
}

// PEM returns the CA certificate PEM-encoded.
func (c *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Cert.Raw})
}

// Pool returns a cert pool holding only the CA.
func (c *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c.Cert)
	return p
}

// ServerCertificate makes a fresh serving certificate for the join
// listener, valid one year, with names as DNS or IP SANs (at least one
// required), and the CA in its chain so clients can pin it.
func (c *CA) ServerCertificate(names []string) (tls.Certificate, error) {
	if len(names) == 0 {
		return tls.Certificate{}, errors.New("join: server certificate: no names")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("join: server certificate: %w", err)
	}
	now := c.now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: names[0]},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.Cert, &key.PublicKey, c.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("join: server certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der, c.Cert.Raw}, PrivateKey: key}, nil
}

// Errors of SignNode.
var (
	// ErrBadCSR: the CSR does not parse, its signature is wrong, or its key
	// type or size is not accepted.
	ErrBadCSR = errors.New("bad certificate signing request")
)

// ParseCSR decodes a PEM CERTIFICATE REQUEST (PKCS #10, RFC 2986), checks
// its self-signature and accepts ECDSA P-256/P-384, Ed25519 and RSA of at
// least 2048 bits. Errors wrap ErrBadCSR.
func ParseCSR(pemData string) (*x509.CertificateRequest, error) {
	b, rest := pem.Decode([]byte(pemData))
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("%w: no PEM CERTIFICATE REQUEST block", ErrBadCSR)
	}
	if len(pemBlocksLeft(rest)) > 0 {
		return nil, fmt.Errorf("%w: trailing data after the CSR", ErrBadCSR)
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadCSR, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: signature: %v", ErrBadCSR, err)
	}
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return nil, fmt.Errorf("%w: ECDSA curve %s not accepted (P-256, P-384)", ErrBadCSR, k.Curve.Params().Name)
		}
	case ed25519.PublicKey:
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return nil, fmt.Errorf("%w: RSA key of %d bits, want >= 2048", ErrBadCSR, k.N.BitLen())
		}
	default:
		return nil, fmt.Errorf("%w: key type %T not accepted", ErrBadCSR, k)
	}
	return csr, nil
}

func pemBlocksLeft(rest []byte) []byte {
	for len(rest) > 0 && (rest[0] == '\n' || rest[0] == '\r' || rest[0] == ' ' || rest[0] == '\t') {
		rest = rest[1:]
	}
	return rest
}

// SignNode issues a client certificate (ExtKeyUsage clientAuth) for host
// over csr's public key, valid for ttl, with CommonName and DNS SAN host.
// The CSR's own subject is ignored: the controller names the node.
func (c *CA) SignNode(csr *x509.CertificateRequest, host string, ttl time.Duration) ([]byte, error) {
	now := c.now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: host, Organization: []string{"Machina nodes"}},
		DNSNames:     []string{host},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(ttl),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.Cert, csr.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("join: sign node %s: %w", host, err)
	}
	return der, nil
}
