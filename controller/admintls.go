package controller

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/machina-metal/machina/internal/connlimit"
	"github.com/machina-metal/machina/join"
)

// DefaultAdminTLSPort is the admin API's TLS port when the plain listener
// is off loopback and no AdminTLS.Listen is given (8443 is the join
// listener's).
const DefaultAdminTLSPort = "8444"

// AdminTLS configures the admin API and UI's TLS listener. Off loopback
// the admin API and UI answer only there; the plain HTTP listener (Listen)
// then serves the machine-facing endpoints only (iPXE and the ramdisk
// speak plain HTTP; their requests carry single-use tokens, never an
// admin token or a BMC password). The zero value is usable: on a loopback
// Listen no TLS listener runs (the simulated lab), elsewhere one runs on
// Listen's host at DefaultAdminTLSPort with a certificate from the
// controller's CA.
type AdminTLS struct {
	// Listen is the TLS listener's address, e.g. ":8444"; "" means none on
	// a loopback Listen, else Listen's host with DefaultAdminTLSPort.
	// Setting it on a loopback Listen runs TLS there too.
	Listen string
	// CertFile and KeyFile are the operator's PEM certificate (chain) and
	// key; empty means a certificate issued by the controller's CA (the
	// CA machinactl pins with --ca-file / MACHINA_CA), reissued a month
	// before its one-year expiry. Both or neither.
	CertFile, KeyFile string
	// Names are the DNS names and IP addresses the CA-issued certificate
	// names besides the listener's own addresses, the host name,
	// localhost, 127.0.0.1 and ::1.
	Names []string
}

// IsLoopback reports whether addr ("host:port" or a bare host) names a
// loopback address or "localhost", without resolving anything. An empty
// or unspecified host (":8080", "0.0.0.0:8080") is not loopback: it
// listens on every interface.
func IsLoopback(addr string) bool {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// adminTLSAddr is where the admin TLS listener binds given the plain
// listener's configured address: "" for none.
func adminTLSAddr(listen string, cfg AdminTLS) string {
	if cfg.Listen != "" {
		return cfg.Listen
	}
	if IsLoopback(listen) {
		return ""
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		host = ""
	}
	return net.JoinHostPort(host, DefaultAdminTLSPort)
}

// ListenAdminTLS binds the admin TLS listener for a plain listener
// configured at listen, or returns nil, "" when none is needed (loopback,
// no AdminTLS.Listen). url is https://<bound address>.
func ListenAdminTLS(listen string, cfg AdminTLS, ca *join.CA) (ln net.Listener, url string, err error) {
	return listenAdminTLS(listen, cfg, ca, nil)
}

// ListenAdminTLSLimited is ListenAdminTLS with the TCP listener under TLS
// wrapped by connlimit.New(raw, lim) (its own connection budget, refused
// connections closed before any handshake); api.Server.Serve then uses it
// as it is.
func ListenAdminTLSLimited(listen string, cfg AdminTLS, ca *join.CA, lim connlimit.Config) (ln net.Listener, url string, err error) {
	return listenAdminTLS(listen, cfg, ca, &lim)
}

func listenAdminTLS(listen string, cfg AdminTLS, ca *join.CA, lim *connlimit.Config) (ln net.Listener, url string, err error) {
	addr := adminTLSAddr(listen, cfg)
	if addr == "" {
		return nil, "", nil
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, "", errors.New("admin TLS: give both a certificate and a key file, or neither")
	}
	raw, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("admin TLS: listen %s: %w", addr, err)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			raw.Close()
			return nil, "", fmt.Errorf("admin TLS: %w", err)
		}
		tc.Certificates = []tls.Certificate{pair}
	} else {
		if ca == nil {
			raw.Close()
			return nil, "", errors.New("admin TLS: no CA and no certificate file")
		}
		iss := &issuer{ca: ca, names: adminNames(raw.Addr(), cfg.Names)}
		if _, err := iss.get(nil); err != nil {
			raw.Close()
			return nil, "", err
		}
		tc.GetCertificate = iss.get
	}
	host, port, _ := net.SplitHostPort(raw.Addr().String())
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil && h != "" {
			host = h
		}
	}
	url = "https://" + net.JoinHostPort(host, port)
	if lim != nil {
		return connlimit.TLS(connlimit.New(raw, *lim), tc), url, nil
	}
	return tls.NewListener(raw, tc), url, nil
}

// adminNames lists the certificate's subject alternative names.
func adminNames(bound net.Addr, extra []string) []string {
	seen := map[string]bool{}
	var out []string
	add := func(n string) {
		if n != "" && !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	for _, n := range extra {
		add(n)
	}
	if h, err := os.Hostname(); err == nil {
		add(h)
	}
	host, _, _ := net.SplitHostPort(bound.String())
	if ip, err := netip.ParseAddr(host); err == nil && !ip.IsUnspecified() {
		add(ip.Unmap().String())
	} else if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && !p.Addr().IsLinkLocalUnicast() {
				add(p.Addr().String())
			}
		}
	}
	for _, n := range []string{"localhost", "127.0.0.1", "::1"} {
		add(n)
	}
	return out
}

// issuer hands out the CA-issued serving certificate, reissuing it 30
// days before it expires.
type issuer struct {
	ca    *join.CA
	names []string
	mu    sync.Mutex
	cert  *tls.Certificate
	until time.Time
}

func (i *issuer) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.cert != nil && time.Now().Before(i.until) {
		return i.cert, nil
	}
	pair, err := i.ca.ServerCertificate(i.names)
	if err != nil {
		return nil, fmt.Errorf("admin TLS: %w", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("admin TLS: %w", err)
	}
	pair.Leaf = leaf
	i.cert, i.until = &pair, leaf.NotAfter.Add(-30*24*time.Hour)
	return i.cert, nil
}
