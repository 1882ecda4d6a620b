package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/machina-metal/machina/controller"
	"github.com/machina-metal/machina/gitops"
)

// privateCA makes a CA and a server certificate for 127.0.0.1 signed by
// it, as a site's own PKI issues its Git server's; it returns the CA's
// PEM and the server's tls.Certificate.
func privateCA(t *testing.T) ([]byte, tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "site git CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "git.site.lan"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestServeGitRemoteFromConfig: the inventory remote's CA bundle, user
// and token file come from machina serve's config file (and flags, and
// MACHINA_*), and reach a git-http-backend server whose certificate a
// private CA issued and which wants basic auth with that user, without
// SSL_CERT_FILE; without the CA the server is not trusted.
func TestServeGitRemoteFromConfig(t *testing.T) {
	const user, token = "machina-bot", "tok-site-7c1d2e3f"
	root := t.TempDir()
	bare := filepath.Join(root, "inventory.git")
	work := filepath.Join(root, "work")
	for _, args := range [][]string{
		{"init", "-q", "--bare", "-b", "main", bare},
		{"clone", "-q", bare, work},
	} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}
	ents, err := os.ReadDir("../../inventory-example")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("../../inventory-example", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(work, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{
		{"-C", work, "add", "-A"},
		{"-C", work, "-c", "user.name=ops", "-c", "user.email=ops@site.lan", "commit", "-q", "-m", "inventory"},
		{"-C", work, "push", "-q", "origin", "HEAD:main"},
	} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}
	backend, err := exec.LookPath("git-http-backend")
	if err != nil {
		out, err := exec.Command("git", "--exec-path").Output()
		if err != nil {
			t.Fatalf("git --exec-path: %v", err)
		}
		backend = filepath.Join(strings.TrimSpace(string(out)), "git-http-backend")
	}
	h := &cgi.Handler{Path: backend, Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}}
	caPEM, cert := privateCA(t)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != token {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "unauthorised", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)

	dir := t.TempDir()
	caFile, tokFile := filepath.Join(dir, "git-ca.pem"), filepath.Join(dir, "git.token")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	url := srv.URL + "/inventory.git"
	poll := func(t *testing.T, config string, env map[string]string, args ...string) error {
		t.Helper()
		path := filepath.Join(t.TempDir(), "machina.yaml")
		if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
		var cc controller.Config
		fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
		addServeGitFlags(fs, &cc)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if err := applySources(fs, path, func(k string) string { return env[k] }); err != nil {
			t.Fatal(err)
		}
		s, err := gitops.NewSource(gitops.SourceConfig{Remote: cc.Repo, StateDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Poll(t.Context()); err != nil {
			return err
		}
		if good, _ := s.Latest(); good.Inventory == nil || len(good.Inventory.Servers) == 0 {
			t.Fatalf("no inventory after a good poll")
		}
		return nil
	}
	t.Run("config file", func(t *testing.T) {
		cfg := "repo: " + url + "\nrepo-ca-file: " + caFile + "\nrepo-username: " + user + "\nrepo-token-file: " + tokFile + "\n"
		if err := poll(t, cfg, nil); err != nil {
			t.Fatalf("Poll with the config file's remote = %v", err)
		}
	})
	t.Run("flags", func(t *testing.T) {
		if err := poll(t, "", nil, "--repo", url, "--repo-ca-file", caFile, "--repo-username", user, "--repo-token-file", tokFile); err != nil {
			t.Fatalf("Poll with flags = %v", err)
		}
	})
	t.Run("environment", func(t *testing.T) {
		env := map[string]string{"MACHINA_REPO": url, "MACHINA_REPO_CA_FILE": caFile, "MACHINA_REPO_USERNAME": user, "MACHINA_REPO_TOKEN_FILE": tokFile}
		if err := poll(t, "", env); err != nil {
			t.Fatalf("Poll with MACHINA_* = %v", err)
		}
	})
	t.Run("without the CA", func(t *testing.T) {
		cfg := "repo: " + url + "\nrepo-username: " + user + "\nrepo-token-file: " + tokFile + "\n"
		if err := poll(t, cfg, nil); err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("Poll without repo-ca-file = %v, want an untrusted certificate", err)
		}
	})
	t.Run("default user", func(t *testing.T) {
		cfg := "repo: " + url + "\nrepo-ca-file: " + caFile + "\nrepo-token-file: " + tokFile + "\n"
		if err := poll(t, cfg, nil); err == nil {
			t.Fatal("Poll as x-access-token succeeded against a server that wants machina-bot")
		}
	})
}
