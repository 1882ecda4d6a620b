package peertest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPackagesInDepsScript: every Debian package a failing test names is
// one that scripts/deps.sh installs.
func TestPackagesInDepsScript(t *testing.T) {
	out, err := exec.Command("sh", "../../"+DepsScript, "list").Output()
	if err != nil {
		t.Fatalf("%s list: %v", DepsScript, err)
	}
	have := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		have[p] = true
	}
	for _, p := range append(DebianPackages(), FilePackages...) {
		if !have[p] {
			t.Errorf("package %s (named by peertest) is not in %s", p, DepsScript)
		}
	}
}

// TestMissingFailsOutsideQuickMode runs a child test that needs a command
// nobody has: without the quick mode it must fail naming the package; with
// SKIP_PEERS=1 it must skip.
func TestMissingFailsOutsideQuickMode(t *testing.T) {
	for _, tc := range []struct {
		env      string
		want     string
		wantFail bool
	}{
		{"SKIP_PEERS=0", "--- FAIL: TestHelperNeedsMissingPeer", true},
		{"SKIP_PEERS=1", "--- SKIP: TestHelperNeedsMissingPeer", false},
	} {
		cmd := exec.Command(testBinary(t), "-test.run", "^TestHelperNeedsMissingPeer$", "-test.v")
		cmd.Env = []string{"PATH=/nonexistent-peertest", "MACHINA_PEERTEST_CHILD=1", tc.env}
		out, err := cmd.CombinedOutput()
		if (err != nil) != tc.wantFail || !strings.Contains(string(out), tc.want) {
			t.Errorf("%s: err=%v, output:\n%s\nwant %q", tc.env, err, out, tc.want)
		}
		if !strings.Contains(string(out), "the Debian package qemu-utils") {
			t.Errorf("%s: output does not name the Debian package:\n%s", tc.env, out)
		}
	}
}

// TestDepsScriptPrintsInstallCommand: on a machine where nothing is
// installed (an empty dpkg database, DEPS_ADMINDIR), not root and without
// sudo, scripts/deps.sh stops at once, exit 1, printing the exact apt-get
// command. Run as nobody (setpriv) when the suite runs as root.
func TestDepsScriptPrintsInstallCommand(t *testing.T) {
	admin := t.TempDir()
	if err := os.WriteFile(filepath.Join(admin, "status"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// A PATH with what the script uses and no sudo.
	bin := t.TempDir()
	for _, c := range []string{"sh", "dirname", "dpkg-query", "grep", "id", "cat"} {
		if err := os.Symlink(Command(t, c), filepath.Join(bin, c)); err != nil {
			t.Fatal(err)
		}
	}
	// A copy of the script: nobody may not reach the checkout (a clone
	// made by mktemp -d is 0700). Its parent folder stands in for the
	// repository it cds to; it stops before the npm step.
	src, err := os.ReadFile("../../" + DepsScript)
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(bin, "deps.sh")
	if err := os.WriteFile(script, src, 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{filepath.Join(bin, "sh"), script}
	if os.Geteuid() == 0 {
		// nobody must reach the test's folders (t.TempDir makes them 0700).
		for _, d := range []string{admin, filepath.Dir(admin), bin, filepath.Dir(bin)} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		args = append([]string{Command(t, "setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups"}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = []string{"PATH=" + bin, "DEPS_ADMINDIR=" + admin, "HOME=/nonexistent"}
	start := time.Now()
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("deps.sh: %v, want exit 1\n%s", err, out)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("deps.sh took %v to stop, want at once", d)
	}
	want := "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openipmi ipmitool git "
	if !strings.Contains(string(out), want) || !strings.Contains(string(out), " chromium chromium-driver ") {
		t.Errorf("deps.sh output lacks the install command %q:\n%s", want, out)
	}
}
