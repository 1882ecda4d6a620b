package archtest

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// The rules below are docs/architecture.md's "Import rules" as data. Change
// both together.

// base: stdlib-only packages any package may import (the wire types, the
// MAC type and the name rules). They import no other package outside the standard library.
var base = []string{"api/v1", "macaddr", "namerule"}

// leaves import no project package except the base ones.
var leaves = []string{"schema", "bmc", "boot", "state", "images", "deploy", "redact", "attestation"}

// protocolServers take a boot.Lookup and never see the store or the
// reconciler (smee's handlers take a BackendReader the same way).
var protocolServers = []string{"boot/dhcp", "boot/tftp", "boot/ipxe"}

// protocolForbidden: what a protocol server must not depend on, directly or
// through another package (each entry with its subpackages).
var protocolForbidden = []string{"state", "reconciler", "controller", "api"}

// harness: test and demo code that is not shipped (each with subpackages).
// cmd/machina's `machina sim` is the one product door into it (exceptions).
var harness = []string{"lab", "bench", "scripts", "cmd/lab", "cmd/lab-chassis-control", "cmd/lab-os-image"}

// testHelperExtra: test helpers whose name does not end in "test".
var testHelperExtra = []string{"bmc/ipmi/ipmisim", "internal/pyghmibmc", "internal/pyghmibmc/bmcproc"}

// exceptions: product edges into the harness or a test helper that are
// allowed, with the reason.
var exceptions = map[[2]string]string{
	{"cmd/machina", "lab/sim"}: "`machina sim` is a shipped subcommand (the simulated lab, README)",
}

// anyProduct in a mayImport row: every product package outside cmd/.
const anyProduct = "*"

// mayImport lists, for every product package, the project packages it may
// import directly. A product package without a row, or an edge not in its
// row, is a violation. Base packages are always allowed, except in base
// packages themselves and in the ramdisk agent (whose rows say api/v1).
var mayImport = map[string][]string{
	"api/v1":                {},
	"attestation":           {},
	"macaddr":               {},
	"namerule":              {},
	"internal/connlimit":    {},
	"internal/httpstatus":   {},
	"ha":                    {},
	"schema":                {},
	"bmc":                   {},
	"boot":                  {},
	"state":                 {},
	"images":                {},
	"deploy":                {},
	"inventory-example":     {},
	"bmc/redfish":           {"bmc"},
	"bmc/ipmi":              {"bmc"},
	"bmc/bmcsim":            {"bmc"},
	"fence":                 {"bmc"},
	"boot/dhcp":             {"boot"},
	"boot/tftp":             {"boot"},
	"boot/ipxe":             {"boot", "internal/httpstatus"},
	"inventory":             {"schema"},
	"discover":              {"inventory"},
	"console":               {"bmc"},
	"ui":                    {"bmc", "state"},
	"join/spec":             {},
	"join/node":             {"join/spec"},
	"join":                  {"internal/connlimit", "inventory", "join/spec", "state"},
	"reconciler/plan":       {"inventory", "state"},
	"reconciler":            {"bmc", "inventory", "reconciler/plan", "redact", "state"},
	"gitops":                {"boot", "discover", "inventory", "reconciler/plan", "redact", "state"},
	"redact":                {},
	"reconciler/fleet":      {"bmc", "bmc/ipmi", "bmc/redfish", "reconciler", "redact", "state"},
	"eventsout":             {"state"},
	"reconciler/deployplan": {"api", "deploy", "deploy/netplan", "images", "inventory", "state"},
	"deploy/netplan":        {"inventory"},
	"api":                   {"attestation", "boot", "boot/dhcp", "boot/ipxe", "internal/connlimit", "internal/httpstatus", "schema", "state"},
	"ramdisk/agent":         {"api/v1"},
	"controller":            {anyProduct},
	"cmd/machina":           {anyProduct},
	"cmd/machina-agent":     {"ramdisk/agent", "api/v1"},
	"cmd/machina-node":      {"join/node"},
	"cmd/machinactl":        {"bmc", "bmc/ipmi", "bmc/redfish", "discover", "gitops", "images", "inventory", "join/node", "reconciler/plan", "schema", "state"},
}

// The agent (the ramdisk's /init) links only api/v1 of the project, and it
// and machinactl share only api/v1: no project package other than api/v1 is
// in both binaries' dependency sets (their transitive project imports).
const (
	agentCmd   = "cmd/machina-agent"
	agentPkg   = "ramdisk/agent"
	ctlCmd     = "cmd/machinactl"
	nodeCmd    = "cmd/machina-node"
	nodePkg    = "join/node"
	boltModule = "go.etcd.io/bbolt"
)

var agentMay = []string{"ramdisk/agent", "api/v1"}
var shareMay = []string{"api/v1"}
var nodeMay = []string{"api/v1", "macaddr", "namerule", "join/spec", "join/node"}

func isHarness(p string) bool { return anyUnder(p, harness) }

func isTestHelper(p string) bool {
	last := p[strings.LastIndex(p, "/")+1:]
	return strings.HasSuffix(last, "test") || slices.Contains(testHelperExtra, p)
}

// product reports whether p is a shipped project package.
func (g Graph) product(p string) bool {
	return g[p].Project && p != "." && !isHarness(p) && !isTestHelper(p)
}

// Check applies every rule to g and returns the violations, sorted.
func Check(g Graph) []Violation {
	var vs []Violation
	add := func(rule, from, to, why string) { vs = append(vs, Violation{rule, from, to, why}) }
	var pkgs []string
	for p := range g {
		if g.product(p) {
			pkgs = append(pkgs, p)
		}
	}
	sort.Strings(pkgs)

	for _, p := range pkgs {
		// import-table: every edge of a product package is in its row.
		row, ok := mayImport[p]
		if !ok {
			add("import-table", p, "-", "no row for this package in internal/archtest/rules.go mayImport and docs/architecture.md")
		}
		for _, i := range g.directProject(p) {
			switch {
			case isHarness(i) || isTestHelper(i):
				if _, ok := exceptions[[2]string{p, i}]; !ok {
					add("no-harness", p, i, "product code never imports lab/, bench/ or test helpers")
				}
				continue
			case !ok:
				continue
			case slices.Contains(base, i) && !slices.Contains(base, p) && p != agentCmd && p != agentPkg:
			case slices.Contains(row, i):
			case slices.Contains(row, anyProduct) && g.product(i) && !under(i, "cmd"):
			default:
				add("import-table", p, i, "edge not in the package's row")
			}
		}
	}

	// leaves and base: nothing of the project but the base (base: nothing
	// outside the standard library at all).
	for _, p := range leaves {
		for _, d := range g.deps(p) {
			if !slices.Contains(base, d) {
				add("leaves", p, d, "a leaf imports no project package but the base (api/v1, macaddr, namerule)")
			}
		}
	}
	for _, p := range base {
		for _, d := range g.nonStandard(p) {
			add("stdlib-only", p, d, "api/v1, macaddr and namerule import the standard library only")
		}
	}
	for _, p := range protocolServers {
		for _, d := range g.deps(p) {
			if anyUnder(d, protocolForbidden) && !slices.Contains(base, d) {
				add("protocol-servers", p, d, "protocol servers never import state, reconciler, api or controller")
			}
		}
	}
	for _, p := range []string{agentCmd, agentPkg} {
		for _, d := range g.deps(p) {
			if !slices.Contains(agentMay, d) {
				add("agent", p, d, "the ramdisk agent links api/v1 only")
			}
		}
	}
	ctl := append(g.deps(ctlCmd), ctlCmd)
	for _, d := range append(g.deps(agentCmd), agentCmd) {
		if slices.Contains(ctl, d) && !slices.Contains(shareMay, d) {
			add("agent-machinactl-share", ctlCmd, d, "machinactl and the agent share api/v1 only")
		}
	}
	for _, p := range []string{nodeCmd, nodePkg} {
		for _, d := range g.deps(p) {
			if !slices.Contains(nodeMay, d) {
				add("node-agent", p, d, "the node agent links api/v1, macaddr, namerule and join/spec only")
			}
		}
		for _, d := range g.nonStandard(p) {
			if under(d, boltModule) {
				add("node-agent", p, d, "the node agent never links bbolt")
			}
		}
	}
	// no-testing: no binary under cmd/ (lab tools included) links a project
	// package that imports "testing" (peertest, ipmisimtest and every other
	// helper built on testing.TB).
	for p := range g {
		if !g[p].Project || !under(p, "cmd") {
			continue
		}
		for _, d := range append(g.deps(p), p) {
			if slices.Contains(g[d].Imports, "testing") {
				add("no-testing", p, d, "a binary never links a package that imports testing")
			}
		}
	}
	checkGitSplit(g, add)
	sort.Slice(vs, func(i, j int) bool { return vs[i].String() < vs[j].String() })
	return slices.Compact(vs)
}

// gitModule is the Git library: gitops links it, the reconciler never.
const gitModule = "github.com/go-git/go-git/v5"

// planPkg is the pure plan: it decides and never acts, so it depends on
// no bmc package, no Git library and not on gitops (nor on the executor
// above it), and gitops can use its types without linking a BMC.
const planPkg = "reconciler/plan"

// checkGitSplit: the reconciler and its subpackages depend neither on
// gitops nor on go-git (they know Git only through reconciler.Revisions,
// which gitops.Source implements); the plan depends on no bmc package,
// no go-git and no gitops; gitops depends on no bmc package, directly or
// through another (so not on the executor either).
func checkGitSplit(g Graph, add func(rule, from, to, why string)) {
	for p := range g {
		if !g.product(p) {
			continue
		}
		if under(p, "reconciler") {
			for _, d := range g.deps(p) {
				if under(d, "gitops") {
					add("reconciler-no-git", p, d, "the reconciler knows Git only through reconciler.Revisions")
				}
			}
			for _, d := range g.nonStandard(p) {
				if under(d, gitModule) {
					add("reconciler-no-git", p, d, "the reconciler never links go-git")
				}
			}
		}
		if under(p, "gitops") {
			for _, d := range g.deps(p) {
				if under(d, "bmc") {
					add("gitops-no-bmc", p, d, "gitops knows nothing of BMCs, not even through another package (it uses reconciler/plan, never the executor)")
				}
			}
		}
		if under(p, planPkg) {
			for _, d := range g.deps(p) {
				if under(d, "bmc") || under(d, "gitops") || d == "reconciler" {
					add("plan-pure", p, d, "the plan imports no bmc, no gitops and not the executor: it decides, it does not act")
				}
			}
			for _, d := range g.nonStandard(p) {
				if under(d, gitModule) {
					add("plan-pure", p, d, "the plan never links go-git")
				}
			}
		}
	}
}

// StaleRows returns the rule entries that name no package of g: a renamed or
// removed package whose row was left behind.
func StaleRows(g Graph) []string {
	var out []string
	check := func(what, p string) {
		if _, ok := g[p]; !ok && p != anyProduct {
			out = append(out, fmt.Sprintf("%s names %s, which is not a package", what, p))
		}
	}
	for p, row := range mayImport {
		check("mayImport", p)
		for _, i := range row {
			check("mayImport["+p+"]", i)
		}
	}
	for _, list := range [][]string{base, leaves, protocolServers, agentMay, nodeMay, testHelperExtra} {
		for _, p := range list {
			check("rule list", p)
		}
	}
	for e := range exceptions {
		check("exceptions", e[0])
		check("exceptions", e[1])
	}
	sort.Strings(out)
	return out
}
