package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/machina-metal/machina/bmc/bmcsim"
)

// newBmcsimCmd is `machina bmcsim`: serve one fixture tree as a stateful
// Redfish BMC for manual testing and demos. The account password comes from
// MACHINA_BMCSIM_PASSWORD (default "password"), never a flag.
func newBmcsimCmd(e *env) *cobra.Command {
	var tree, listen, fixtures, user, certFile, keyFile string
	var modes []string
	var plainHTTP bool
	var lockout int
	var transition time.Duration
	var fetchMedia bool
	cmd := &cobra.Command{
		Use:   "bmcsim --tree NAME [--listen 127.0.0.1:8443]",
		Short: "Serve a vendor Redfish tree from the fixtures as a stateful BMC emulator",
		Long: `Serve a vendor Redfish tree (fixtures/redfish/NAME) as a stateful BMC:
power through ComputerSystem.Reset, boot override, virtual media, sessions and
Basic auth, ETags. The account is --username with the password from
MACHINA_BMCSIM_PASSWORD (default "password"). HTTPS uses a fresh self-signed
certificate whose SHA-256 fingerprint is printed; pass --insecure to clients,
or serve --tls-cert/--tls-key issued by your CA and give clients --ca-file.
--mode adds a real-BMC behaviour (repeatable): basic-only, no-sessions,
no-auth, once-to-continuous, once-ignored, no-powercycle, no-lastresettime,
continuous-reverts, network-first. --power-transition makes power changes
take time (PowerState reads PoweringOn/PoweringOff meanwhile); --fetch-media
makes InsertMedia read the image URL first and refuse one it cannot read.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, err := bmcsim.TreeDir(fixtures, tree)
			if err != nil {
				return err
			}
			tr, err := bmcsim.LoadTree(dir)
			if err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(e.stderr, nil))
			q := bmcsim.DefaultQuirks(tr.Manufacturer)
			for _, m := range modes {
				if err := q.SetMode(m); err != nil {
					return err
				}
			}
			sim, err := bmcsim.New(bmcsim.Config{Tree: tr, Username: user, Password: os.Getenv("MACHINA_BMCSIM_PASSWORD"), LockoutThreshold: lockout, Logger: log, Quirks: &q,
				PowerTransition: transition, FetchMedia: fetchMedia})
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("bmcsim: listen %s: %w", listen, err)
			}
			scheme := "http"
			if !plainHTTP {
				var fp string
				if ln, fp, err = bmcsimTLS(ln, certFile, keyFile); err != nil {
					return err
				}
				scheme = "https"
				fmt.Fprintf(e.stdout, "certificate sha256 %s\n", fp)
			}
			fmt.Fprintf(e.stdout, "bmcsim serving %s (%d resources, manufacturer %q) on %s://%s\n", tr.Name, tr.Paths(), tr.Manufacturer, scheme, ln.Addr())
			return bmcsim.Serve(cmd.Context(), ln, sim)
		},
	}
	cmd.Flags().StringVar(&tree, "tree", "", "fixture tree name, e.g. dell-poweredge-r750-idrac9 (required)")
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:8443", "address to listen on")
	cmd.Flags().StringVar(&fixtures, "fixtures", os.Getenv("MACHINA_FIXTURES"), "fixtures folder holding redfish/<tree> (default: $MACHINA_FIXTURES or testdata/fixtures above the working directory)")
	cmd.Flags().StringVar(&user, "username", "admin", "account user name")
	cmd.Flags().IntVar(&lockout, "lockout", 0, "lock the account after this many failed logins (0: never)")
	cmd.Flags().BoolVar(&plainHTTP, "plain-http", false, "serve plain HTTP instead of HTTPS")
	cmd.Flags().StringSliceVar(&modes, "mode", nil, "real-BMC behaviour to add (repeatable): basic-only, no-sessions, no-auth, once-to-continuous, once-ignored, no-powercycle, no-lastresettime, continuous-reverts, network-first")
	cmd.Flags().DurationVar(&transition, "power-transition", 0, "how long a power change takes (PowerState reads PoweringOn/PoweringOff meanwhile); 0: at once")
	cmd.Flags().BoolVar(&fetchMedia, "fetch-media", false, "InsertMedia reads the start of the image URL first and fails the insert when it cannot, as real BMCs do")
	cmd.Flags().StringVar(&certFile, "tls-cert", "", "PEM certificate to serve (e.g. issued by your CA) instead of a fresh self-signed one; with --tls-key")
	cmd.Flags().StringVar(&keyFile, "tls-key", "", "PEM private key of --tls-cert")
	_ = cmd.MarkFlagRequired("tree")
	return cmd
}

// bmcsimTLS wraps ln in TLS with the certificate of certFile and keyFile,
// or a fresh self-signed one when both are empty, and returns the
// certificate's SHA-256 fingerprint (hex). On error it closes ln.
func bmcsimTLS(ln net.Listener, certFile, keyFile string) (net.Listener, string, error) {
	cert, fp, err := selfSigned()
	if certFile != "" || keyFile != "" {
		cert, err = tls.LoadX509KeyPair(certFile, keyFile)
		if err == nil {
			sum := sha256.Sum256(cert.Certificate[0])
			fp = fmt.Sprintf("%x", sum)
		} else {
			err = fmt.Errorf("bmcsim: --tls-cert/--tls-key: %w", err)
		}
	}
	if err != nil {
		ln.Close()
		return nil, "", err
	}
	return tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}), fp, nil
}

// selfSigned makes an in-memory ECDSA P-256 certificate for 127.0.0.1 and
// localhost, valid for 30 days, and returns its SHA-256 fingerprint.
func selfSigned() (tls.Certificate, string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, "", fmt.Errorf("bmcsim: certificate: %w", err)
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "machina bmcsim"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(30 * 24 * time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, "", fmt.Errorf("bmcsim: certificate: %w", err)
	}
	sum := sha256.Sum256(der)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, fmt.Sprintf("%x", sum), nil
}
