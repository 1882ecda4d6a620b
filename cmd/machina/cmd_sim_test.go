package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/internal/peertest"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// TestSimUntilDeployed runs `machina sim --until-deployed` as make demo
// does (without its interactive wait): the example site commissions and
// its profiles' counts deploy.
//
// Without --dir the lab folder is made in the system temp folder (TMPDIR
// here) and removed when the sim stops; the banner says so and prints the
// copy-paste lines for machinactl and the simulated BMCs' password.
func TestSimUntilDeployed(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"sim", "--until-deployed", "--timeout", "3m", "--boot-delay", "0", "--poll", "200ms"},
		strings.NewReader(""), &out, &errOut)
	if code != 0 {
		t.Fatalf("machina sim: exit %d\n%s\n%s", code, out.String(), errOut.String())
	}
	for _, want := range []string{"new → commissioning", "commissioning → ready", "deploying → deployed", "joined the fleet", "Every profile's count is deployed",
		"MACHINA_TOKEN=$(cat " + tmp, "Simulated BMCs (lab only, loopback): user admin, password sim-password",
		"on disk", "Ctrl-C stops the lab and removes this folder", "Removed the lab folder " + tmp} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if !regexp.MustCompile(`(?m)^  export PATH=\S+:\$PATH MACHINA_API=http://127\.0\.0\.1:\d+ MACHINA_TOKEN=\$\(cat \S+/admin-token\)$`).MatchString(out.String()) {
		t.Errorf("no copy-paste export line:\n%s", out.String())
	}
	if ents, err := os.ReadDir(tmp); err != nil || len(ents) != 0 {
		t.Errorf("the lab folder was not removed: %v %v", ents, err)
	}
}

// TestSimKeepAndRedfishFallback: with --keep the folder machina sim made
// stays; without ipmi_sim in PATH its first lines say so, the banner names
// the example's IPMI servers that run Redfish, and the lab's servers.yaml
// says redfish for them (with a comment why), never ipmi.
func TestSimKeepAndRedfishFallback(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	// A PATH with git (the lab's repository) and no ipmi_sim.
	bin := t.TempDir()
	if err := os.Symlink(peertest.Command(t, "git"), filepath.Join(bin, "git")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin)
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"sim", "--keep", "--timeout", "3s", "--boot-delay", "1m"}, strings.NewReader(""), &out, &errOut)
	if code != 1 {
		t.Fatalf("machina sim --timeout 3s: exit %d, want 1\n%s\n%s", code, out.String(), errOut.String())
	}
	lines := strings.SplitN(out.String(), "\n", 4)
	if len(lines) < 3 || !strings.Contains(lines[1], "WARNING: ipmi_sim not in PATH (Debian package openipmi)") {
		t.Errorf("the first lines do not warn that ipmi_sim is missing:\n%s", out.String())
	}
	for _, want := range []string{"Redfish-only here, IPMI in the example: r1-n04, r1-n05, r2-n03, r3-n03", "0 behind OpenIPMI's ipmi_sim",
		"it is kept when the lab stops"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(tmp, "machina-sim-*"))
	if len(dirs) != 1 {
		t.Fatalf("--keep: lab folders %v, want one kept", dirs)
	}
	yaml, err := os.ReadFile(filepath.Join(dirs[0], "lab", "inventory", "servers.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(yaml), "driver: ipmi") || !strings.Contains(string(yaml), "# IPMI in the example; Redfish here: ipmi_sim not in PATH (Debian package openipmi)") ||
		!strings.Contains(string(yaml), "12 Redfish BMCs") {
		t.Errorf("servers.yaml does not say what runs:\n%s", yaml)
	}
}

// TestSimAlerts: the demo terminal shows an invalid revision with its
// errors, a held plan, failed (once per message) and stalled actions, and
// when each clears.
func TestSimAlerts(t *testing.T) {
	var w bytes.Buffer
	var a simAlerts
	good := gitops.Revision{Commit: "1111111111111111111111111111111111111111"}
	bad := &gitops.InvalidRevision{Commit: "2222222222222222222222222222222222222222",
		Errors: []inventory.FieldError{{File: "servers.yaml", Line: 14, Col: 7, Path: "servers[2].bootMAC", Msg: "not a MAC"}}}
	a.revision(&w, good, bad)
	a.revision(&w, good, bad) // printed once
	a.revision(&w, good, nil)
	a.plan(&w, plan.Result{Held: make([]plan.Step, 3), Brake: "held until approved (machinactl approve 0123456789ab): 3 of 11 servers"})
	a.plan(&w, plan.Result{Held: make([]plan.Step, 3), Brake: "held until approved (machinactl approve 0123456789ab): 3 of 11 servers"})
	a.plan(&w, plan.Result{})
	for i := 0; i < 3; i++ {
		a.event(&w, state.Event{Kind: "action.failed", Server: "r1-n01", Message: "powerOn: connection refused"})
	}
	a.event(&w, state.Event{Kind: "action.stalled", Server: "r1-n02", Message: "powerOn: 401 Unauthorized"})
	got := w.String()
	for _, want := range []string{"INVALID inventory revision 222222222222: the controller keeps acting on 111111111111",
		"servers.yaml:14:7: servers[2].bootMAC: not a MAC", "inventory valid again",
		"HELD plan: 3 steps wait: held until approved (machinactl approve 0123456789ab)", "plan no longer held",
		"r1-n01   failed   powerOn: connection refused (retried with backoff)", "r1-n02   STALLED  powerOn: 401 Unauthorized"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	for _, once := range []string{"INVALID", "HELD", "connection refused"} {
		if n := strings.Count(got, once); n != 1 {
			t.Errorf("%q printed %d times, want once:\n%s", once, n, got)
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
