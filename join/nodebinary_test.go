package join_test

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/machina-metal/machina/join"
)

// TestNodeBinaryPerArch: /join/machina-node serves the amd64
// build without ?arch (install scripts from before the parameter) and
// with arch=amd64, the arm64 build with arch=arm64, refuses another arch,
// and names the flag when no arm64 build is configured. install.sh asks
// with the arch of `uname -m`.
func TestNodeBinaryPerArch(t *testing.T) {
	dir := t.TempDir()
	amd, arm := filepath.Join(dir, "machina-node"), filepath.Join(dir, "machina-node-arm64")
	for p, body := range map[string]string{amd: "amd64 build", arm: "arm64 build"} {
		if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	get := func(f *fixture, query string) (int, string) {
		t.Helper()
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(f.ca.PEM())
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
		resp, err := c.Get(f.url + "/join/machina-node" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	both := startListenerWith(t, func(c *join.Config) { c.NodeBinary, c.NodeBinaryARM64 = amd, arm })
	for _, tc := range []struct {
		query, body string
		code        int
	}{
		{"", "amd64 build", 200},
		{"?arch=amd64", "amd64 build", 200},
		{"?arch=arm64", "arm64 build", 200},
		{"?arch=riscv64", "want amd64 or arm64", 400},
	} {
		if code, body := get(both, tc.query); code != tc.code || !strings.Contains(body, tc.body) {
			t.Errorf("GET /join/machina-node%s = %d %q, want %d with %q", tc.query, code, body, tc.code, tc.body)
		}
	}
	amdOnly := startListener(t, amd)
	if code, body := get(amdOnly, "?arch=arm64"); code != 404 || !strings.Contains(body, "--node-binary-arm64") {
		t.Errorf("arm64 request without an arm64 build = %d %q, want 404 naming --node-binary-arm64", code, body)
	}
	if code, body := get(amdOnly, ""); code != 200 || body != "amd64 build" {
		t.Errorf("amd64 request = %d %q", code, body)
	}
	script, err := os.ReadFile("install.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(script), `"$url/join/machina-node?arch=$arch"`) || !strings.Contains(string(script), "aarch64 | arm64) arch=arm64") {
		t.Error("install.sh does not ask for the machine's arch")
	}
}
