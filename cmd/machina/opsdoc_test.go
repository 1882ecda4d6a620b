package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// opsBlocks returns docs/operations.md's fenced sh blocks with their tags
// ("" for plain sh, "site", "systemd"), the blocks scripts/deb-check.sh
// runs against the installed package.
func opsBlocks(t *testing.T) (blocks []string, tags []string) {
	t.Helper()
	data, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	var cur *strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case cur == nil && (line == "```sh" || strings.HasPrefix(line, "```sh ")):
			cur = &strings.Builder{}
			tags = append(tags, strings.TrimSpace(strings.TrimPrefix(line, "```sh")))
		case cur != nil && strings.HasPrefix(line, "```"):
			blocks = append(blocks, cur.String())
			cur = nil
		case cur != nil:
			cur.WriteString(line + "\n")
		}
	}
	return blocks, tags
}

// TestOperationsDocCommands checks, without a package installed, what
// scripts/deb-check.sh later runs: every sh block of docs/operations.md
// parses (sh -n), and every flag given to a machina subcommand there is
// one that subcommand has. The blocks themselves run in deb-check.sh.
func TestOperationsDocCommands(t *testing.T) {
	blocks, tags := opsBlocks(t)
	if len(blocks) < 10 {
		t.Fatalf("docs/operations.md has %d sh blocks, want the whole walk-through", len(blocks))
	}
	root := &cobra.Command{Use: "machina"}
	e := &env{}
	root.AddCommand(newServeCmd(e), newTokenCmd(e), newBmcsimCmd(e), newSimCmd(e), newBootstrapCmd(e))
	flagRe := regexp.MustCompile(`--([a-z][a-z0-9-]*)`)
	for i, b := range blocks {
		path := filepath.Join(t.TempDir(), "block.sh")
		if err := os.WriteFile(path, []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("sh", "-n", path).CombinedOutput(); err != nil {
			t.Errorf("block %d (%s) does not parse: %v: %s\n%s", i+1, tags[i], err, out, b)
		}
		for _, line := range strings.Split(b, "\n") {
			f := strings.Fields(line)
			if len(f) < 2 || f[0] != "machina" {
				continue
			}
			sub, _, err := root.Find(f[1:2])
			if err != nil || sub == root {
				t.Errorf("block %d: machina %s: no such subcommand", i+1, f[1])
				continue
			}
			for _, m := range flagRe.FindAllStringSubmatch(line, -1) {
				if sub.Flags().Lookup(m[1]) == nil {
					t.Errorf("block %d: machina %s has no --%s (%q)", i+1, f[1], m[1], line)
				}
			}
		}
	}
	// The site values block is the only one deb-check does not run, and it
	// sets every variable the run blocks use but do not set themselves.
	site := ""
	for i, tag := range tags {
		if tag == "site" {
			site = blocks[i]
		}
	}
	for _, v := range []string{"DEB", "SITE_REPO", "MGMT_NAME", "NET_FLAGS", "ADMIN_URL", "MACHINE_URL", "TOKEN_FILE", "BACKUP_DIR", "BMC_PASSWORD"} {
		if !strings.Contains(site, v) {
			t.Errorf("the site block does not set %s", v)
		}
		if !strings.Contains(readFile(t, "../../scripts/deb-check.sh"), v) {
			t.Errorf("scripts/deb-check.sh does not set %s for CI", v)
		}
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
