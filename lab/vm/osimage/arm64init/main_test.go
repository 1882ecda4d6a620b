//go:build linux

package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/join"
	"github.com/machina-metal/machina/ramdisk/agent"
)

// TestParseRenderedSeed: what the ramdisk writes (agent.RenderSeed with
// the controller's token-file join command) is what the arm64 first boot
// applies: hostname, the token file (0600) and the join command as one
// [sh, -c, CMD] runcmd entry, byte for byte.
func TestParseRenderedSeed(t *testing.T) {
	fp := strings.Repeat("ab", 32)
	cmd, err := join.FirstBootCommandFromFile("https://10.99.0.1:8443", fp, fp, v1.JoinTokenPath)
	if err != nil {
		t.Fatal(err)
	}
	files, err := agent.RenderSeed(v1.Seed{InstanceID: "vm-arm64-1", Hostname: "vm-arm64", JoinCommand: cmd,
		JoinToken: "tok_0123456789abcdefXYZ", SSHKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO4VqFGm2ahY3KSc9k9lrQMD0j2/tR46oEgCPUxiE9s7 ops@lab"}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]byte{}
	for _, f := range files {
		got[f.Name] = f.Data
	}
	s, err := parseSeed(got["meta-data"], got["user-data"])
	if err != nil {
		t.Fatal(err)
	}
	if s.meta.LocalHostname != "vm-arm64" || s.meta.InstanceID != "vm-arm64-1" || s.users != 1 {
		t.Errorf("meta %+v users %d", s.meta, s.users)
	}
	if len(s.files) != 1 || s.files[0].Path != v1.JoinTokenPath || s.files[0].Mode != 0o600 || string(s.files[0].Data) != "tok_0123456789abcdefXYZ" {
		t.Errorf("write_files = %+v", s.files)
	}
	if want := [][]string{{"sh", "-c", cmd}}; !reflect.DeepEqual(s.runcmd, want) {
		t.Errorf("runcmd = %q, want %q", s.runcmd, want)
	}
}

func TestParseSeedRefuses(t *testing.T) {
	md := []byte("instance-id: a\n")
	for name, ud := range map[string]string{
		"not cloud-config": "runcmd: [ls]\n",
		"relative path":    "#cloud-config\nwrite_files:\n  - path: etc/x\n    content: a\n",
		"dot-dot":          "#cloud-config\nwrite_files:\n  - path: /etc/../x\n    content: a\n",
		"bad mode":         "#cloud-config\nwrite_files:\n  - path: /etc/x\n    permissions: \"0999\"\n",
		"empty runcmd":     "#cloud-config\nruncmd:\n  - []\n",
	} {
		if _, err := parseSeed(md, []byte(ud)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// A string runcmd entry runs with sh -c, as cloud-init's does.
	s, err := parseSeed(md, []byte("#cloud-config\nruncmd:\n  - echo hi\n"))
	if err != nil || !reflect.DeepEqual(s.runcmd, [][]string{{"sh", "-c", "echo hi"}}) {
		t.Errorf("string runcmd = %q, %v", s.runcmd, err)
	}
}

// TestExecStart: the unit install-unit writes gives PID 1 its ExecStart;
// systemctl takes daemon-reload and refuses verbs it does not implement
// (enable writes under /run, so the VM lab covers it).
func TestExecStart(t *testing.T) {
	p := filepath.Join(t.TempDir(), "machina-node.service")
	unit := "[Unit]\nDescription=x\n\n[Service]\nType=simple\nExecStart=/usr/local/bin/machina-node run --dir /var/lib/machina-node\nRestart=always\n"
	if err := os.WriteFile(p, []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	argv, err := execStart(p)
	if err != nil || !reflect.DeepEqual(argv, []string{"/usr/local/bin/machina-node", "run", "--dir", "/var/lib/machina-node"}) {
		t.Errorf("execStart = %q, %v", argv, err)
	}
	if _, err := execStart(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("missing unit accepted")
	}
	if systemctl([]string{"daemon-reload"}) != 0 {
		t.Error("daemon-reload failed")
	}
	if systemctl([]string{"restart", "x"}) != 2 {
		t.Error("unsupported verb accepted")
	}
}
