package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/state"
)

// bootstrapT runs machina bootstrap under a temporary root with loopback
// listeners and returns the root, the printed token and stderr.
func bootstrapT(t *testing.T, extra ...string) (root, token, stderr string) {
	t.Helper()
	root = t.TempDir()
	args := append([]string{"bootstrap", "--root", root, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--join-listen", "127.0.0.1:0"}, extra...)
	var out, errb bytes.Buffer
	if code := run(context.Background(), args, strings.NewReader(""), &out, &errb); code != 0 {
		t.Fatalf("bootstrap: exit %d: %s", code, errb.String())
	}
	return root, strings.TrimSpace(out.String()), errb.String()
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// TestBootstrapCreatesSite checks every file bootstrap writes, its mode and
// content: the master key's format, a state file that opens with it (and
// refuses another key), the CA whose certificate is ca.pem, the admin
// token that authenticates and is printed once on stdout only, a
// machina.yaml serve accepts, and the hardened unit.
func TestBootstrapCreatesSite(t *testing.T) {
	root, tok, stderr := bootstrapT(t, "--repo", "https://git.example/site/inventory.git")
	if !strings.HasPrefix(tok, state.AdminTokenPrefix) || strings.Contains(tok, "\n") {
		t.Fatalf("stdout %q: want the admin token alone", tok)
	}
	if strings.Contains(stderr, tok) {
		t.Error("the admin token is on stderr too")
	}
	etc, lib := filepath.Join(root, "etc/machina"), filepath.Join(root, "var/lib/machina")
	for path, want := range map[string]os.FileMode{
		filepath.Join(etc, "master.key"):                          0o600,
		filepath.Join(lib, "state.db"):                            0o600,
		filepath.Join(etc, "ca.pem"):                              0o644,
		filepath.Join(etc, "machina.yaml"):                        0o640,
		filepath.Join(root, "etc/systemd/system/machina.service"): 0o644,
		lib:                       0o700,
		filepath.Join(lib, "iso"): 0o750,
	} {
		if got := mode(t, path); got != want {
			t.Errorf("%s: mode %04o, want %04o", path, got, want)
		}
	}
	keyFile, err := os.ReadFile(filepath.Join(etc, "master.key"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^[0-9a-f]{64}\n$`).Match(keyFile) {
		t.Errorf("master.key %q: want 64 lower-case hex digits and a newline", keyFile)
	}
	if raw, _ := hex.DecodeString(strings.TrimSpace(string(keyFile))); len(raw) != MasterKeyBytes {
		t.Errorf("master key holds %d random bytes, want %d", len(raw), MasterKeyBytes)
	}
	if strings.Contains(stderr, strings.TrimSpace(string(keyFile))) {
		t.Error("the master key is printed")
	}
	key, err := readMasterKeyFile(filepath.Join(etc, "master.key"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := state.Open(filepath.Join(lib, "state.db"), state.Options{MasterKey: []byte("another-key-of-enough-length")}); !errors.Is(err, state.ErrWrongMasterKey) {
		t.Errorf("open with another key: %v, want ErrWrongMasterKey", err)
	}
	st, err := state.Open(filepath.Join(lib, "state.db"), state.Options{MasterKey: key})
	if err != nil {
		t.Fatal(err)
	}
	if at, err := st.AuthenticateAdmin(tok); err != nil || at.Name != "admin" {
		t.Errorf("token: %+v, %v", at, err)
	}
	ca, err := join.LoadOrCreateCA(st, nil)
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _ := os.ReadFile(filepath.Join(etc, "ca.pem"))
	if !bytes.Equal(caPEM, ca.PEM()) {
		t.Error("ca.pem is not the state file's CA")
	}
	// machina.yaml is accepted by serve and points at the files above.
	cmd := newServeCmd(&env{})
	if err := applySources(cmd.Flags(), filepath.Join(etc, "machina.yaml"), func(string) string { return "" }, "config"); err != nil {
		t.Fatalf("serve rejects bootstrap's machina.yaml: %v", err)
	}
	for flag, want := range map[string]string{"state": filepath.Join(lib, "state.db"), "master-key-file": filepath.Join(etc, "master.key"),
		"repo": "https://git.example/site/inventory.git", "admin-listen": "127.0.0.1:0", "work-dir": lib,
		// Virtual-media boot needs the ISO folder (it was left out).
		"iso-dir": filepath.Join(lib, "iso")} {
		if got := cmd.Flags().Lookup(flag).Value.String(); got != want {
			t.Errorf("machina.yaml %s = %q, want %q", flag, got, want)
		}
	}
	unit, _ := os.ReadFile(filepath.Join(root, "etc/systemd/system/machina.service"))
	for _, line := range []string{"NoNewPrivileges=yes", "ProtectSystem=strict", "StateDirectory=machina",
		// No DHCP, TFTP, VIP or low port configured: no capability.
		"CapabilityBoundingSet=", "AmbientCapabilities=", "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK",
		"ExecStart=/usr/bin/machina serve --config " + filepath.Join(etc, "machina.yaml"), "User=machina"} {
		if !strings.Contains(string(unit), line+"\n") {
			t.Errorf("unit lacks %q", line)
		}
	}
}

// TestBootstrapProvisioningInterface fills DHCP, TFTP and the URLs from
// the interface's address (lo here: the only interface a test may use).
func TestBootstrapProvisioningInterface(t *testing.T) {
	root, _, _ := bootstrapT(t, "--provisioning-interface", "lo", "--dhcp-pool", "127.0.0.100-127.0.0.199", "--listen", ":8080")
	cmd := newServeCmd(&env{})
	if err := applySources(cmd.Flags(), filepath.Join(root, "etc/machina/machina.yaml"), func(string) string { return "" }, "config"); err != nil {
		t.Fatal(err)
	}
	for flag, want := range map[string]string{"dhcp-interface": "[lo]", "dhcp-mode": "full", "public-url": "http://127.0.0.1:8080",
		"tftp-root": "/usr/lib/ipxe"} {
		if got := cmd.Flags().Lookup(flag).Value.String(); got != want {
			t.Errorf("%s = %q, want %q", flag, got, want)
		}
	}
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"bootstrap", "--root", t.TempDir(), "--provisioning-interface", "lo", "--dhcp-pool", "10.0.0.1-10.0.0.9"}, strings.NewReader(""), &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "--dhcp-pool") {
		t.Errorf("a pool outside the interface's subnet: exit %d, %q", code, errb.String())
	}
	if out.Len() != 0 {
		t.Error("a refused bootstrap printed a token")
	}
}

// TestBootstrapRefusesExistingSite: a second bootstrap changes nothing,
// names the files and says how to run or start over; a refused first
// bootstrap (bad flag) leaves nothing behind.
func TestBootstrapRefusesExistingSite(t *testing.T) {
	root, _, _ := bootstrapT(t)
	keyPath := filepath.Join(root, "etc/machina/master.key")
	before, _ := os.ReadFile(keyPath)
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"bootstrap", "--root", root}, strings.NewReader(""), &out, &errb)
	if code != 1 {
		t.Fatalf("second bootstrap: exit %d, want 1", code)
	}
	for _, want := range []string{"already exists", keyPath, "state.db", "machina serve --config", "--root DIR", "machinactl state snapshot"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("refusal %q lacks %q", errb.String(), want)
		}
	}
	if after, _ := os.ReadFile(keyPath); !bytes.Equal(before, after) || out.Len() != 0 {
		t.Error("the refused bootstrap changed the master key or printed a token")
	}

	empty := t.TempDir()
	code = run(context.Background(), []string{"bootstrap", "--root", empty, "--admin-listen", "nope"}, strings.NewReader(""), &out, &errb)
	if code != 2 {
		t.Errorf("bad --admin-listen: exit %d, want 2", code)
	}
	if ents, _ := os.ReadDir(empty); len(ents) != 0 {
		t.Errorf("a refused bootstrap left %v", ents)
	}
}

// TestUnitMatchesPackage: the Debian package's machina.service is
// bootstrap's unit rendered with the package's paths.
func TestUnitMatchesPackage(t *testing.T) {
	want, err := renderUnit("/usr/bin/machina", "/etc/machina/machina.yaml", "machina", allFeatures)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../packaging/deb/machina.service")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("packaging/deb/machina.service differs from renderUnit; regenerate it with:\n  go run ./cmd/machina bootstrap --print-unit > packaging/deb/machina.service")
	}
}

// TestServeFromBootstrapConfig runs machina serve --config on bootstrap's
// files: the admin API answers over TLS, verified against ca.pem alone,
// with the printed token; the TLS port refuses plain HTTP; neither the
// token nor the master key reaches the logs.
func TestServeFromBootstrapConfig(t *testing.T) {
	root, tok, _ := bootstrapT(t)
	etc := filepath.Join(root, "etc/machina")
	logs := &lockedBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--config", filepath.Join(etc, "machina.yaml")}, strings.NewReader(""), &bytes.Buffer{}, logs)
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve: exit %d: %s", code, logs.String())
		}
	}()
	var adminURL string
	deadline := time.Now().Add(20 * time.Second)
	for adminURL == "" {
		for _, line := range strings.Split(logs.String(), "\n") {
			var rec struct{ Msg, URL string }
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "admin API listening (TLS)" {
				adminURL = rec.URL
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no TLS listener in the logs: %s", logs.String())
		}
		select {
		case code := <-done:
			t.Fatalf("serve exited %d: %s", code, logs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	caPEM, _ := os.ReadFile(filepath.Join(etc, "ca.pem"))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	req, _ := http.NewRequest("GET", adminURL+"/api/v1/status", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("admin API over TLS: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("GET /api/v1/status over TLS = %d", resp.StatusCode)
	}
	plain := "http://" + strings.TrimPrefix(adminURL, "https://") + "/api/v1/status"
	if resp, err := http.Get(plain); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP to the TLS port = %d, want 400", resp.StatusCode)
		}
	}
	key, _ := os.ReadFile(filepath.Join(etc, "master.key"))
	if l := logs.String(); strings.Contains(l, tok) || strings.Contains(l, strings.TrimSpace(string(key))) {
		t.Error("the logs hold the admin token or the master key")
	}
	if !strings.Contains(logs.String(), "sealed with AES-256-GCM") {
		t.Errorf("serve did not seal with the key file: %s", logs.String())
	}
}
