package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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

// TestSimRestartOnSameDir runs `machina sim --until-deployed` twice on one
// folder: the second run used to fail writing the lab's sysfs trees over
// the first's ("symlink ... file exists"). It starts fresh, says so, keeps
// the earlier state as state.db.previous and appends to controller.log,
// and leaves files of its own in the folder and in the lab folder alone.
func TestSimRestartOnSameDir(t *testing.T) {
	dir := t.TempDir()
	args := []string{"sim", "--until-deployed", "--timeout", "3m", "--boot-delay", "0", "--poll", "200ms", "--dir", dir}
	simRun := func(name string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, strings.NewReader(""), &out, &errOut); code != 0 {
			t.Fatalf("%s machina sim: exit %d\n%s\n%s", name, code, out.String(), errOut.String())
		}
		if !strings.Contains(out.String(), "Every profile's count is deployed") {
			t.Errorf("%s run did not deploy:\n%s", name, out.String())
		}
		return out.String()
	}
	if out := simRun("first"); strings.Contains(out, "restarted") {
		t.Errorf("first run on an empty folder says restarted:\n%s", out)
	}
	log1, err := os.ReadFile(filepath.Join(dir, "controller.log"))
	if err != nil {
		t.Fatal(err)
	}
	// Files the lab does not own stay.
	mine := []string{filepath.Join(dir, "notes.txt"), filepath.Join(dir, "lab", "notes.txt")}
	for _, p := range mine {
		if err := os.WriteFile(p, []byte("mine"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := simRun("second")
	if !strings.Contains(out, "restarted on a folder an earlier run used: the lab and the controller state start fresh") {
		t.Errorf("second run does not say it started fresh:\n%s", out)
	}
	// Fresh state: the second run commissioned the servers again.
	if !strings.Contains(out, "new → commissioning") {
		t.Errorf("second run did not start from new servers:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(dir, "state.db.previous")); err != nil {
		t.Errorf("earlier state not kept: %v", err)
	}
	for _, p := range mine {
		if b, err := os.ReadFile(p); err != nil || string(b) != "mine" {
			t.Errorf("%s: %q, %v; want left alone", p, b, err)
		}
	}
	log2, err := os.ReadFile(filepath.Join(dir, "controller.log"))
	if err != nil || !bytes.HasPrefix(log2, log1) || len(log2) == len(log1) {
		t.Errorf("controller.log not appended to (%d then %d bytes, %v)", len(log1), len(log2), err)
	}
}

// TestResetSimDirRefusesHeldState: a state.db another process holds (as
// bbolt does, flock) is not moved away from under it.
func TestResetSimDirRefusesHeldState(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.db")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if restarted, err := resetSimDir(dir); err == nil || restarted || !strings.Contains(err.Error(), "in use") {
		t.Errorf("resetSimDir on a held state.db = %v, %v; want an in-use error", restarted, err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Errorf("held state.db moved: %v", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	if restarted, err := resetSimDir(dir); err != nil || !restarted {
		t.Errorf("resetSimDir after unlock = %v, %v; want restarted", restarted, err)
	}
}
