package controller

import (
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"strings"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/attestation"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

// attestPolicy is the machine endpoints' api.AttestPolicy from the current
// inventory: the policy of the server's profile (pinned in servers.yaml,
// else the profile it is allocated to; "" is optional), the EK pinned in
// servers.yaml tpm.ek, and the boot chain the controller serves.
type attestPolicy struct {
	desired func() *inventory.Inventory
	st      *state.Store
	chain   attestation.BootChain
	// secureBoot, when set, is the chain of Secure Boot servers (profile
	// firmware.secureBoot), computed from the served files
	// (secureBootChain); it replaces chain for them.
	secureBoot *attestation.BootChain
}

// AttestRule implements api.AttestPolicy.
func (p attestPolicy) AttestRule(server string) api.AttestRule {
	r := api.AttestRule{Chain: p.chain}
	inv := p.desired()
	if inv == nil {
		return r
	}
	s := inv.Server(server)
	if s == nil {
		return r
	}
	if s.TPM != nil {
		r.PinnedEK = strings.ToLower(s.TPM.EK)
	}
	if pr := serverProfile(inv, p.st, server); pr != nil {
		r.Mode = pr.Attestation
		if p.secureBoot != nil && pr.Firmware != nil && pr.Firmware.SecureBoot != nil && *pr.Firmware.SecureBoot {
			r.Chain = *p.secureBoot
		}
	}
	return r
}

// newVerifier builds the attestation verifier from cfg: the vendor EK CAs
// of AttestEKCAFile.
func newVerifier(cfg Config) (*attestation.Verifier, attestation.BootChain, error) {
	var ac attestation.Config
	var chain attestation.BootChain
	if cfg.AttestEKCAFile != "" {
		b, err := os.ReadFile(cfg.AttestEKCAFile)
		if err != nil {
			return nil, chain, fmt.Errorf("attestation EK CAs: %w", err)
		}
		for blk, rest := pem.Decode(b); blk != nil; blk, rest = pem.Decode(rest) {
			c, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				return nil, chain, fmt.Errorf("attestation EK CAs: %s: %w", cfg.AttestEKCAFile, err)
			}
			if c.CheckSignatureFrom(c) == nil {
				ac.EKRoots = append(ac.EKRoots, c)
			} else {
				ac.EKIntermediates = append(ac.EKIntermediates, c)
			}
		}
		if len(ac.EKRoots) == 0 {
			return nil, chain, fmt.Errorf("attestation EK CAs: %s holds no self-signed root certificate", cfg.AttestEKCAFile)
		}
	}
	for _, l := range []struct {
		in  []string
		out *[][]byte
	}{{cfg.AttestBootApplications, &chain.Applications}, {cfg.AttestInitrds, &chain.Initrds}} {
		for _, h := range l.in {
			d, err := hex.DecodeString(strings.TrimPrefix(strings.ToLower(strings.TrimSpace(h)), "sha256:"))
			if err != nil || len(d) != 32 {
				return nil, chain, fmt.Errorf("attestation boot chain: %q is not a hex SHA-256 digest", h)
			}
			*l.out = append(*l.out, d)
		}
	}
	return attestation.New(ac), chain, nil
}
