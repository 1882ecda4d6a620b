package main

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/machina-metal/machina/discover"
	"github.com/machina-metal/machina/inventory"
)

// newServerCmd is `machinactl server`, holding `server bmc-set NAME --driver
// D --address A --credentials C`: replace (or add) the bmc block of server
// NAME in servers.yaml of the local clone --repo, validated with
// inventory.Load and committed with go-git on --branch (or printed as a
// diff with --dry-run). Exit 0 done (or nothing to change: NAME already has
// that bmc block), 1 the result would be invalid (e.g.
// an address another server uses), 2 usage or I/O error.
func newServerCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "server", Short: "Edit one server of servers.yaml through a Git commit"}
	var repo, branch, driver, address, creds, systemID string
	var insecure, dryRun bool
	set := &cobra.Command{
		Use:     "bmc-set NAME --driver redfish|ipmi --address ADDR --credentials SECRET",
		Short:   "Attach or change a server's BMC in a commit",
		Example: "  machinactl server bmc-set r4-n01 --driver redfish --address https://10.10.4.11 --credentials bmc-dell --repo ~/site-inventory",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if driver == "" || address == "" || creds == "" {
				return &exitError{code: 2, err: errors.New("server bmc-set: --driver, --address and --credentials are required")}
			}
			raw, _, err := discover.ReadInventory(repo, branch)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("server bmc-set: %w", err)}
			}
			out, err := discover.SetBMC(raw, args[0], inventory.BMC{Driver: inventory.BMCDriver(driver), Address: address, Credentials: creds, SystemID: systemID, InsecureTLS: insecure})
			if errors.Is(err, discover.ErrNoServer) {
				return &exitError{code: 1, err: fmt.Errorf("server bmc-set: %w", err)}
			}
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("server bmc-set: %w", err)}
			}
			if bytes.Equal(raw, out) {
				fmt.Fprintf(e.stdout, "nothing to change: %s already has this bmc block on %s\n", args[0], branch)
				return nil
			}
			if dryRun {
				if _, err := discover.Validate(repo, branch, out); err != nil {
					return importInvalid(fmt.Errorf("server bmc-set: %w", err))
				}
				fmt.Fprint(e.stdout, discover.Diff(inventory.ServersFile, raw, out))
				return nil
			}
			h, err := discover.Commit(discover.Change{Repo: repo, Base: branch, Branch: branch, Message: "server " + args[0] + ": bmc " + driver + " " + address}, out)
			if errors.Is(err, discover.ErrNoChange) {
				fmt.Fprintf(e.stdout, "nothing to change: %s already has this bmc block on %s\n", args[0], branch)
				return nil
			}
			if err != nil {
				return importInvalid(fmt.Errorf("server bmc-set: %w", err))
			}
			fmt.Fprintf(e.stdout, "committed %s on %s; push it to apply\n", h.String()[:12], branch)
			return nil
		},
	}
	f := set.Flags()
	f.StringVar(&driver, "driver", "", "redfish or ipmi")
	f.StringVar(&address, "address", "", "Redfish base URL (https://10.10.4.11) or IPMI host[:port]")
	f.StringVar(&creds, "credentials", "", "secret-store credential name")
	f.StringVar(&systemID, "system-id", "", "Redfish System Id when the BMC has several")
	f.BoolVar(&insecure, "insecure-tls", false, "accept the BMC's self-signed certificate")
	f.StringVar(&repo, "repo", ".", "local clone of the inventory repository")
	f.StringVar(&branch, "branch", "main", "branch to commit onto")
	f.BoolVar(&dryRun, "dry-run", false, "print the diff of servers.yaml instead of committing")
	cmd.AddCommand(set)
	return cmd
}
