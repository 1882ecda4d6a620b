package node_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/machina-metal/machina/internal/peertest"
)

// TestNodeImportsNoController: the node agent links api/v1 and join/spec
// only, never state (bbolt), join or api.
func TestNodeImportsNoController(t *testing.T) {
	goBin := peertest.Command(t, "go")
	for _, pkg := range []string{".", "../../cmd/machina-node"} {
		out, err := exec.Command(goBin, "list", "-deps", "-f", "{{.ImportPath}}", pkg).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		for _, p := range strings.Fields(string(out)) {
			if rest, ok := strings.CutPrefix(p, "github.com/machina-metal/machina/"); ok {
				switch rest {
				case "api/v1", "join/spec", "join/node", "cmd/machina-node":
				default:
					t.Errorf("%s imports %s", pkg, p)
				}
			}
			if strings.HasPrefix(p, "go.etcd.io/bbolt") {
				t.Errorf("%s links bbolt", pkg)
			}
		}
	}
}
