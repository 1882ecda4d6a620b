package main

import (
	"fmt"
	"regexp"

	"github.com/spf13/cobra"
)

// revisionPattern is what POST /api/v1/approve accepts: 12 to 64
// lower-case hex digits of an inventory digest (the form `machinactl plan`
// and status print in "machinactl approve REV").
var revisionPattern = regexp.MustCompile(`^[0-9a-f]{12,64}$`)

// newApproveCmd is `machinactl approve REV`: approve the plan the safety
// brake holds for inventory revision REV (its digest's hex prefix) through
// POST /api/v1/approve. The controller records the approval under the
// token's name as an event. Exit 0 approved, 2 an error.
func newApproveCmd(e *env) *cobra.Command {
	var apiURL string
	cmd := &cobra.Command{
		Use:   "approve REV",
		Short: "Approve the held plan of an inventory revision (safety brake)",
		Long: `Approve the steps the safety brake holds for inventory revision REV: a
revision that would release or retire more than the brake's share of the
fleet (default 20%), or bring a profile to zero deployed servers. REV is
the 12 (to 64) hex digits of the inventory digest printed after
"machinactl approve" by machinactl plan, machinactl status and
status/inventory.yaml.

The controller records the approval as an approval event under the admin
token's name, then runs the held steps. It applies to that revision only:
a later commit that is held again needs its own approval. The approval is
recorded whether or not the controller holds a plan of REV yet; the output
says which: "N held steps run now", or that the controller acts on another
revision and nothing held is released yet.

Exit code: 0 approved, 2 an error (REV not hex, API refused).`,
		Example: "  MACHINA_TOKEN=... machinactl approve 3f2a9c01d4e5",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rev := args[0]
			if len(rev) > 7 && rev[:7] == "sha256:" {
				rev = rev[7:]
			}
			if !revisionPattern.MatchString(rev) {
				return &exitError{code: 2, err: fmt.Errorf("approve: revision %q: want 12 to 64 lower-case hex digits of the inventory digest", args[0])}
			}
			c, err := e.apiClient(apiURL)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("approve: %w", err)}
			}
			out, err := c.Approve(cmd.Context(), rev)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("approve %s: %w", rev, err)}
			}
			switch {
			case out.Matches && out.HeldSteps > 0:
				fmt.Fprintf(e.stdout, "approved the held plan of inventory revision %s: %s now\n", rev, heldRun(out.HeldSteps))
			case out.Matches:
				fmt.Fprintf(e.stdout, "approved inventory revision %s; the controller holds nothing in its plan now\n", rev)
			default:
				acting := out.Acting
				if len(acting) > 12 {
					acting = acting[:12]
				}
				fmt.Fprintf(e.stdout, "recorded the approval of inventory revision %s, but the controller acts on %s: nothing held is released until a plan of %s is held\n", rev, orNone(acting), rev)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&apiURL, "api", envOr(envAPI, defaultAPI), "admin API base URL (env "+envAPI+"); the token comes from "+envToken)
	return cmd
}

// orNone is s, or "no revision yet" when s is empty.
func orNone(s string) string {
	if s == "" {
		return "no revision yet"
	}
	return s
}

// heldRun is "1 held step runs", "3 held steps run".
func heldRun(n int) string {
	if n == 1 {
		return "1 held step runs"
	}
	return fmt.Sprintf("%d held steps run", n)
}
