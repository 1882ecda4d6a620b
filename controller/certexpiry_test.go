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

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestCertExpiryGauge: the leaf of an operator's PEM file (a key block
// first, then the leaf, then its issuer) is read, and the collector
// exports each certificate's NotAfter in Unix seconds under its name.
func TestCertExpiryGauge(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(cn string, notAfter time.Time) []byte {
		der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
			NotBefore: notAfter.Add(-48 * time.Hour), NotAfter: notAfter}, &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}}, &key.PublicKey, key)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	leafAfter := time.Unix(2000000000, 0)
	file := filepath.Join(t.TempDir(), "admin.pem")
	pemText := append(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), mk("leaf", leafAfter)...)
	pemText = append(pemText, mk("issuer", time.Unix(2100000000, 0))...)
	if err := os.WriteFile(file, pemText, 0o600); err != nil {
		t.Fatal(err)
	}
	leaf, err := firstCertificate(file)
	if err != nil {
		t.Fatal(err)
	}
	if leaf.Subject.CommonName != "leaf" {
		t.Fatalf("firstCertificate = %s, want the leaf", leaf.Subject.CommonName)
	}
	ca := &x509.Certificate{NotAfter: time.Unix(2500000000, 0)}
	want := `# HELP machina_cert_expiry_timestamp_seconds NotAfter of a certificate the controller serves or signs with, in Unix seconds, by cert (join_ca, admin_tls: the operator's admin certificate file).
# TYPE machina_cert_expiry_timestamp_seconds gauge
machina_cert_expiry_timestamp_seconds{cert="admin_tls"} 2e+09
machina_cert_expiry_timestamp_seconds{cert="join_ca"} 2.5e+09
`
	if err := testutil.CollectAndCompare(certExpiry{"join_ca": ca, "admin_tls": leaf}, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	if err := os.WriteFile(file, pemText[:len(pemText)/4], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := firstCertificate(file); err == nil {
		t.Error("firstCertificate of a file without a certificate = nil error")
	}
}
