package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	bolt "go.etcd.io/bbolt"
)

// newStateCmd is `machinactl state snapshot FILE`: an online backup of
// the controller's state file through GET /api/v1/state/snapshot.
func newStateCmd(e *env) *cobra.Command {
	var apiURL string
	cmd := &cobra.Command{
		Use:   "state",
		Short: "Back up the controller's state file",
	}
	cmd.PersistentFlags().StringVar(&apiURL, "api", apiFlagDefault(), "admin API base URL (env "+envAPI+"); the token comes from "+envToken)
	snap := &cobra.Command{
		Use:   "snapshot FILE",
		Short: "Save an online copy of the state file to FILE (mode 0600), checked before it is kept",
		Long: `Save a consistent copy of the running controller's state file (one bbolt read transaction)
to FILE, without stopping the controller. The copy is written next to FILE, checked with
bbolt's consistency check, then renamed over FILE, so FILE is either the old file or a whole,
checked copy. It holds what the state file holds (secrets sealed with the master key when one
is set, admin tokens as hashes): keep it 0600 and apart from the master key.
Restore: stop machina, copy FILE over the state file (0600, owned by the service user), start.`,
		Example: "  MACHINA_API=https://machina.example:8444 MACHINA_CA=/etc/machina/ca.pem MACHINA_TOKEN=... machinactl state snapshot /var/backups/machina-$(date +%F).db",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.apiClient(apiURL)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("state snapshot: %w", err)}
			}
			dst := args[0]
			tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".*")
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("state snapshot: %w", err)}
			}
			defer os.Remove(tmp.Name()) // after the rename this fails harmlessly
			if err := tmp.Chmod(0o600); err != nil {
				tmp.Close()
				return &exitError{code: 2, err: fmt.Errorf("state snapshot: %w", err)}
			}
			n, err := c.Snapshot(cmd.Context(), tmp)
			if err == nil {
				err = tmp.Sync()
			}
			if cerr := tmp.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return &exitError{code: 1, err: fmt.Errorf("state snapshot: %w", err)}
			}
			if err := checkBolt(tmp.Name()); err != nil {
				return &exitError{code: 1, err: fmt.Errorf("state snapshot: the copy fails its check, not kept: %w", err)}
			}
			if err := os.Rename(tmp.Name(), dst); err != nil {
				return &exitError{code: 2, err: fmt.Errorf("state snapshot: %w", err)}
			}
			fmt.Fprintf(e.stdout, "state snapshot: %s, %d bytes, checked\n", dst, n)
			return nil
		},
	}
	cmd.AddCommand(snap)
	return cmd
}

// checkBolt opens path read-only and runs bbolt's consistency check.
func checkBolt(path string) error {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return err
	}
	defer db.Close()
	return db.View(func(tx *bolt.Tx) error {
		var errs []error
		for err := range tx.Check() {
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	})
}
