package state

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"os"
	"strings"
)

// EtcdScheme starts a --state value that names an etcd site instead of a
// bbolt file: etcd://HOST:PORT[,HOST:PORT...]/PREFIX[?ca=FILE&cert=FILE&key=FILE].
const EtcdScheme = "etcd://"

// EtcdTLSFiles are the PEM files of an etcd client's TLS: the CA that signed
// the members' certificates, and the client certificate and its key (for
// etcd's --client-cert-auth). All empty: plain http. Paths, never contents:
// a key never travels in argv.
type EtcdTLSFiles struct {
	CAFile, CertFile, KeyFile string
}

// IsEtcdTarget reports whether target names an etcd site.
func IsEtcdTarget(target string) bool { return strings.HasPrefix(target, EtcdScheme) }

// ParseEtcdTarget parses etcd://HOST:PORT[,HOST:PORT...]/PREFIX: the hosts
// become the endpoints (https:// when TLS files are given, in files or in
// the query's ca, cert and key parameters; files win), the path the key
// prefix ("/machina" → "/machina/"; empty → "/machina/"). A user or
// password in the URL is refused: etcd's password auth would put a secret
// in argv; use client certificates. Errors wrap ErrInvalid and name the
// part of the URL at fault.
func ParseEtcdTarget(target string, files EtcdTLSFiles) (EtcdConfig, EtcdTLSFiles, error) {
	if !IsEtcdTarget(target) {
		return EtcdConfig{}, files, fmt.Errorf("state target %q: want %sHOST:PORT[,HOST:PORT]/PREFIX: %w", target, EtcdScheme, ErrInvalid)
	}
	rest := strings.TrimPrefix(target, EtcdScheme)
	hostPart, pathQuery, _ := strings.Cut(rest, "/")
	if strings.Contains(hostPart, "@") {
		return EtcdConfig{}, files, fmt.Errorf("state target: a user or password in the etcd URL is refused (secrets never in argv): use --etcd-cert and --etcd-key: %w", ErrInvalid)
	}
	path, query, _ := strings.Cut(pathQuery, "?")
	q, err := url.ParseQuery(query)
	if err != nil {
		return EtcdConfig{}, files, fmt.Errorf("state target: query: %v: %w", err, ErrInvalid)
	}
	for k := range q {
		switch k {
		case "ca", "cert", "key":
		default:
			return EtcdConfig{}, files, fmt.Errorf("state target: unknown query parameter %q (want ca, cert, key): %w", k, ErrInvalid)
		}
	}
	if files.CAFile == "" {
		files.CAFile = q.Get("ca")
	}
	if files.CertFile == "" {
		files.CertFile = q.Get("cert")
	}
	if files.KeyFile == "" {
		files.KeyFile = q.Get("key")
	}
	if (files.CertFile == "") != (files.KeyFile == "") {
		return EtcdConfig{}, files, fmt.Errorf("state target: an etcd client certificate needs both cert and key files: %w", ErrInvalid)
	}
	withTLS := files.CAFile != "" || files.CertFile != ""
	scheme := "http://"
	if withTLS {
		scheme = "https://"
	}
	var cfg EtcdConfig
	for _, h := range strings.Split(hostPart, ",") {
		if h == "" {
			return EtcdConfig{}, files, fmt.Errorf("state target %q: empty host: %w", target, ErrInvalid)
		}
		if !strings.Contains(h, ":") {
			h += ":2379" // etcd's client port
		}
		cfg.Endpoints = append(cfg.Endpoints, scheme+h)
	}
	if strings.ContainsAny(path, "\x00") {
		return EtcdConfig{}, files, fmt.Errorf("state target: prefix holds a NUL byte: %w", ErrInvalid)
	}
	path = strings.Trim(path, "/")
	if path == "" {
		path = "machina"
	}
	cfg.Prefix = "/" + path + "/"
	if withTLS {
		if cfg.TLS, err = loadEtcdTLS(files); err != nil {
			return EtcdConfig{}, files, err
		}
	}
	return cfg, files, nil
}

func loadEtcdTLS(files EtcdTLSFiles) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if files.CAFile != "" {
		pemCA, err := os.ReadFile(files.CAFile)
		if err != nil {
			return nil, fmt.Errorf("etcd CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pemCA) {
			return nil, fmt.Errorf("etcd CA %s: no PEM certificate in it: %w", files.CAFile, ErrInvalid)
		}
		cfg.RootCAs = pool
	}
	if files.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(files.CertFile, files.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("etcd client certificate %s: %w", files.CertFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// OpenTarget opens target: an etcd site when it starts with etcd://
// (ParseEtcdTarget, OpenEtcd), else the bbolt file at that path (Open).
// files are the etcd TLS files from flags (ignored for a file).
func OpenTarget(target string, files EtcdTLSFiles, opts Options) (*Store, error) {
	if !IsEtcdTarget(target) {
		return Open(target, opts)
	}
	cfg, _, err := ParseEtcdTarget(target, files)
	if err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	return OpenEtcd(cfg, opts)
}
