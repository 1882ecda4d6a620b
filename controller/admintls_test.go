package controller

import (
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"

	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/state"
)

// TestAdminTLSAddr checks where the admin TLS listener goes: none on a
// loopback --listen, Listen's host on port 8444 elsewhere, an explicit
// address always. Nothing is bound.
func TestAdminTLSAddr(t *testing.T) {
	for _, tc := range []struct {
		listen, admin, want string
	}{
		{"127.0.0.1:8080", "", ""},
		{"localhost:8080", "", ""},
		{"[::1]:8080", "", ""},
		{"127.0.0.1:8080", "127.0.0.1:0", "127.0.0.1:0"},
		{":8080", "", ":8444"},
		{"0.0.0.0:8080", "", "0.0.0.0:8444"},
		{"10.99.0.1:8080", "", "10.99.0.1:8444"},
		{"10.99.0.1:8080", "10.10.0.1:9443", "10.10.0.1:9443"},
	} {
		if got := adminTLSAddr(tc.listen, AdminTLS{Listen: tc.admin}); got != tc.want {
			t.Errorf("adminTLSAddr(%q, %q) = %q, want %q", tc.listen, tc.admin, got, tc.want)
		}
	}
}

// TestListenAdminTLS serves a CA-issued certificate that verifies against
// the CA alone for 127.0.0.1 and the extra names, and refuses a
// certificate without its key.
func TestListenAdminTLS(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ca, err := join.LoadOrCreateCA(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, url, err := ListenAdminTLS("127.0.0.1:0", AdminTLS{Listen: "127.0.0.1:0", Names: []string{"machina.lab1.example"}}, ca)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if url != "https://"+ln.Addr().String() {
		t.Errorf("url %q", url)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _ = c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	for _, name := range []string{"127.0.0.1", "machina.lab1.example", "localhost"} {
		c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: ca.Pool(), ServerName: name})
		if err != nil {
			t.Errorf("handshake as %s: %v", name, err)
			continue
		}
		c.Close()
	}
	if _, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: x509.NewCertPool(), ServerName: "127.0.0.1"}); err == nil {
		t.Error("handshake verified without the CA")
	}
	if _, _, err := ListenAdminTLS("127.0.0.1:0", AdminTLS{Listen: "127.0.0.1:0", CertFile: "x.pem"}, ca); err == nil {
		t.Error("a certificate without a key was accepted")
	}
}

// TestListenAdminTLSOperatorCertificate serves the operator's PEM
// certificate and key instead of a CA-issued one.
func TestListenAdminTLSOperatorCertificate(t *testing.T) {
	st, err := state.Open(filepath.Join(t.TempDir(), "state.db"), state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ca, err := join.LoadOrCreateCA(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.ServerCertificate([]string{"ops-cert.example"})
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(pair.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	var chain []byte
	for _, der := range pair.Certificate {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	if err := os.WriteFile(certFile, chain, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, _, err := ListenAdminTLS("127.0.0.1:0", AdminTLS{Listen: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: ca.Pool(), ServerName: "ops-cert.example"})
	if err != nil {
		t.Fatalf("handshake with the operator's certificate: %v", err)
	}
	if got := c.ConnectionState().PeerCertificates[0].Subject.CommonName; got != "ops-cert.example" {
		t.Errorf("served certificate %q", got)
	}
	c.Close()
}
