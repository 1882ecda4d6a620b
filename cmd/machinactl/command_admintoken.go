package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// newAdminTokenCmd is `machinactl admin-token create|list|revoke`: admin
// API tokens managed through the running controller (POST, GET and DELETE
// /api/v1/admin-tokens), while `machina token` opens the state file and so
// works only while the controller is stopped. The caller's token comes
// from MACHINA_TOKEN; a new token's value is printed once on stdout.
// Exit 0 done, 2 an error.
func newAdminTokenCmd(e *env) *cobra.Command {
	var apiURL string
	cmd := &cobra.Command{
		Use:   "admin-token",
		Short: "Create, list and revoke admin API tokens through the running controller",
		Long: `Create, list and revoke admin API tokens through the running controller.
"machina token" does the same on the state file, which the controller holds
while it runs; use this to revoke a leaked token without stopping it. A
revoked token's next request is refused, and its event streams and web
console sessions end.`,
	}
	cmd.PersistentFlags().StringVar(&apiURL, "api", envOr(envAPI, defaultAPI), "admin API base URL (env "+envAPI+"); the token comes from "+envToken)
	var role string
	create := &cobra.Command{
		Use:   "create NAME [--role viewer|operator|admin]",
		Short: "Create an admin token NAME and print its value once",
		Long: `Create an admin token NAME and print its value once. --role sets what it
may do: viewer reads; operator also moves servers through their lifecycle,
provisions, approves held plans, fences and unfences hosts, opens serial
consoles and asks for a reconcile; admin (the default) also manages secrets
and admin tokens, scans BMC subnets and takes state snapshots. Creating a
token needs an admin token.`,
		Example: "  MACHINA_TOKEN=... machinactl admin-token create ops-alice --role operator",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.apiClient(apiURL)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("admin-token create: %w", err)}
			}
			out, err := c.CreateAdminTokenRole(cmd.Context(), args[0], role)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("admin-token create %s: %w", args[0], err)}
			}
			fmt.Fprintln(e.stdout, out.Token)
			fmt.Fprintf(e.stderr, "admin token %s (id %s, role %s) created; its value above is shown only this once\n", out.Name, out.ID, out.Role)
			return nil
		},
	}
	create.Flags().StringVar(&role, "role", "admin", "the token's role: viewer, operator or admin")
	list := &cobra.Command{
		Use:   "list",
		Short: "List admin tokens (names, never values)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := e.apiClient(apiURL)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("admin-token list: %w", err)}
			}
			out, err := c.AdminTokens(cmd.Context())
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("admin-token list: %w", err)}
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tID\tROLE\tCREATED\tBY")
			for _, t := range out.Tokens {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.Name, t.ID, t.Role, t.CreatedAt.UTC().Format(time.RFC3339), t.CreatedBy)
			}
			return tw.Flush()
		},
	}
	revoke := &cobra.Command{
		Use:   "revoke NAME",
		Short: "Revoke admin token NAME at once",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.apiClient(apiURL)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("admin-token revoke: %w", err)}
			}
			if err := c.RevokeAdminToken(cmd.Context(), args[0]); err != nil {
				return &exitError{code: 2, err: fmt.Errorf("admin-token revoke %s: %w", args[0], err)}
			}
			fmt.Fprintf(e.stdout, "admin token %s revoked\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}
