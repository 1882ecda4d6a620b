package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/machina-metal/machina/discover"
	"github.com/machina-metal/machina/inventory"
)

// maxImportBytes bounds an import file.
const maxImportBytes = 8 << 20

// newImportCmd is `machinactl import FILE.csv|FILE.json`: append the rows
// that are new servers to servers.yaml of the local clone --repo (branch
// --branch), validated with inventory.Load, committed with go-git; or print
// the diff with --dry-run. Rows already present (name, boot MAC or BMC
// address after normalisation) are skipped. Exit 0 imported (or nothing to
// add), 1 invalid rows (nothing committed unless --skip-invalid) or an
// invalid result, 2 usage or I/O error.
func newImportCmd(e *env) *cobra.Command {
	var repo, branch string
	var dryRun, skipInvalid bool
	cmd := &cobra.Command{
		Use:   "import FILE.csv|FILE.json",
		Short: "Add servers from a CSV or JSON file to servers.yaml in a Git commit",
		Long: "Columns (CSV header, or JSON object keys): name, zone, bmc_driver, bmc_address, credentials, boot_mac,\n" +
			"boot_mode, site, rack, tags (CSV: separated by ';' or spaces). The first six are required.",
		Example: "  machinactl import rack4.csv --repo ~/site-inventory --dry-run\n  machinactl import rack4.csv --repo ~/site-inventory",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			file := args[0]
			st, err := os.Stat(file)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("import: %w", err)}
			}
			if st.Size() > maxImportBytes {
				return &exitError{code: 2, err: fmt.Errorf("import: %s is larger than %d bytes", file, maxImportBytes)}
			}
			data, err := os.ReadFile(file)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("import: %w", err)}
			}
			rows, err := discover.ParseRows(file, data)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("import %s: %w", file, err)}
			}
			raw, inv, err := discover.ReadInventory(repo, branch)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("import: %w", err)}
			}
			out, rep, err := discover.Import(raw, inv, rows)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("import: %w", err)}
			}
			_ = discover.WriteImportReport(e.stdout, filepath.Base(file), rep)
			if len(rep.Invalid) > 0 && !skipInvalid {
				return &exitError{code: 1, err: fmt.Errorf("import: %d invalid rows, nothing written (fix them or pass --skip-invalid)", len(rep.Invalid))}
			}
			if len(rep.Added) == 0 {
				fmt.Fprintln(e.stdout, "nothing to add")
				return nil
			}
			if dryRun {
				if _, err := discover.Validate(repo, branch, out); err != nil {
					return importInvalid(err)
				}
				fmt.Fprint(e.stdout, discover.Diff(inventory.ServersFile, raw, out))
				return nil
			}
			if err := cmd.Context().Err(); err != nil {
				return &exitError{code: 2, err: fmt.Errorf("import: interrupted, nothing committed: %w", err)}
			}
			h, err := discover.Commit(discover.Change{Repo: repo, Base: branch, Branch: branch, Context: cmd.Context(),
				Message: fmt.Sprintf("import: %d server(s) from %s", len(rep.Added), filepath.Base(file))}, out)
			if errors.Is(err, context.Canceled) {
				return &exitError{code: 2, err: fmt.Errorf("import: %w", err)}
			}
			if err != nil {
				return importInvalid(err)
			}
			fmt.Fprintf(e.stdout, "committed %s on %s; push it to apply\n", h.String()[:12], branch)
			return nil
		},
	}
	cmd.Flags().StringVar(&repo, "repo", ".", "local clone of the inventory repository")
	cmd.Flags().StringVar(&branch, "branch", "main", "branch to commit onto")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print the diff of servers.yaml instead of committing")
	cmd.Flags().BoolVar(&skipInvalid, "skip-invalid", false, "import the valid rows even when some are invalid")
	return cmd
}

func importInvalid(err error) error {
	var ve *inventory.ValidationError
	if errors.As(err, &ve) {
		return &exitError{code: 1, err: err}
	}
	return &exitError{code: 2, err: err}
}
