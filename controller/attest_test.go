package controller

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// TestAttestPolicyFromInventory: the rule of a server is its profile's
// attestation (pinned profile, else the allocation's), the EK pinned in
// servers.yaml and the configured boot chain.
func TestAttestPolicyFromInventory(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "s.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ek := "sha256:" + strings.Repeat("ab", 32)
	inv := &inventory.Inventory{
		Servers:  []inventory.Server{{Name: "a", Profile: "secure", TPM: &inventory.TPM{EK: ek}}, {Name: "b"}, {Name: "c"}},
		Profiles: []inventory.Profile{{Name: "secure", Attestation: api.AttestRequired}, {Name: "lab", Attestation: api.AttestOff}},
	}
	if _, err := st.CreateServer(state.Server{Name: "b", Allocation: &state.Allocation{Profile: "lab"}}); err != nil {
		t.Fatal(err)
	}
	_, chain, err := newVerifier(Config{AttestBootApplications: []string{strings.Repeat("01", 32)}, AttestInitrds: []string{"sha256:" + strings.Repeat("02", 32)}})
	if err != nil {
		t.Fatal(err)
	}
	p := attestPolicy{desired: func() *inventory.Inventory { return inv }, st: st, chain: chain}
	if r := p.AttestRule("a"); r.Mode != api.AttestRequired || r.PinnedEK != ek || len(r.Chain.Applications) != 1 || len(r.Chain.Initrds) != 1 {
		t.Errorf("a: %+v", r)
	}
	if r := p.AttestRule("b"); r.Mode != api.AttestOff || r.PinnedEK != "" {
		t.Errorf("b (allocated to lab): %+v", r)
	}
	if r := p.AttestRule("c"); r.Mode != "" {
		t.Errorf("c (no profile): %+v, want the default", r)
	}
	if _, _, err := newVerifier(Config{AttestBootApplications: []string{"zz"}}); err == nil {
		t.Error("a bad digest was taken")
	}
}

// TestAttestEKCAFile: self-signed certificates of the PEM file are roots;
// a file with none is refused.
func TestAttestEKCAFile(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "vendor EK root"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	good, empty := filepath.Join(dir, "cas.pem"), filepath.Join(dir, "none.pem")
	if err := os.WriteFile(good, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(empty, []byte("no certificates\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := newVerifier(Config{AttestEKCAFile: good}); err != nil {
		t.Errorf("good CA file: %v", err)
	}
	if _, _, err := newVerifier(Config{AttestEKCAFile: empty}); err == nil {
		t.Error("a CA file without a root was taken")
	}
}
