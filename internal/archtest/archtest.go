// Package archtest holds Machina's architecture test: the import rules of
// docs/architecture.md as data, a checker over a package graph, and a loader
// that builds the graph from `go list -deps -json ./...`. It is test
// tooling: no product package imports it.
package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Module is the module path; graph keys drop it ("state", "boot/dhcp").
const Module = "github.com/machina-metal/machina"

// Package is one node of the graph.
type Package struct {
	// Imports are the direct imports of the package's non-test files:
	// project packages module-relative, others by full import path.
	Imports []string
	// Standard marks a standard-library package.
	Standard bool
	// Project marks a package of this module.
	Project bool
}

// Graph maps a package (module-relative for project packages) to its node.
// It holds every package reachable from the module's packages.
type Graph map[string]Package

// Violation is one broken rule.
type Violation struct {
	Rule string // the rule's name, as in docs/architecture.md
	From string // the importing package
	To   string // the imported package (directly or through others)
	Why  string // the rule in words
}

func (v Violation) String() string {
	return fmt.Sprintf("%s: %s imports %s (%s)", v.Rule, v.From, v.To, v.Why)
}

// Load runs `go list -deps -json ./...` in the module root dir (the folder
// of go.mod) and returns the graph of non-test imports.
func Load(goBin, dir string) (Graph, error) {
	cmd := exec.Command(goBin, "list", "-deps", "-json=ImportPath,Imports,Standard", "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list in %s: %w: %s", dir, err, stderr.String())
	}
	return decode(bytes.NewReader(out))
}

func decode(r io.Reader) (Graph, error) {
	g := Graph{}
	dec := json.NewDecoder(r)
	for {
		var p struct {
			ImportPath string
			Imports    []string
			Standard   bool
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("decode go list output: %w", err)
		}
		name, project := rel(p.ImportPath)
		n := Package{Standard: p.Standard, Project: project}
		for _, i := range p.Imports {
			r, _ := rel(i)
			n.Imports = append(n.Imports, r)
		}
		g[name] = n
	}
	return g, nil
}

func rel(path string) (string, bool) {
	if path == Module {
		return ".", true
	}
	if r, ok := strings.CutPrefix(path, Module+"/"); ok {
		return r, true
	}
	return path, false
}

// ModuleRoot returns the folder holding go.mod, asking `go env GOMOD`.
func ModuleRoot(goBin string) (string, error) {
	out, err := exec.Command(goBin, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == "/dev/null" {
		return "", errors.New("go env GOMOD: not in a module")
	}
	return filepath.Dir(mod), nil
}

// deps returns the project packages p depends on, directly or not, sorted.
func (g Graph) deps(p string) []string {
	seen := map[string]bool{}
	var walk func(string)
	walk = func(q string) {
		for _, i := range g[q].Imports {
			if g[i].Project && !seen[i] {
				seen[i] = true
				walk(i)
			}
		}
	}
	walk(p)
	out := make([]string, 0, len(seen))
	for q := range seen {
		out = append(out, q)
	}
	sort.Strings(out)
	return out
}

// nonStandard returns the packages outside the standard library that p
// depends on, directly or not (project packages included), sorted.
func (g Graph) nonStandard(p string) []string {
	seen := map[string]bool{}
	var walk func(string)
	walk = func(q string) {
		for _, i := range g[q].Imports {
			if i != "C" && !seen[i] { // "C": cgo's pseudo-package, not a package
				seen[i] = true
				walk(i)
			}
		}
	}
	walk(p)
	var out []string
	for q := range seen {
		if !g[q].Standard {
			out = append(out, q)
		}
	}
	sort.Strings(out)
	return out
}

// directProject returns p's direct imports that are project packages.
func (g Graph) directProject(p string) []string {
	var out []string
	for _, i := range g[p].Imports {
		if g[i].Project {
			out = append(out, i)
		}
	}
	sort.Strings(out)
	return out
}

// under reports whether p is prefix or a package below it.
func under(p, prefix string) bool { return p == prefix || strings.HasPrefix(p, prefix+"/") }

func anyUnder(p string, prefixes []string) bool {
	return slices.ContainsFunc(prefixes, func(x string) bool { return under(p, x) })
}
