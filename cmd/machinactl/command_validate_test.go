package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/inventory"
)

var update = flag.Bool("update", false, "rewrite golden files")

const corpus = "../../inventory/testdata"

// runCLI runs machinactl in-process and returns stdout, stderr and the exit code.
func runCLI(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(""), &out, &errb)
	return out.String(), errb.String(), code
}

// TestValidateCorpus runs `machinactl validate` on every invalid inventory
// under inventory/testdata/invalid and compares its output with the case's
// want.golden; each must exit 1.
func TestValidateCorpus(t *testing.T) {
	cases, err := os.ReadDir(filepath.Join(corpus, "invalid"))
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) < 30 {
		t.Fatalf("corpus has %d cases, want at least 30", len(cases))
	}
	for _, c := range cases {
		t.Run(c.Name(), func(t *testing.T) {
			dir := filepath.Join(corpus, "invalid", c.Name())
			if _, err := os.Stat(filepath.Join(dir, ".generate-20MiB")); err == nil {
				dir = hugeCase(t, dir)
			}
			args := []string{"validate"}
			if b, err := os.ReadFile(filepath.Join(dir, "args")); err == nil {
				args = append(args, strings.Fields(string(b))...)
			}
			stdout, stderr, code := runCLI(t, append(args, dir)...)
			if code != 1 {
				t.Errorf("exit code = %d, want 1; stderr: %s", code, stderr)
			}
			got := strings.ReplaceAll(stdout, dir, "CASE")
			golden := filepath.Join(corpus, "invalid", c.Name(), "want.golden")
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("read golden (run go test ./cmd/machinactl -run TestValidateCorpus -update): %v", err)
			}
			if got != string(want) {
				t.Errorf("validate output mismatch\n--- got\n%s--- want\n%s", got, want)
			}
		})
	}
}

// hugeCase copies dir to a temporary folder and adds a 20 MiB servers.yaml,
// generated rather than committed.
func hugeCase(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	for _, f := range []string{"profiles.yaml", "images.yaml"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var b bytes.Buffer
	b.WriteString("servers:\n")
	for b.Len() < 20<<20 {
		b.WriteString("  # padding padding padding padding padding padding padding padding padding\n")
	}
	if err := os.WriteFile(filepath.Join(dst, "servers.yaml"), b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestValidateValidCorpus(t *testing.T) {
	for _, dir := range []string{"../../inventory-example", filepath.Join(corpus, "valid", "crlf"), filepath.Join(corpus, "valid", "mac-forms"), filepath.Join(corpus, "valid", "networks")} {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			stdout, stderr, code := runCLI(t, "validate", "--strict", dir)
			if code != 0 {
				t.Errorf("validate %s: exit %d\n%s%s", dir, code, stdout, stderr)
			}
		})
	}
}

func TestValidateFormats(t *testing.T) {
	dir := filepath.Join(corpus, "invalid", "bad-mac")
	stdout, _, code := runCLI(t, "validate", "--format", "json", dir)
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	var rep struct {
		Valid  bool
		Errors []struct {
			File    string
			Line    int
			Column  int
			Path    string
			Message string
		}
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("json output: %v\n%s", err, stdout)
	}
	if rep.Valid || len(rep.Errors) != 1 || rep.Errors[0].Path != "servers[1].bootMAC" || rep.Errors[0].Line != 13 || rep.Errors[0].Column != 14 {
		t.Errorf("json report = %+v, want one error at servers.yaml:13:14 servers[1].bootMAC", rep)
	}

	stdout, _, code = runCLI(t, "validate", "--format", "github", dir)
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	wantAnn := "::error file=" + ghProp(filepath.ToSlash(filepath.Join(dir, "servers.yaml"))) + ",line=13,col=14,title=servers[1].bootMAC::\"52:54:00:zz:00:02\" is not a MAC address\n"
	if !strings.HasPrefix(stdout, wantAnn) {
		t.Errorf("github output starts %q, want %q", stdout, wantAnn)
	}
	if !strings.Contains(stdout, "servers.yaml:13:14: servers[1].bootMAC: \"52:54:00:zz:00:02\" is not a MAC address\n") {
		t.Errorf("github output lacks the plain list:\n%s", stdout)
	}

	_, _, code = runCLI(t, "validate", "--format", "xml", dir)
	if code != 2 {
		t.Errorf("bad --format: exit %d, want 2", code)
	}
	_, _, code = runCLI(t, "validate", filepath.Join(corpus, "no-such-dir"))
	if code != 2 {
		t.Errorf("missing dir: exit %d, want 2", code)
	}
}

// TestValidateNeverEchoesSecrets checks that secret-looking values in the
// corpus never reach the output.
func TestValidateNeverEchoesSecrets(t *testing.T) {
	for c, secret := range map[string]string{
		"inline-password":       "Sup3r$ecret!",
		"bmc-url-with-password": "hunter2",
		"private-ssh-key":       "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ",
		"password-field":        "calvin",
	} {
		for _, format := range []string{"text", "json", "github"} {
			stdout, stderr, _ := runCLI(t, "validate", "--format", format, filepath.Join(corpus, "invalid", c))
			if strings.Contains(stdout+stderr, secret) {
				t.Errorf("%s (%s): output repeats the secret:\n%s", c, format, stdout)
			}
		}
	}
}

// TestValidateBaseRefusesStatusEdits: with --base, a change that edits
// status/ by hand fails validation; one that leaves it alone passes.
func TestValidateBaseRefusesStatusEdits(t *testing.T) {
	peertest.Command(t, "git")
	dir := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"}, args...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	for _, f := range inventory.Files {
		b, err := os.ReadFile(filepath.Join("../../inventory-example", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "status", "servers"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "status", "servers", "r1-n01.yaml"), []byte("lifecycle: ready\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git("init", "-q")
	git("add", "-A")
	git("commit", "-qm", "base")
	git("checkout", "-qb", "change")
	if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte("notes\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git("add", "-A")
	git("commit", "-qm", "readme")
	if _, _, code := runCLI(t, "validate", "--base", "main", dir); code != 0 {
		t.Fatalf("README-only change: exit %d, want 0", code)
	}
	if err := os.WriteFile(filepath.Join(dir, "status", "servers", "r1-n01.yaml"), []byte("lifecycle: deployed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git("commit", "-qam", "hand edit")
	stdout, _, code := runCLI(t, "validate", "--base", "main", dir)
	if code != 1 || !strings.Contains(stdout, "status/servers/r1-n01.yaml: edited by hand") {
		t.Errorf("status edit: exit %d, output:\n%s", code, stdout)
	}
}
