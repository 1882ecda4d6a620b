package main

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/machina-metal/machina/internal/doctest"
)

// TestCLIReference keeps docs/reference/machinactl.md equal to what the
// command tree renders (`make docs` regenerates it).
func TestCLIReference(t *testing.T) {
	doctest.CheckCLI(t, func() *cobra.Command {
		return newRoot(&env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard})
	},
		"Every command, its flags and the flags it inherits. Connection settings: `MACHINA_API`, `MACHINA_TOKEN`, `MACHINA_CA`.",
		"machinactl validate", "machinactl bmc bios")
}
