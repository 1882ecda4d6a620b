package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/machina-metal/machina/api/v1"
)

func TestUsageAndErrors(t *testing.T) {
	t.Setenv(envToken, "")
	for name, c := range map[string]struct {
		args []string
		code int
		want string
	}{
		"no args":        {nil, 2, "usage"},
		"unknown":        {[]string{"frob"}, 2, `unknown command "frob"`},
		"join no url":    {[]string{"join"}, 2, "--url and --fingerprint are required"},
		"join no token":  {[]string{"join", "--url", "https://127.0.0.1:1", "--fingerprint", strings.Repeat("a", 64)}, 2, "no enrolment token"},
		"run not joined": {[]string{"run", "--dir", t.TempDir()}, 1, "has this host joined?"},
	} {
		var out, errb bytes.Buffer
		if code := run(t.Context(), c.args, &out, &errb); code != c.code || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%s: exit %d stderr %q, want %d containing %q", name, code, errb.String(), c.code, c.want)
		}
	}
}

func TestFactsAndUnit(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(t.Context(), []string{"facts"}, &out, &errb); code != 0 {
		t.Fatalf("facts: exit %d %s", code, errb.String())
	}
	var f v1.HostFacts
	if err := json.Unmarshal(out.Bytes(), &f); err != nil || f.Hostname == "" || f.MemoryBytes <= 0 {
		t.Fatalf("facts = %+v, %v", f, err)
	}
	dir := t.TempDir()
	out.Reset()
	if code := run(t.Context(), []string{"install-unit", "--dir", "/var/lib/machina-node", "--unit-dir", dir, "--no-enable"}, &out, &errb); code != 0 {
		t.Fatalf("install-unit: exit %d %s", code, errb.String())
	}
	unit, err := os.ReadFile(filepath.Join(dir, unitName))
	if err != nil || !strings.Contains(string(unit), " run --dir /var/lib/machina-node\n") || !strings.Contains(string(unit), "WantedBy=multi-user.target") {
		t.Fatalf("unit = %s, %v", unit, err)
	}
	if code := run(t.Context(), []string{"install-unit", "--dir", "relative/dir", "--unit-dir", dir, "--no-enable"}, &out, &errb); code != 2 {
		t.Fatalf("relative dir: exit %d, want 2", code)
	}
}
