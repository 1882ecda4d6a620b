package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

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
	cmd.AddCommand(migrate, newZoneClaimsCmd(e))
	return cmd
}

// newZoneClaimsCmd is `machina state zone-claims`: list the controller
// groups' zone claims of a sharded site, or delete a retired group's.
func newZoneClaimsCmd(e *env) *cobra.Command {
	var target, del string
	var files state.EtcdTLSFiles
	cmd := &cobra.Command{
		Use:   "zone-claims --state etcd://… [--delete GROUP]",
		Short: "List the controller groups' zone claims (docs/ha.md \"Sharding\"), or delete a retired group's claim",
		Long: "Each group's leader records the zones it claims (machina serve --group --zones); a zone two groups claim is\n" +
			"planned by neither. A group's claim stays when the group stops: after moving its zones to another group, delete\n" +
			"it with --delete GROUP (a running group records its claim again on its next pass).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := state.OpenTarget(target, files, state.Options{Timeout: time.Second, MasterKey: []byte(os.Getenv(envMasterKey))})
			if err != nil {
				return explainOpen(target, err)
			}
			defer st.Close()
			if del != "" {
				if err := st.DeleteZoneClaim(del); err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "deleted the zone claim of group %s\n", del)
				return nil
			}
			cs, err := st.ZoneClaims()
			if err != nil {
				return err
			}
			for _, c := range cs {
				fmt.Fprintf(e.stdout, "%s\t%s\t%s\t%s\n", c.Group, strings.Join(c.Zones, ","), c.By, c.At.Format(time.RFC3339))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&target, "state", envOrDefault(envState, defaultStatePath), "the site's state: an etcd site etcd://HOST:PORT[,HOST:PORT...]/PREFIX (or a bbolt file)")
	f.StringVar(&del, "delete", "", "delete this group's claim")
	addEtcdTLSFlags(f, &files, nil)
	return cmd
}
