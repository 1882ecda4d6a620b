package main

import (
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/machina-metal/machina/state"
)

// newStateCmd is `machina state`: one-shot operations on the state store.
func newStateCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "state",
		Short: "Operate on the state store (migrate a bbolt site into etcd)",
	}
	var from, to string
	var files state.EtcdTLSFiles
	migrate := &cobra.Command{
		Use:   "migrate --from FILE --to etcd://HOST:PORT[,HOST:PORT...]/PREFIX",
		Short: "Copy a bbolt site into an empty etcd prefix, record by record, and verify every record",
		Long: "Copy every record of the bbolt state file FILE (servers, events, tokens, secrets as stored, hosts,\n" +
			"join logs, approvals, the CA) with every bucket's sequence into etcd under PREFIX, then read every\n" +
			"record back and compare it with the file. Stop machina serve first (the file is locked while it runs).\n" +
			"The target prefix must be empty. Sealed secrets stay sealed under the same master key.\n" +
			"Then start every controller with --state etcd://.../PREFIX.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if from == "" || to == "" {
				return usageError{fmt.Errorf("state migrate: --from FILE and --to etcd://... are required")}
			}
			cfg, _, err := state.ParseEtcdTarget(to, files)
			if err != nil {
				return usageError{fmt.Errorf("state migrate: --to: %w", err)}
			}
			log := slog.New(slog.NewTextHandler(e.stderr, nil))
			res, err := state.MigrateToEtcd(from, cfg, log)
			if err != nil {
				return explainOpen(from, err)
			}
			for _, line := range res.MigrateSummary() {
				fmt.Fprintln(e.stdout, line)
			}
			fmt.Fprintf(e.stdout, "copied and verified %d records in %d buckets from %s to %s\n", res.Total, res.Buckets, from, to)
			return nil
		},
	}
	f := migrate.Flags()
	f.StringVar(&from, "from", "", "bbolt state file to copy (e.g. /var/lib/machina/state.db)")
	f.StringVar(&to, "to", "", "etcd site etcd://HOST:PORT[,HOST:PORT...]/PREFIX; PREFIX must be empty")
	addEtcdTLSFlags(f, &files, nil)
	cmd.AddCommand(migrate)
	return cmd
}
