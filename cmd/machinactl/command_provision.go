package main

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	v1 "github.com/machina-metal/machina/api/v1"
)

// newProvisionCmd is `machinactl provision PROFILE N`: allocate and deploy
// N servers of PROFILE through POST /api/v1/provision and print their
// names, one a line. Exit 0 allocated, 1 not enough fitting ready servers
// (409 insufficient_capacity: nothing was allocated), 2 any other error.
func newProvisionCmd(e *env) *cobra.Command {
	var apiURL string
	cmd := &cobra.Command{
		Use:   "provision PROFILE N",
		Short: "Allocate and deploy N servers of a profile",
		Long: `Allocate N ready servers that fit PROFILE (its zone and minimum cores,
memory and disk; the smallest first: fewest cores, least memory, smallest
fitting disk, name) and deploy them with the profile. Prints the servers'
names, one a line, once they are allocated; the deploys then run (watch
them with machinactl status).

All or nothing: when fewer than N ready servers fit, nothing is allocated.

Provisioned servers come on top of the profile's count: lowering the count
never releases them. Give one back with POST
/api/v1/servers/NAME/transitions {"from":"deployed","to":"ready"} (a
release: the ramdisk wipes its disks before it is used again), or retire
it with want: retired in servers.yaml.

Exit code: 0 allocated, 1 not enough fitting ready servers (nothing
allocated), 2 an error.`,
		Example: "  MACHINA_TOKEN=... machinactl provision hypervisor 2",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			profile := args[0]
			n, err := strconv.Atoi(args[1])
			if err != nil || n < 1 || n > 1000 {
				return &exitError{code: 2, err: fmt.Errorf("provision: N %q: want a whole number from 1 to 1000", args[1])}
			}
			c, err := e.apiClient(apiURL)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("provision: %w", err)}
			}
			resp, err := c.Provision(cmd.Context(), v1.ProvisionRequest{Profile: profile, Count: n})
			var ae *v1.APIError
			switch {
			case v1.IsCode(err, v1.CodeInsufficientCapacity) && errors.As(err, &ae):
				return &exitError{code: 1, err: fmt.Errorf("provision %s %d: not enough capacity, nothing allocated: %s", profile, n, ae.Body.Message)}
			case err != nil:
				return &exitError{code: 2, err: fmt.Errorf("provision %s %d: %w", profile, n, err)}
			}
			fmt.Fprintf(e.stdout, "allocated %d servers to profile %s; deploying:\n", len(resp.Servers), resp.Profile)
			for _, s := range resp.Servers {
				fmt.Fprintln(e.stdout, s)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&apiURL, "api", envOr(envAPI, defaultAPI), "admin API base URL (env "+envAPI+"); the token comes from "+envToken)
	return cmd
}
