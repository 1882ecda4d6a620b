// Package doctest renders and checks the generated reference pages under
// docs/reference/ from tests: the CLI references from the cobra command
// trees (spf13/cobra/doc), compared byte for byte with the committed page.
// MACHINA_UPDATE_DOCS=1 (`make docs`) writes the page instead of failing.
package doctest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// CLIPage renders every command of root's tree, depth first in the order
// cobra lists them (hidden and help commands left out), as one Markdown page
// under title with intro below it. Links between commands are anchors in
// the page. Errors come from cobra/doc's writer.
func CLIPage(root *cobra.Command, title, intro string) ([]byte, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# %s\n\n%s\n", title, strings.TrimSpace(intro))
	link := func(name string) string {
		// cobra/doc links to "machinactl_bmc_bios.md"; the page keeps one
		// section per command, whose heading GitHub anchors as the name.
		return "#" + strings.ReplaceAll(strings.TrimSuffix(name, ".md"), "_", "-")
	}
	var walk func(c *cobra.Command) error
	walk = func(c *cobra.Command) error {
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			return nil
		}
		c.DisableAutoGenTag = true
		var sec bytes.Buffer
		if err := doc.GenMarkdownCustom(c, &sec, link); err != nil {
			return fmt.Errorf("render %s: %w", c.CommandPath(), err)
		}
		// One heading level down, and the heading made the command path with
		// dashes so that links resolve.
		s := sec.String()
		s = strings.Replace(s, "## "+c.CommandPath()+"\n", "## "+strings.ReplaceAll(c.CommandPath(), " ", "-")+"\n", 1)
		s = strings.ReplaceAll(s, "\n### ", "\n#### ")
		b.WriteString("\n" + s)
		for _, sub := range c.Commands() {
			if err := walk(sub); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(root); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// CheckPage compares got with the committed page at path (relative to the
// calling test's package) and fails the test naming `make docs` when they
// differ; with MACHINA_UPDATE_DOCS=1 it writes got to path.
func CheckPage(t testing.TB, path string, got []byte) {
	t.Helper()
	checkPage(t, path, got, os.Getenv("MACHINA_UPDATE_DOCS") == "1")
}

func checkPage(t testing.TB, path string, got []byte, update bool) {
	t.Helper()
	if update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: run `make docs` to generate it", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is stale: the commands changed; run `make docs` and commit the page", path)
	}
}

// CheckCLI builds the command tree with newRoot in a neutral environment
// (no MACHINA_* variable set, HOME "~", so that defaults read from the
// environment render the same everywhere), renders it (CLIPage) as
// docs/reference/NAME.md, where NAME is the root's name, relative to the
// calling test's package two folders below the module root (cmd/NAME),
// fails when the page lacks a heading for each command path of want
// ("machinactl validate"), and compares it with the committed page
// (CheckPage). It sets the environment with t.Setenv: not for parallel tests.
func CheckCLI(t *testing.T, newRoot func() *cobra.Command, intro string, want ...string) {
	t.Helper()
	update := os.Getenv("MACHINA_UPDATE_DOCS") == "1"
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "MACHINA_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	t.Setenv("HOME", "~")
	root := newRoot()
	page, err := CLIPage(root, root.Name()+" reference",
		"Generated from the command tree (`make docs`); `go test ./cmd/"+root.Name()+"` fails when this page is stale.\n"+intro)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if h := "## " + strings.ReplaceAll(w, " ", "-") + "\n"; !bytes.Contains(page, []byte(h)) {
			t.Fatalf("page lacks the section %q:\n%.2000s", h, page)
		}
	}
	checkPage(t, filepath.Join("..", "..", "docs", "reference", root.Name()+".md"), page, update)
}
