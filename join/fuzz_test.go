package join_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/join/spec"
)

// FuzzParseCSR: untrusted CSRs from joining hosts never panic, and every
// refusal wraps ErrBadCSR.
func FuzzParseCSR(f *testing.F) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	f.Add(string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})))
	f.Add("-----BEGIN CERTIFICATE REQUEST-----\nMIIB\n-----END CERTIFICATE REQUEST-----\n")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 16<<10 {
			return
		}
		csr, err := join.ParseCSR(s)
		if err != nil && !errors.Is(err, join.ErrBadCSR) {
			t.Fatalf("ParseCSR error %v does not wrap ErrBadCSR", err)
		}
		if err == nil && csr.CheckSignature() != nil {
			t.Fatal("accepted a CSR with a bad signature")
		}
	})
}

// FuzzEnrolmentSpec: whatever an admin posts, accepted specs only carry
// names that are safe on a command line and in a file path.
func FuzzEnrolmentSpec(f *testing.F) {
	f.Add(`{"site":"lab1","networks":[{"name":"p","bridge":"br0","nic":"eth0","vlan":20}],"pools":[{"name":"vg0","type":"lvm","disks":["/dev/sdb"]}]}`)
	f.Add(`{"pools":[{"name":"d","type":"dir","path":"/srv/p"}]}`)
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 8<<10 {
			return
		}
		var r v1.EnrolmentRequest
		if json.Unmarshal([]byte(s), &r) != nil {
			return
		}
		if spec.Enrolment(r) != nil {
			return
		}
		for _, p := range r.Pools {
			for _, d := range append([]string{p.Name, p.Path}, p.Disks...) {
				if len(d) > 0 && d[0] == '-' {
					t.Fatalf("accepted option-like value %q", d)
				}
			}
		}
		for _, n := range r.Networks {
			if len(n.Bridge) > 15 || len(n.NIC) > 15 {
				t.Fatalf("accepted over-long interface name in %+v", n)
			}
		}
	})
}
