package main

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/machina-metal/machina/internal/doctest"
)

// TestCLIReference keeps docs/reference/machina.md equal to what the
// command tree renders (`make docs` regenerates it).
func TestCLIReference(t *testing.T) {
	doctest.CheckCLI(t, func() *cobra.Command {
		return newRootCmd(&env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard})
	},
		"The controller binary: `machina serve` runs a site, `machina bootstrap` makes one, `machina sim` runs the simulated lab.",
		"machina serve")
}
