package controller

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/state"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// fixedJoin returns a join command naming the server, as joinCommander
// does with a fresh enrolment token.
type fixedJoin struct{}

func (fixedJoin) JoinCommand(_ context.Context, srv state.Server, p inventory.Profile) (string, error) {
	return "curl -fsS https://10.99.0.1:8443/install.sh | MACHINA_JOIN_TOKEN=enrol-" + srv.Name + "-" + p.Name + " sh", nil
}

// TestInstallerDocumentGolden: the documents the controller serves for the
// example site's kickstart profile (gpu) and an autoinstall variant of it:
// hostname, the profile's SSH keys, its minimum disk size, the real
// first-boot join command and the completion callback at the controller's
// public URL with the given single-use token.
func TestInstallerDocumentGolden(t *testing.T) {
	res, err := inventory.Load(os.DirFS("../inventory-example"), inventory.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	inv := res.Inventory
	p := &planner{desired: func() *inventory.Inventory { return inv }, baseURL: "http://10.99.0.1:8080/", join: fixedJoin{}}
	for _, kind := range []inventory.DeployMethod{inventory.DeployKickstart, inventory.DeployAutoinstall} {
		for i := range inv.Profiles {
			if inv.Profiles[i].Name == "gpu" {
				inv.Profiles[i].Deploy = kind
			}
		}
		srv := state.Server{Name: "r3-n01", Lifecycle: state.LifecycleDeploying,
			Allocation: &state.Allocation{Profile: "gpu", Image: "rocky-9", Deploy: string(kind), At: time.Unix(1700000000, 0)}}
		doc, err := p.InstallerDocument(context.Background(), srv, "cbTOKEN123")
		if err != nil {
			t.Fatal(err)
		}
		for _, must := range []string{"http://10.99.0.1:8080/install/done/cbTOKEN123", "MACHINA_JOIN_TOKEN=enrol-r3-n01-gpu", "r3-n01",
			"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIO4VqFGm2ahY3KSc9k9lrQMD0j2/tR46oEgCPUxiE9s7 ops@lab1", "429496729600"} {
			if !strings.Contains(string(doc), must) {
				t.Errorf("%s document lacks %q", kind, must)
			}
		}
		path := filepath.Join("testdata", "installer-"+string(kind)+".golden")
		if *update {
			if err := os.WriteFile(path, doc, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test -update)", err)
		}
		if d := cmp.Diff(string(want), string(doc)); d != "" {
			t.Errorf("%s differs (-want +got):\n%s", path, d)
		}
	}
	// An image profile has no installer document.
	srv := state.Server{Name: "r1-n01", Allocation: &state.Allocation{Profile: "hypervisor", Image: "ubuntu-24.04"}}
	if _, err := p.InstallerDocument(context.Background(), srv, "x"); err == nil {
		t.Error("InstallerDocument rendered an image profile")
	}
}
