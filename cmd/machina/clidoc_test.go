package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/machina-metal/machina/internal/doctest"
)

// TestCLIReference keeps docs/reference/machina.md equal to what the
// command tree renders (`make docs` regenerates it).
func TestCLIReference(t *testing.T) {
	var out bytes.Buffer
	page, err := doctest.CLIPage(newRootCmd(&env{stdin: strings.NewReader(""), stdout: &out, stderr: &out}),
		"machina reference",
		"Generated from the command tree (`make docs`); `go test ./cmd/machina` fails when this page is stale.\n"+
			"The controller binary: `machina serve` runs a site, `machina bootstrap` makes one, `machina sim` runs the simulated lab.")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(page, []byte("## machina-serve\n")) {
		t.Fatalf("page lacks the serve section:\n%.2000s", page)
	}
	doctest.CheckPage(t, filepath.Join("..", "..", "docs", "reference", "machina.md"), page)
}
