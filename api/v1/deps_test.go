package v1

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/machina-metal/machina/internal/peertest"
)

// TestStdlibOnly: api/v1 is linked into the ramdisk agent and the node
// agent, so it imports the standard library only.
func TestStdlibOnly(t *testing.T) {
	goBin := peertest.Command(t, "go")
	out, err := exec.Command(goBin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if p != "github.com/machina-metal/machina/api/v1" {
			t.Errorf("api/v1 imports non-standard package %s", p)
		}
	}
}
