package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"text/tabwriter"
	"time"

	"github.com/machina-metal/machina/state"
	"github.com/spf13/cobra"
)

// newTokenCmd is `machina token create|list|revoke`: admin API bearer
// tokens, managed by opening the state file directly (so the controller
// must not be running on it).
func newTokenCmd(e *env) *cobra.Command {
	var statePath string
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Manage admin API tokens (opens the state file directly)",
	}
	cmd.PersistentFlags().StringVar(&statePath, "state", envOrDefault(envState, defaultStatePath), "bbolt state file, or an etcd site etcd://HOST:PORT[,...]/PREFIX[?ca=FILE&cert=FILE&key=FILE] (env "+envState+")")
	// open opens the state file. Folders are never created (state.Open),
	// so a mistyped --state fails; list and revoke also need the file
	// (mustExist), while create may make the first one, before the first
	// machina serve, and says so.
	open := func(mustExist bool) (*state.Store, error) {
		_, statErr := os.Stat(statePath)
		st, err := state.OpenTarget(statePath, state.EtcdTLSFiles{}, state.Options{Timeout: time.Second, MustExist: mustExist})
		if err != nil {
			return nil, explainOpen(statePath, err)
		}
		if errors.Is(statErr, fs.ErrNotExist) && !state.IsEtcdTarget(statePath) {
			fmt.Fprintf(e.stderr, "machina token: created a new, empty state file %s (no site was there; machina serve --state %s uses it)\n", statePath, statePath)
		}
		return st, nil
	}

	cmd.AddCommand(tokenCreateCmd(e, open), tokenListCmd(e, open), tokenRevokeCmd(e, open))
	return cmd
}

// tokenCreateCmd is `machina token create`.
func tokenCreateCmd(e *env, open func(mustExist bool) (*state.Store, error)) *cobra.Command {
	var name string
	create := &cobra.Command{
		Use:   "create --name NAME",
		Short: "Create an admin token and print it once",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if !state.ValidName(name) {
				return fmt.Errorf("token create: --name must be an RFC 1123 label (lower-case letters, digits, inner hyphens)")
			}
			st, err := open(false)
			if err != nil {
				return fmt.Errorf("token create: %w", err)
			}
			defer st.Close()
			value, _, err := st.CreateAdminToken(name, state.ActorLocal)
			if err != nil {
				return fmt.Errorf("token create: %w", err)
			}
			fmt.Fprintln(e.stdout, value)
			fmt.Fprintf(e.stderr, "admin token %q created; it is shown only this once (use it as MACHINA_TOKEN)\n", name)
			return nil
		},
	}
	create.Flags().StringVar(&name, "name", "", "token name, recorded as the actor of every change made with it")
	_ = create.MarkFlagRequired("name")
	return create
}

// tokenListCmd is `machina token list`.
func tokenListCmd(e *env, open func(mustExist bool) (*state.Store, error)) *cobra.Command {
	list := &cobra.Command{
		Use:   "list",
		Short: "List admin tokens (names only)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			st, err := open(true)
			if err != nil {
				return fmt.Errorf("token list: %w", err)
			}
			defer st.Close()
			toks, err := st.AdminTokens()
			if err != nil {
				return fmt.Errorf("token list: %w", err)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tID\tCREATED")
			for _, t := range toks {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", t.Name, t.ID, t.CreatedAt.Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	return list
}

// tokenRevokeCmd is `machina token revoke`.
func tokenRevokeCmd(e *env, open func(mustExist bool) (*state.Store, error)) *cobra.Command {
	var revokeName string
	revoke := &cobra.Command{
		Use:   "revoke --name NAME",
		Short: "Revoke an admin token",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			st, err := open(true)
			if err != nil {
				return fmt.Errorf("token revoke: %w", err)
			}
			defer st.Close()
			if err := st.RevokeAdminToken(revokeName, state.ActorLocal); err != nil {
				return fmt.Errorf("token revoke: %w", err)
			}
			fmt.Fprintf(e.stderr, "admin token %q revoked\n", revokeName)
			return nil
		},
	}
	revoke.Flags().StringVar(&revokeName, "name", "", "token name")
	_ = revoke.MarkFlagRequired("name")
	return revoke
}
