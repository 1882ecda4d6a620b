package controller

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"
)

// descCertExpiry is machina_cert_expiry_timestamp_seconds{cert}: the
// NotAfter (RFC 5280 section 4.1.2.5) of a certificate the controller
// serves or signs with, as Unix seconds, so an alert can fire before it
// lapses (docs/monitoring.md, MachinaCertificateExpiring). cert is
// join_ca (the controller CA: it signs the join listener's and the admin
// listener's own certificates, and every node certificate) or admin_tls
// (the operator's certificate file of the admin listener, which the
// controller serves as loaded and never renews; a CA-issued admin
// certificate is reissued 30 days before it expires and is not listed).
var descCertExpiry = prometheus.NewDesc("machina_cert_expiry_timestamp_seconds",
	"NotAfter of a certificate the controller serves or signs with, in Unix seconds, by cert (join_ca, admin_tls: the operator's admin certificate file).",
	[]string{"cert"}, nil)

// certExpiry is the collector of machina_cert_expiry_timestamp_seconds
// over certificates fixed at start-up.
type certExpiry map[string]*x509.Certificate

func (c certExpiry) Describe(ch chan<- *prometheus.Desc) { ch <- descCertExpiry }

func (c certExpiry) Collect(ch chan<- prometheus.Metric) {
	for name, cert := range c {
		ch <- prometheus.MustNewConstMetric(descCertExpiry, prometheus.GaugeValue, float64(cert.NotAfter.Unix()), name)
	}
}

// firstCertificate reads the first CERTIFICATE block of the PEM file
// path (the leaf of a chain file, as crypto/tls serves it).
func firstCertificate(path string) (*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read certificate: %w", err)
	}
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return nil, fmt.Errorf("read certificate %s: no CERTIFICATE block", path)
		}
		if blk.Type == "CERTIFICATE" {
			cert, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				return nil, fmt.Errorf("read certificate %s: %w", path, err)
			}
			return cert, nil
		}
	}
}
