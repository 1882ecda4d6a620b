package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
)

// TestSimUntilDeployed runs `machina sim --until-deployed` as make demo
// does (without its interactive wait): the example site commissions and
// its profiles' counts deploy.
func TestSimUntilDeployed(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"sim", "--until-deployed", "--timeout", "3m", "--boot-delay", "0", "--poll", "200ms", "--dir", t.TempDir()},
		strings.NewReader(""), &out, &errOut)
	if code != 0 {
		t.Fatalf("machina sim: exit %d\n%s\n%s", code, out.String(), errOut.String())
	}
	for _, want := range []string{"new → commissioning", "commissioning → ready", "deploying → deployed", "joined the fleet", "Every profile's count is deployed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestSimRefusesNonLoopbackListen checks that machina sim refuses a
// --listen address off loopback (it listened on every interface with
// 0.0.0.0:0) with exit 2 before making the lab, and accepts loopback ones.
func TestSimRefusesNonLoopbackListen(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "10.0.0.1:8080", "lab1.example:80", "127.0.0.1"} {
		dir := t.TempDir()
		var out, errOut bytes.Buffer
		// --timeout bounds a regression (the lab would start and run).
		code := run(context.Background(), []string{"sim", "--listen", addr, "--dir", dir, "--timeout", "30s"}, strings.NewReader(""), &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), "--listen") {
			t.Errorf("--listen %s: exit %d, stderr %q; want 2 and the flag named", addr, code, errOut.String())
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("--listen %s: refused but the folder has %d entries", addr, len(ents))
		}
	}
	if !strings.Contains(func() string {
		var out, errOut bytes.Buffer
		run(context.Background(), []string{"sim", "--listen", "0.0.0.0:0", "--dir", t.TempDir()}, strings.NewReader(""), &out, &errOut)
		return errOut.String()
	}(), "loopback only") {
		t.Error("the refusal does not say loopback only")
	}
	for _, addr := range []string{"127.0.0.1:0", "127.0.0.2:8080", "[::1]:0", "localhost:0"} {
		if err := checkLoopbackListen(addr); err != nil {
			t.Errorf("checkLoopbackListen(%q) = %v, want nil", addr, err)
		}
	}
}
