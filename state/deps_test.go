package state_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/machina-metal/machina/internal/peertest"
)

// TestImportsNoMachinaPackage: state is a leaf among Machina's packages.
func TestImportsNoMachinaPackage(t *testing.T) {
	goBin := peertest.Command(t, "go")
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
