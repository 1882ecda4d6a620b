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
	// tuneGC, when set, is called by validate with the inventory's size in
	// bytes before it loads it; main sets it to tuneGC, tests leave it nil
	// so the GC settings of the test process stay as they are.
	tuneGC func(yamlBytes int64)
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
	return runEnv(ctx, &env{stdin: stdin, stdout: stdout, stderr: stderr}, args)
}

// runEnv is run with the env given.
func runEnv(ctx context.Context, e *env, args []string) int {
	root := newRoot(e)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(e.stderr, "machinactl:", ee.err)
		}
		return ee.code
	}
	fmt.Fprintln(e.stderr, "machinactl:", err)
	return 2
}
