package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// env bundles the process streams so subcommands are testable.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
}

// newRootCmd builds the machina command tree on e's streams.
func newRootCmd(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:           "machina",
		Short:         "Machina bare-metal provisioning controller",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(e.stdin)
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	root.AddCommand(
		// one line per subcommand; each constructor lives in cmd_<name>.go and takes e
		newServeCmd(e),
		newTokenCmd(e),
		newBmcsimCmd(e),
		newSimCmd(e),
		newBootstrapCmd(e),
		newStateCmd(e),
		newOpenAPICmd(e),
	)
	return root
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRootCmd(&env{stdin: stdin, stdout: stdout, stderr: stderr})
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	markUsageErrors(root)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(stderr, "machina:", err)
		var ue usageError
		if errors.As(err, &ue) || strings.HasPrefix(err.Error(), "unknown command") {
			return 2
		}
		return 1
	}
	return 0
}

// usageError is a command line cobra refused (unknown flag, bad flag
// value, wrong number of arguments): exit code 2, as machinactl's, while a
// command that fails running exits 1.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

// markUsageErrors wraps every command's argument check so its refusal is
// a usageError.
func markUsageErrors(c *cobra.Command) {
	if check := c.Args; check != nil {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if err := check(cmd, args); err != nil {
				return usageError{err}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		markUsageErrors(sub)
	}
}
