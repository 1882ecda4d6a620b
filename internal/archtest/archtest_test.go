package archtest

import (
	"slices"
	"strings"
	"testing"

	"github.com/machina-metal/machina/internal/peertest"
)

// TestArchitecture checks the real tree: `go list -deps -json ./...` from the
// module root, every rule of docs/architecture.md. It replaces the
// per-package tests that api/v1, state and join/node carried.
func TestArchitecture(t *testing.T) {
	_, g := loadModule(t)
	// Not vacuous: the packages the rules are about were all loaded.
	for _, p := range []string{"api/v1", "macaddr", "state", "boot/dhcp", "ramdisk/agent", agentCmd, ctlCmd, nodeCmd, "controller", "lab/sim"} {
		if !g[p].Project {
			t.Fatalf("go list did not report %s", p)
		}
	}
	if n := len(g[agentPkg].Imports); n == 0 {
		t.Fatalf("%s has no imports: the loader lost them", agentPkg)
	}
	for _, v := range Check(g) {
		t.Error(v)
	}
	for _, s := range StaleRows(g) {
		t.Error(s)
	}
}

// loadModule returns the module root and its graph (go list, through the
// go command peertest finds).
func loadModule(t *testing.T) (string, Graph) {
	t.Helper()
	goBin := peertest.Command(t, "go")
	root, err := ModuleRoot(goBin)
	if err != nil {
		t.Fatal(err)
	}
	g, err := Load(goBin, root)
	if err != nil {
		t.Fatal(err)
	}
	return root, g
}

// fakeGraph builds a graph from edges. Names with a dot in their first
// element are external modules, names in std are standard packages, the
// rest project packages (module-relative).
func fakeGraph(edges [][2]string) Graph {
	std := map[string]bool{"fmt": true, "net/http": true, "testing": true}
	g := Graph{}
	node := func(p string) {
		if _, ok := g[p]; ok {
			return
		}
		first, _, _ := strings.Cut(p, "/")
		g[p] = Package{Standard: std[p], Project: !std[p] && !strings.Contains(first, ".")}
	}
	for _, e := range edges {
		node(e[0])
		node(e[1])
		n := g[e[0]]
		if !slices.Contains(n.Imports, e[1]) {
			n.Imports = append(n.Imports, e[1])
		}
		g[e[0]] = n
	}
	return g
}

// allowedEdges is the largest graph the table permits: every row's edges,
// the base packages imported by every non-base package, the wildcard rows
// given a few product packages, and some standard and external imports.
func allowedEdges() [][2]string {
	var es [][2]string
	for p, row := range mayImport {
		es = append(es, [2]string{p, "fmt"})
		for _, i := range row {
			if i != anyProduct {
				es = append(es, [2]string{p, i})
			}
		}
		if slices.Contains(base, p) {
			continue
		}
		if p != agentCmd && p != agentPkg {
			es = append(es, [2]string{p, "macaddr"}, [2]string{p, "api/v1"})
		}
	}
	es = append(es,
		[2]string{"api/v1", "net/http"},
		[2]string{"state", "go.etcd.io/bbolt"},
		[2]string{"controller", "reconciler"}, [2]string{"controller", "api"}, [2]string{"controller", "boot/dhcp"},
		[2]string{"cmd/machina", "controller"}, [2]string{"cmd/machina", "lab/sim"},
		[2]string{"lab/sim", "ramdisk/agent/agenttest"}, [2]string{"lab/sim", "bmc/ipmi/ipmisim"},
		[2]string{"bmc/bmctest", "bmc"},
	)
	return es
}

// TestTableConsistent: the import table allows no edge that a dependency
// rule (leaves, protocol servers, agent, node agent) forbids, so the two
// halves of the rules agree.
func TestTableConsistent(t *testing.T) {
	for _, v := range Check(fakeGraph(allowedEdges())) {
		t.Error(v)
	}
}

// TestCheckFindsPlantedEdges plants one forbidden edge at a time into the
// allowed graph and checks the checker names the rule it breaks.
func TestCheckFindsPlantedEdges(t *testing.T) {
	tests := []struct {
		name  string
		edge  [2]string
		rules []string
	}{
		{"protocol server imports state", [2]string{"boot/dhcp", "state"}, []string{"import-table", "protocol-servers"}},
		{"protocol server reaches state through boot", [2]string{"boot", "state"}, []string{"leaves", "import-table", "protocol-servers"}},
		{"protocol server imports reconciler", [2]string{"boot/ipxe", "reconciler"}, []string{"import-table", "protocol-servers"}},
		{"leaf imports inventory", [2]string{"state", "inventory"}, []string{"leaves", "import-table"}},
		{"base imports base", [2]string{"macaddr", "api/v1"}, []string{"stdlib-only", "import-table"}},
		{"api/v1 imports a module", [2]string{"api/v1", "github.com/example/lib"}, []string{"stdlib-only"}},
		{"agent imports state", [2]string{"ramdisk/agent", "state"}, []string{"agent", "import-table"}},
		{"agent imports macaddr", [2]string{"ramdisk/agent", "macaddr"}, []string{"agent", "agent-machinactl-share"}},
		{"machinactl imports the agent", [2]string{"cmd/machinactl", "ramdisk/agent"}, []string{"agent-machinactl-share", "import-table"}},
		{"product imports lab", [2]string{"reconciler", "lab/sim"}, []string{"no-harness"}},
		{"product imports a test helper", [2]string{"api", "bmc/bmctest"}, []string{"no-harness"}},
		{"product imports ipmisim", [2]string{"controller", "bmc/ipmi/ipmisim"}, []string{"no-harness"}},
		{"node agent imports state", [2]string{"join/node", "state"}, []string{"node-agent", "import-table"}},
		{"node agent links bbolt", [2]string{"join/spec", "go.etcd.io/bbolt"}, []string{"node-agent"}},
		{"controller imports a main", [2]string{"controller", "cmd/machinactl"}, []string{"import-table"}},
		{"package without a row", [2]string{"gitrepo", "fmt"}, []string{"import-table"}},
		{"reconciler imports controller", [2]string{"reconciler", "controller"}, []string{"import-table"}},
		{"reconciler imports gitops", [2]string{"reconciler", "gitops"}, []string{"import-table", "reconciler-no-git"}},
		{"reconciler subpackage links go-git", [2]string{"reconciler/fleet", "github.com/go-git/go-git/v5"}, []string{"reconciler-no-git"}},
		{"gitops imports bmc", [2]string{"gitops", "bmc"}, []string{"import-table", "gitops-no-bmc"}},
		{"gitops links bmc through the executor", [2]string{"gitops", "reconciler"}, []string{"import-table", "gitops-no-bmc"}},
		{"plan imports bmc", [2]string{"reconciler/plan", "bmc"}, []string{"import-table", "plan-pure", "gitops-no-bmc"}},
		{"plan imports the executor", [2]string{"reconciler/plan", "reconciler"}, []string{"import-table", "plan-pure", "gitops-no-bmc"}},
		{"plan imports gitops", [2]string{"reconciler/plan", "gitops"}, []string{"import-table", "plan-pure", "reconciler-no-git"}},
		{"plan links go-git", [2]string{"reconciler/plan", "github.com/go-git/go-git/v5"}, []string{"plan-pure", "reconciler-no-git"}},
		{"a binary links testing through lab", [2]string{"bmc/ipmi/ipmisim", "testing"}, []string{"no-testing"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vs := Check(fakeGraph(append(allowedEdges(), tt.edge)))
			var got []string
			for _, v := range vs {
				if !slices.Contains(got, v.Rule) {
					got = append(got, v.Rule)
				}
			}
			for _, r := range tt.rules {
				if !slices.Contains(got, r) {
					t.Errorf("planting %s -> %s: rules broken %v, want %s among them; violations: %v", tt.edge[0], tt.edge[1], got, r, vs)
				}
			}
		})
	}
}
