package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// env bundles the process streams so subcommands are testable.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := &env{stdin: stdin, stdout: stdout, stderr: stderr}
	_ = e // used by subcommand constructors
	root := &cobra.Command{
		Use:           "machina",
		Short:         "Machina bare-metal provisioning controller",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(
		// one line per subcommand; each constructor lives in cmd_<name>.go and takes e
		newServeCmd(e),
		newTokenCmd(e),
		newBmcsimCmd(e),
		newSimCmd(e),
	)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(stderr, "machina:", err)
		return 1
	}
	return 0
}
