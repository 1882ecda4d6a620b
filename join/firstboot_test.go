package join_test

import (
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/join/node"
)

func needTools(t *testing.T, tools ...string) {
	t.Helper()
	peertest.Commands(t, tools...)
}

// runFirstBoot runs the rendered first-boot command with sh, as cloud-init's
// runcmd would, with MACHINA_PREFIX so the install lands in a temp dir.
func runFirstBoot(t *testing.T, script, prefix string) (string, error) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "sh", "-c", script)
	cmd.Env = append(os.Environ(), "MACHINA_PREFIX="+prefix)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestFirstBootCommandRefusesMismatches(t *testing.T) {
	needTools(t, "sh", "curl", "openssl", "sha256sum")
	f := startListener(t, "")
	other := startListener(t, "")
	tok := f.token(t, v1.EnrolmentRequest{})
	for name, c := range map[string]struct{ fp, sha, want string }{
		"wrong CA":              {other.ca.Fingerprint(), join.ScriptSHA256(), "CA fingerprint mismatch"},
		"wrong script checksum": {f.ca.Fingerprint(), strings.Repeat("ab", 32), "install script checksum mismatch"},
	} {
		t.Run(name, func(t *testing.T) {
			script, err := join.FirstBootCommand(f.url, c.fp, c.sha, tok.Token)
			if err != nil {
				t.Fatal(err)
			}
			prefix := t.TempDir()
			out, err := runFirstBoot(t, script, prefix)
			if err == nil || !strings.Contains(out, c.want) {
				t.Fatalf("first boot with %s: err %v output %q, want failure with %q", name, err, out, c.want)
			}
			if _, err := os.Stat(filepath.Join(prefix, "usr/local/bin")); !os.IsNotExist(err) {
				t.Fatalf("install script ran despite %s", name)
			}
		})
	}
	// The token was never presented: the listener was refused first.
	if _, err := f.store.ConsumeEnrolmentToken(tok.Token, "x"); err != nil {
		t.Fatalf("token consumed by refused first boots: %v", err)
	}
}

func TestFirstBootCommandArgumentValidation(t *testing.T) {
	fp, sha := strings.Repeat("a", 64), strings.Repeat("b", 64)
	for name, args := range map[string][4]string{
		"http URL":        {"http://10.0.0.1:8443", fp, sha, "mj_abcdefghijklmnopqrstuvwxyz"},
		"quote in URL":    {"https://10.0.0.1/'x", fp, sha, "mj_abcdefghijklmnopqrstuvwxyz"},
		"query in URL":    {"https://10.0.0.1/?a=b", fp, sha, "mj_abcdefghijklmnopqrstuvwxyz"},
		"short fp":        {"https://10.0.0.1", "abc", sha, "mj_abcdefghijklmnopqrstuvwxyz"},
		"upper sha":       {"https://10.0.0.1", fp, strings.ToUpper(sha), "mj_abcdefghijklmnopqrstuvwxyz"},
		"quote in token":  {"https://10.0.0.1", fp, sha, "mj_abc'defghijklmnopqrstuvwxyz"},
		"space in token":  {"https://10.0.0.1", fp, sha, "mj_abc defghijklmnopqrstuvwxyz"},
		"token too short": {"https://10.0.0.1", fp, sha, "abc"},
	} {
		if _, err := join.FirstBootCommand(args[0], args[1], args[2], args[3]); err == nil {
			t.Errorf("FirstBootCommand(%s) = nil error", name)
		}
	}
	lines, err := join.RunCmd("https://10.0.0.1:8443/", fp, sha, "mj_abcdefghijklmnopqrstuvwxyz")
	if err != nil || len(lines) != 1 || !strings.Contains(lines[0], "u='https://10.0.0.1:8443'") {
		t.Fatalf("RunCmd = %q, %v", lines, err)
	}
	// The seed and the installers take one line under 4 KiB.
	if strings.ContainsAny(lines[0], "\n\r") || len(lines[0]) >= 4096 {
		t.Fatalf("first-boot command is %d bytes with newlines=%v", len(lines[0]), strings.ContainsAny(lines[0], "\n\r"))
	}
	for _, bad := range []string{"relative/tok", "/run/../etc/shadow", "/run/tok'x", ""} {
		if _, err := join.FirstBootCommandFromFile("https://10.0.0.1", fp, sha, bad); err == nil {
			t.Errorf("FirstBootCommandFromFile(%q) = nil error", bad)
		}
	}
	c, err := join.FirstBootCommandFromFile("https://10.0.0.1", fp, sha, "/run/machina/join-token")
	if err != nil || strings.Contains(c, "\n") || !strings.Contains(c, "tf='/run/machina/join-token'") || !strings.Contains(c, `trap 'rm -rf "$d" "$tf"' EXIT`) {
		t.Fatalf("FirstBootCommandFromFile = %q, %v", c, err)
	}
}

// buildNode builds cmd/machina-node into a temp dir.
func buildNode(t *testing.T) string {
	t.Helper()
	needTools(t, "go")
	bin := filepath.Join(t.TempDir(), "machina-node")
	cmd := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "../cmd/machina-node")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build machina-node: %v\n%s", err, out)
	}
	return bin
}

// TestFirstBootJoinsEndToEnd runs the real first-boot command with sh, curl
// and openssl: it pins the CA, verifies the script, installs the real
// machina-node from the listener, and joins (with a directory pool).
func TestFirstBootJoinsEndToEnd(t *testing.T) {
	needTools(t, "sh", "curl", "openssl", "sha256sum")
	f := startListener(t, buildNode(t))
	hn, _ := os.Hostname()
	host := strings.ToLower(strings.SplitN(hn, ".", 2)[0])
	poolDir := filepath.Join(t.TempDir(), "pool", "images")
	tok := f.token(t, v1.EnrolmentRequest{Site: "lab1", Tags: []string{"e2e"},
		Pools: []v1.JoinPool{{Name: "images", Type: v1.PoolDir, Path: poolDir}}})
	script, err := join.FirstBootCommand(tok.JoinURL, tok.CAFingerprint, tok.ScriptSHA256, tok.Token)
	if err != nil {
		t.Fatal(err)
	}
	prefix := t.TempDir()
	out, err := runFirstBoot(t, script, prefix)
	if err != nil {
		t.Fatalf("first boot: %v\n%s", err, out)
	}
	if !strings.Contains(out, "joined as "+host) || strings.Contains(out, tok.Token) {
		t.Fatalf("first boot output:\n%s", out)
	}
	if fi, err := os.Stat(poolDir); err != nil || !fi.IsDir() {
		t.Fatalf("pool directory: %v", err)
	}
	h, err := f.store.Host(host)
	if err != nil || h.JoinStatus != "joined" || h.Site != "lab1" {
		t.Fatalf("host = %+v, %v", h, err)
	}
	log, _ := f.store.JoinLog(host)
	var steps []string
	for _, e := range log {
		steps = append(steps, e.Step)
	}
	if !strings.Contains(strings.Join(steps, ","), "pool images") {
		t.Fatalf("join log steps %v lack the pool step", steps)
	}
	for _, name := range []string{"node.key", "node.crt", "ca.pem", "node.json"} {
		fi, err := os.Stat(filepath.Join(prefix, "var/lib/machina-node", name))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v mode %v, want 0600", name, err, fi.Mode().Perm())
		}
	}
	// The token-file variant joins another host the same way, with the
	// token never on a command line.
	tok2 := f.token(t, v1.EnrolmentRequest{Site: "lab1"})
	tokFile := filepath.Join(t.TempDir(), "join-token")
	os.WriteFile(tokFile, []byte(tok2.Token+"\n"), 0o600)
	script2, err := join.FirstBootCommandFromFile(tok2.JoinURL, tok2.CAFingerprint, tok2.ScriptSHA256, tokFile)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(script2, tok2.Token) {
		t.Fatal("the token-file command carries the token")
	}
	cmd := exec.CommandContext(t.Context(), "sh", "-c", script2)
	cmd.Env = append(os.Environ(), "MACHINA_PREFIX="+t.TempDir(), "MACHINA_NODE_HOSTNAME=e2e-file")
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "joined as e2e-file") {
		t.Fatalf("first boot from token file: %v\n%s", err, out)
	}
	// The token file is removed after use.
	if _, err := os.Stat(tokFile); !os.IsNotExist(err) {
		t.Fatalf("token file after the join: %v, want removed", err)
	}
	// The installed node's key and certificate heartbeat over mutual TLS.
	nc, err := node.Load(filepath.Join(prefix, "var/lib/machina-node"))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Beat(t.Context()); err != nil {
		t.Fatalf("heartbeat with the installed certificate: %v", err)
	}
	if views := f.srv.HostViews(mustHosts(t, f.store)); !views[0].Online && !views[1].Online {
		t.Fatalf("no host online after a heartbeat: %+v", views)
	}
	// The installed machina-node writes its systemd unit.
	mn := filepath.Join(prefix, "usr/local/bin/machina-node")
	unitDir := t.TempDir()
	if out, err := exec.Command(mn, "install-unit", "--dir", filepath.Join(prefix, "var/lib/machina-node"), "--unit-dir", unitDir, "--no-enable").CombinedOutput(); err != nil {
		t.Fatalf("install-unit: %v\n%s", err, out)
	}
	unit, err := os.ReadFile(filepath.Join(unitDir, "machina-node.service"))
	if err != nil || !strings.Contains(string(unit), "ExecStart="+mn+" run --dir ") {
		t.Fatalf("unit file: %v\n%s", err, unit)
	}
}

func TestAdminRoutes(t *testing.T) {
	f := startListener(t, "")
	as, err := api.New(api.Config{Store: f.store})
	if err != nil {
		t.Fatal(err)
	}
	if err := join.RegisterAdmin(as, f.srv, api.Actor); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(as.Handler())
	defer hs.Close()
	admin, _, err := f.store.CreateAdminToken("ops", "test")
	if err != nil {
		t.Fatal(err)
	}
	c, _ := v1.NewClient(hs.URL, admin)
	tok, err := c.CreateEnrolmentToken(t.Context(), v1.EnrolmentRequest{Site: "lab1", Rack: "r2", Tags: []string{"x"}, TTL: "10m",
		Networks: []v1.JoinNetwork{{Name: "prod", Bridge: "br-prod", NIC: "eth1", VLAN: 20}}})
	if err != nil {
		t.Fatal(err)
	}
	if tok.JoinURL != f.url || tok.CAFingerprint != f.ca.Fingerprint() || tok.ScriptSHA256 != join.ScriptSHA256() || tok.Token == "" {
		t.Fatalf("token answer = %+v", tok)
	}
	if _, err := c.CreateEnrolmentToken(t.Context(), v1.EnrolmentRequest{TTL: "9999h"}); !v1.IsCode(err, v1.CodeBadRequest) {
		t.Fatalf("bad TTL = %v, want bad_request", err)
	}
	anon, _ := v1.NewClient(hs.URL, "")
	if _, err := anon.CreateEnrolmentToken(t.Context(), v1.EnrolmentRequest{}); !v1.IsCode(err, v1.CodeUnauthorized) {
		t.Fatalf("without admin token = %v, want unauthorized", err)
	}
	list, err := c.Hosts(t.Context())
	if err != nil || len(list.Items) != 0 {
		t.Fatalf("Hosts = %+v, %v", list, err)
	}
}

func TestParseFirstBootCommandRoundTrip(t *testing.T) {
	fp := strings.Repeat("ab", 32)
	cmd, err := join.FirstBootCommand("https://10.0.0.1:8443", fp, join.ScriptSHA256(), "tok_0123456789abcdefXYZ")
	if err != nil {
		t.Fatal(err)
	}
	u, gotFP, tok, tf, err := join.ParseFirstBootCommand(cmd)
	if err != nil || u != "https://10.0.0.1:8443" || gotFP != fp || tok != "tok_0123456789abcdefXYZ" {
		t.Errorf("ParseFirstBootCommand = %q, %q, %q, %v", u, gotFP, tok, err)
	}
	if tf != "" {
		t.Errorf("ParseFirstBootCommand(inline) token file = %q, want none", tf)
	}
	fcmd, err := join.FirstBootCommandFromFile("https://10.0.0.1:8443", fp, join.ScriptSHA256(), "/var/lib/machina/join-token")
	if err != nil {
		t.Fatal(err)
	}
	if u, gotFP, tok, tf, err := join.ParseFirstBootCommand(fcmd); err != nil || u != "https://10.0.0.1:8443" || gotFP != fp || tok != "" || tf != "/var/lib/machina/join-token" {
		t.Errorf("ParseFirstBootCommand(file variant) = %q, %q, %q, %q, %v", u, gotFP, tok, tf, err)
	}
	if _, _, _, _, err := join.ParseFirstBootCommand("echo hello"); err == nil {
		t.Error("ParseFirstBootCommand accepted a command without join values")
	}
}
