package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "machina.yaml")
	if err := os.WriteFile(p, []byte(body), 0o640); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestServeConfigErrorsNameFileAndLine: an unknown key, a bad value, a
// list for a single-valued flag, a repeated key and a nested mapping each
// stop machina serve (exit 2) naming the file, line and key.
func TestServeConfigErrorsNameFileAndLine(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"listen: 127.0.0.1:0\n# comment\nlisen: 127.0.0.1:1\n", `:3: unknown key "lisen"`},
		{"workers: many\n", `:1: key "workers"`},
		{"listen:\n  - a\n  - b\n", `:1: key "listen" takes one value`},
		{"branch: a\nbranch: b\n", `:2: key "branch" repeats line 1`},
		{"repo:\n  url: x\n", `key "repo": want a scalar or a list`},
		{"config: other.yaml\n", `:1: unknown key "config"`},
		{"- a\n", `:1: want a mapping`},
	} {
		path := writeConfig(t, tc.body)
		var out, errb bytes.Buffer
		code := run(context.Background(), []string{"serve", "--config", path}, strings.NewReader(""), &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), path) || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("config %q: exit %d, stderr %q; want exit 2 naming %s%s", tc.body, code, errb.String(), path, tc.want)
		}
	}
}

// TestServeConfigPrecedence: a flag beats MACHINA_<FLAG>, which beats the
// file, which beats the default; lists replace the default.
func TestServeConfigPrecedence(t *testing.T) {
	path := writeConfig(t, "workers: 5\nbranch: from-file\nlog-level: debug\nper-rack: 2\ndhcp-interface: [eno2, eno3]\npoll-interval: 1m\n")
	cmd := newServeCmd(&env{})
	fs := cmd.Flags()
	if err := fs.Parse([]string{"--workers", "3"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"MACHINA_WORKERS": "7", "MACHINA_BRANCH": "from-env", "MACHINA_PER_RACK": ""}
	if err := applySources(fs, path, func(k string) string { return env[k] }, "config"); err != nil {
		t.Fatal(err)
	}
	for flag, want := range map[string]string{
		"workers":        "3",        // flag over env and file
		"branch":         "from-env", // env over file
		"log-level":      "debug",    // file over default
		"per-rack":       "2",        // an empty env value does not count
		"dhcp-interface": "[eno2,eno3]",
		"poll-interval":  "1m0s",
		"brake-share":    "0.2", // default
	} {
		if got := fs.Lookup(flag).Value.String(); got != want {
			t.Errorf("%s = %q, want %q", flag, got, want)
		}
	}
}

// TestPrintConfigRoundTrip: --print-config's output (the package's
// /usr/share/machina/machina.yaml.default) is a config serve accepts and
// that gives the same configuration back.
func TestPrintConfigRoundTrip(t *testing.T) {
	for _, k := range []string{"MACHINA_BRANCH", "MACHINA_LISTEN", "MACHINA_STATE", "MACHINA_WORK_DIR"} {
		t.Setenv(k, "")
	}
	in := writeConfig(t, "workers: 5\ndhcp-interface: [eno2]\nbranch: site\n")
	var first, second, errb bytes.Buffer
	if code := run(context.Background(), []string{"serve", "--config", in, "--print-config"}, strings.NewReader(""), &first, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"\nworkers: \"5\"\n", "\ndhcp-interface:\n  - \"eno2\"\n", "\nbranch: \"site\"\n", "\nlisten: \"127.0.0.1:8080\"\n"} {
		if !strings.Contains(first.String(), want) {
			t.Errorf("--print-config lacks %q", want)
		}
	}
	out := writeConfig(t, first.String())
	if code := run(context.Background(), []string{"serve", "--config", out, "--print-config"}, strings.NewReader(""), &second, &errb); code != 0 {
		t.Fatalf("reading --print-config back: exit %d: %s", code, errb.String())
	}
	if first.String() != second.String() {
		t.Error("--print-config output read back gives another configuration")
	}
}

// TestServeWebhookOutFromConfig: the outgoing webhooks come from the
// --config file as a list (or repeated --webhook-out flags), the kinds
// filter as a list; the secret is only a file name.
func TestServeWebhookOutFromConfig(t *testing.T) {
	path := writeConfig(t, "webhook-out: [\"https://hooks.example.com/a\", \"http://127.0.0.1:9000/b\"]\nwebhook-out-secret-file: /etc/machina/webhook-out.secret\nwebhook-out-kinds: [lifecycle, server.]\n")
	cmd := newServeCmd(&env{})
	fs := cmd.Flags()
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if err := applySources(fs, path, func(string) string { return "" }, "config"); err != nil {
		t.Fatal(err)
	}
	for flag, want := range map[string]string{
		"webhook-out":             "[https://hooks.example.com/a,http://127.0.0.1:9000/b]",
		"webhook-out-secret-file": "/etc/machina/webhook-out.secret",
		"webhook-out-kinds":       "[lifecycle,server.]",
	} {
		if got := fs.Lookup(flag).Value.String(); got != want {
			t.Errorf("%s = %q, want %q", flag, got, want)
		}
	}
}
