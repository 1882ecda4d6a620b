package state_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestImportsNoMachinaPackage: state is a leaf among Machina's packages.
func TestImportsNoMachinaPackage(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("go not in PATH")
		}
		t.Skip("go not in PATH")
	}
	out, err := exec.Command(goBin, "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "github.com/machina-metal/machina/") && p != "github.com/machina-metal/machina/state" {
			t.Errorf("state imports %s", p)
		}
	}
}
