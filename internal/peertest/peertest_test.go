package peertest

import (
	"os/exec"
	"strings"
	"testing"
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
	for _, p := range append(DebianPackages(), "ovmf", "ipxe") {
		if !have[p] {
			t.Errorf("package %s (named by peertest) is not in %s", p, DepsScript)
		}
	}
}

// TestProductImportsNoTestHelper: no binary under cmd/ links this package
// or the ipmi_sim test harness.
func TestProductImportsNoTestHelper(t *testing.T) {
	goBin := Command(t, "go")
	out, err := exec.Command(goBin, "list", "-deps", "github.com/machina-metal/machina/cmd/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		switch p {
		case "github.com/machina-metal/machina/internal/peertest", "github.com/machina-metal/machina/bmc/ipmi/ipmisim/ipmisimtest":
			t.Errorf("a binary under cmd/ imports the test helper %s", p)
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
