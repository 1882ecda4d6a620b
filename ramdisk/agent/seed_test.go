package agent

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/internal/peertest"
)

const seedKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO4VqFGm2ahY3KSc9k9lrQMD0j2/tR46oEgCPUxiE9s7 ops@lab1"

// operatorSeed is a seed with a profile's own user-data and vendor-data.
func operatorSeed() v1.Seed {
	return v1.Seed{InstanceID: "r2-n01-1700000000", Hostname: "r2-n01", SSHKeys: []string{seedKey},
		JoinCommand: "/usr/bin/true join", JoinToken: "tok_0123456789abcdef",
		UserData: json.RawMessage(`{"users":[{"name":"ops","groups":["adm"],"shell":"/bin/bash"},"default"],` +
			`"write_files":[{"path":"/etc/motd","content":"lab1: r2 \"storage\" <tier 2>\n"}],` +
			`"runcmd":[["systemctl","enable","--now","lldpd"]],"packages":["chrony","lldpd"],"timezone":"Europe/Berlin","ntp":{"enabled":true,"servers":["10.20.0.2"]}}`),
		VendorData: json.RawMessage(`{"apt":{"preserve_sources_list":true},"runcmd":["echo vendor"]}`)}
}

// seedFile returns the named file of files.
func seedFile(t *testing.T, files []SeedFile, name string) []byte {
	t.Helper()
	for _, f := range files {
		if f.Name == name {
			return f.Data
		}
	}
	t.Fatalf("seed has no %s", name)
	return nil
}

// pyYAML reads a YAML document as cloud-init does (PyYAML safe_load,
// YAML 1.1) and returns it as decoded JSON.
func pyYAML(t *testing.T, py string, doc []byte) any {
	t.Helper()
	cmd := exec.Command(py, "-c", "import sys, json, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)")
	cmd.Stdin = strings.NewReader(string(doc))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("PyYAML cannot read the document: %v\n%s", err, doc)
	}
	var v any
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestRenderSeedMergesOperatorConfig: a profile's user-data is merged
// after Machina's parts, as cloud-init reads it (PyYAML): user machina
// first with the profile's keys, the operator's users after it, the join
// token file before the operator's files, the join command first in
// runcmd, password and root login off, the operator's other keys as
// given; vendor-data is its own file. cloud-init's own schema check
// (`cloud-init schema --config-file`) accepts both.
func TestRenderSeedMergesOperatorConfig(t *testing.T) {
	py := peertest.Command(t, "python3")
	ci := peertest.Command(t, "cloud-init")
	files, err := RenderSeed(operatorSeed())
	if err != nil {
		t.Fatal(err)
	}
	ud := seedFile(t, files, "user-data")
	got := pyYAML(t, py, ud).(map[string]any)
	want := map[string]any{
		"users": []any{
			map[string]any{"name": "machina", "gecos": "Machina operator", "shell": "/bin/bash", "sudo": "ALL=(ALL) NOPASSWD:ALL", "lock_passwd": true, "ssh_authorized_keys": []any{seedKey}},
			map[string]any{"name": "ops", "groups": []any{"adm"}, "shell": "/bin/bash"}, "default",
		},
		"ssh_pwauth": false, "disable_root": true,
		"write_files": []any{
			map[string]any{"path": v1.JoinTokenPath, "owner": "root:root", "permissions": "0600", "content": "tok_0123456789abcdef"},
			map[string]any{"path": "/etc/motd", "content": "lab1: r2 \"storage\" <tier 2>\n"},
		},
		"runcmd":   []any{[]any{"sh", "-c", "/usr/bin/true join"}, []any{"systemctl", "enable", "--now", "lldpd"}},
		"packages": []any{"chrony", "lldpd"}, "timezone": "Europe/Berlin", "ntp": map[string]any{"enabled": true, "servers": []any{"10.20.0.2"}},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("user-data as cloud-init reads it (-want +got):\n%s\n%s", d, ud)
	}
	vd := seedFile(t, files, "vendor-data")
	if d := cmp.Diff(map[string]any{"apt": map[string]any{"preserve_sources_list": true}, "runcmd": []any{"echo vendor"}}, pyYAML(t, py, vd)); d != "" {
		t.Errorf("vendor-data (-want +got):\n%s\n%s", d, vd)
	}
	dir := t.TempDir()
	for name, doc := range map[string][]byte{"user-data": ud, "vendor-data": vd} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, doc, 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(ci, "schema", "--config-file", p).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "Valid cloud-config") {
			t.Errorf("cloud-init schema --config-file %s: %v\n%s\n%s", name, err, out, doc)
		}
	}
}

// TestRenderSeedRefusesOverrides: an operator's user-data or vendor-data
// that would drop or override Machina's parts is refused.
func TestRenderSeedRefusesOverrides(t *testing.T) {
	for name, raw := range map[string]string{
		"ssh_pwauth":       `{"ssh_pwauth": true}`,
		"disable_root":     `{"disable_root": false}`,
		"machina user":     `{"users": [{"name": "machina", "sudo": false}]}`,
		"machina by name":  `{"users": ["machina"]}`,
		"join token file":  `{"write_files": [{"path": "/var/lib/machina/join-token", "content": "x"}]}`,
		"runcmd not list":  `{"runcmd": "reboot"}`,
		"not a mapping":    `["runcmd"]`,
		"vendor ssh login": `VENDOR{"ssh_pwauth": true}`,
	} {
		s := operatorSeed()
		if v, ok := strings.CutPrefix(raw, "VENDOR"); ok {
			s.VendorData = json.RawMessage(v)
		} else {
			s.UserData = json.RawMessage(raw)
		}
		if _, err := RenderSeed(s); !errors.Is(err, ErrSeedInvalid) {
			t.Errorf("%s: RenderSeed err = %v, want ErrSeedInvalid", name, err)
		}
	}
}
