package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// exitError carries a process exit code through cobra.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

// env bundles the process streams so verbs are testable.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	conn           connFlags // --ca-file, --insecure (root persistent flags)
}

// newRoot builds the command tree. Each verb lives in its own command_<verb>.go.
func newRoot(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:           "machinactl",
		Short:         "Operate a Machina bare-metal provisioning controller",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(e.stdin)
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	e.conn.register(root)
	root.AddCommand(
		// one line per verb; each constructor lives in command_<verb>.go
		newValidateCmd(e),
		newInventoryCmd(e),
		newSchemaCmd(e),
		newConsoleCmd(e),
		newSecretCmd(e),
		newImagesCommand(e),
		newBMCCmd(e),
		newTokenCmd(e),
		newHostCmd(e),
		newBundleCmd(e),
		newPlanCmd(e),
		newStatusCmd(e),
		newProvisionCmd(e),
		newApproveCmd(e),
		newScanCmd(e),
		newImportCmd(e),
		newServerCmd(e),
		newAdminTokenCmd(e),
		newStateCmd(e),
	)
	return root
}

// run executes machinactl with args and returns the process exit code:
// 0 success, 1 a negative result (invalid inventory, plan has changes),
// 2 usage or I/O error.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := &env{stdin: stdin, stdout: stdout, stderr: stderr}
	root := newRoot(e)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(stderr, "machinactl:", ee.err)
		}
		return ee.code
	}
	fmt.Fprintln(stderr, "machinactl:", err)
	return 2
}
