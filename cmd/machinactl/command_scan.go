package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/discover"
)

// newScanCmd is `machinactl scan CIDR --credentials NAME[,NAME...]`: the
// controller scans the private range for Redfish BMCs through POST
// /api/v1/scan (credentials are secret-store names; passwords stay in the
// controller) and the result is printed as a table or JSON. With
// --register the authenticated BMCs are proposed as new servers.yaml
// entries in a commit on a new branch discovered/DATE of the local clone
// --repo, started from --branch (default main), or straight onto that
// branch with --commit-to BRANCH. Exit 0 done, 1 the proposal would be an
// invalid inventory, 2 usage or other error.
func newScanCmd(e *env) *cobra.Command {
	var apiURL, creds, format, repo, branch, zone, site, commitTo string
	var threshold, port int
	var insecure, register bool
	cmd := &cobra.Command{
		Use:   "scan CIDR --credentials NAME[,NAME...]",
		Short: "Find Redfish BMCs on a private subnet and optionally propose them as servers",
		Example: "  machinactl scan 10.10.4.0/24 --credentials bmc-dell,bmc-hpe --insecure-tls\n" +
			"  machinactl scan 10.10.4.0/24 --credentials bmc-dell --insecure-tls --register --zone zone-b --repo ~/site-inventory",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if format != "table" && format != "json" {
				return &exitError{code: 2, err: fmt.Errorf("scan: --format %q: want table or json", format)}
			}
			names := strings.Split(creds, ",")
			if creds == "" {
				return &exitError{code: 2, err: fmt.Errorf("scan: --credentials is required")}
			}
			if len(names) > discover.MaxCredentials || slices.Contains(names, "") {
				return &exitError{code: 2, err: fmt.Errorf("scan: --credentials: give 1 to %d non-empty names separated by commas", discover.MaxCredentials)}
			}
			if threshold < 2 {
				return &exitError{code: 2, err: fmt.Errorf("scan: --lockout-threshold %d leaves no failed login to spend; give 2 or more (and only the one right credential)", threshold)}
			}
			if port < 0 || port > 65535 {
				return &exitError{code: 2, err: fmt.Errorf("scan: --port %d out of range", port)}
			}
			if register && zone == "" {
				return &exitError{code: 2, err: fmt.Errorf("scan: --register needs --zone")}
			}
			if !register && (commitTo != "" || zone != "" || site != "") {
				return &exitError{code: 2, err: fmt.Errorf("scan: --commit-to, --zone and --site only go with --register")}
			}
			// Refuse a bad range here too, before asking the controller.
			if _, err := discover.Addresses(args[0], false); err != nil {
				return &exitError{code: 2, err: fmt.Errorf("scan: %w", err)}
			}
			c, err := e.apiClient(apiURL)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("scan: %w", err)}
			}
			var rep discover.Report
			if err := c.Scan(cmd.Context(), v1.ScanRequest{CIDR: args[0], Credentials: names, LockoutThreshold: threshold, Port: port, InsecureTLS: insecure}, &rep); err != nil {
				return &exitError{code: 2, err: fmt.Errorf("scan %s: %w", args[0], err)}
			}
			return printAndRegister(e, &rep, format, register, discover.RegisterConfig{Repo: repo, Base: branch, CommitTo: commitTo, Zone: zone, Site: site})
		},
	}
	f := cmd.Flags()
	f.StringVar(&apiURL, "api", envOr(envAPI, defaultAPI), "admin API base URL (env "+envAPI+"); the token comes from "+envToken)
	f.StringVar(&creds, "credentials", "", "1 to 3 secret-store credential names, tried in order")
	f.IntVar(&threshold, "lockout-threshold", discover.DefaultLockoutThreshold, "the BMCs lock an account after this many failures; the scan spends at most one less")
	f.IntVar(&port, "port", 0, "Redfish HTTPS port (default 443)")
	f.BoolVar(&insecure, "insecure-tls", false, "accept self-signed BMC certificates (recorded as bmc.insecureTLS)")
	f.StringVar(&format, "format", "table", "output: table or json")
	f.BoolVar(&register, "register", false, "propose the authenticated BMCs as new servers.yaml entries in a commit")
	f.StringVar(&repo, "repo", ".", "with --register: local clone of the inventory repository")
	f.StringVar(&zone, "zone", "", "with --register: zone of the proposed servers")
	f.StringVar(&site, "site", "", "with --register: site of the proposed servers")
	f.StringVar(&branch, "branch", "main", "with --register: the inventory branch the proposal starts from")
	f.StringVar(&commitTo, "commit-to", "", "with --register: commit straight onto the inventory branch (--commit-to main) instead of a new discovered/DATE branch")
	return cmd
}

func printAndRegister(e *env, rep *discover.Report, format string, register bool, rc discover.RegisterConfig) error {
	var reg *discover.Registered
	if register {
		var err error
		if reg, err = discover.Register(rep, rc); err != nil {
			return importInvalid(fmt.Errorf("scan: register: %w", err))
		}
	}
	if format == "json" {
		out := struct {
			*discover.Report
			Registered *discover.Registered `json:"registered,omitempty"`
		}{rep, reg}
		return discover.WriteJSON(e.stdout, out)
	}
	if err := discover.WriteTable(e.stdout, rep); err != nil {
		return err
	}
	if reg != nil {
		for _, s := range reg.Skipped {
			fmt.Fprintf(e.stdout, "not proposed %s: %s\n", s.Key, termSafe(s.Reason))
		}
		if reg.Commit == "" {
			fmt.Fprintln(e.stdout, "nothing new to propose")
		} else {
			fmt.Fprintf(e.stdout, "proposed %d server(s) in %s on branch %s; review, merge and push it\n", len(reg.Added), reg.Commit[:12], reg.Branch)
		}
	}
	return nil
}
