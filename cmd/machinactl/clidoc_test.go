package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/machina-metal/machina/internal/doctest"
)

// TestCLIReference keeps docs/reference/machinactl.md equal to what the
// command tree renders (`make docs` regenerates it).
func TestCLIReference(t *testing.T) {
	var out bytes.Buffer
	page, err := doctest.CLIPage(newRoot(&env{stdin: strings.NewReader(""), stdout: &out, stderr: &out}),
		"machinactl reference",
		"Generated from the command tree (`make docs`); `go test ./cmd/machinactl` fails when this page is stale.\n"+
			"Every command, its flags and the flags it inherits. Connection settings: `MACHINA_API`, `MACHINA_TOKEN`, `MACHINA_CA`.")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(page, []byte("## machinactl-validate\n")) || !bytes.Contains(page, []byte("## machinactl-bmc-bios")) {
		t.Fatalf("page lacks the validate or bmc bios sections:\n%.2000s", page)
	}
	doctest.CheckPage(t, filepath.Join("..", "..", "docs", "reference", "machinactl.md"), page)
}
