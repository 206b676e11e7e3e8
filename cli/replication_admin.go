package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/replication"
)

// newReplicationsDefineCmd returns `stint replications define`.
func (c *cli) newReplicationsDefineCmd() *cobra.Command {
	var params string
	var continuous bool
	cmd := &cobra.Command{
		Use:   "define NAME --params JSON|@FILE",
		Short: "Define a persistent replication, or update one, and submit its task",
		Long: `Define the persistent replication NAME with the given params (the JSON of a
replication task: source and target {dsn, table}, change_column, and optionally
key_columns, filter, tombstone_column, owner, batch_size), or update it if NAME
exists. The definition is checked against both databases first; its row and its
task are written in one transaction, so a refused definition writes nothing.
With --continuous the replication follows the source until it is undefined;
otherwise it runs once until caught up.`,
		Example: `  stint replications define orders-eu --continuous --params @orders-eu.json`,
		Args:    exactArgs(1, "NAME"),
	}
	db := addDBFlag(cmd)
	cmd.Flags().StringVar(&params, "params", "", "the replication's params as JSON, @FILE or @- for standard input (required)")
	cmd.Flags().BoolVar(&continuous, "continuous", false, "follow the source until undefined, instead of running once")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		if params == "" {
			return usageErrorf("--params is required")
		}
		raw, err := readParams(params, cmd.InOrStdin())
		if err != nil {
			return err
		}
		var p replication.Params
		if err := json.Unmarshal(raw, &p); err != nil {
			var ie *api.InvalidError
			if errors.As(err, &ie) {
				return err
			}
			return api.Invalid("params", "%v", err)
		}
		st, client, closeAll, err := c.openReplications(ctx, db)
		if err != nil {
			return err
		}
		defer closeAll()
		id, err := replication.Define(ctx, st.Pool(), client, replication.Definition{Name: args[0], Continuous: continuous, Params: p})
		if err != nil {
			return c.schemaHint(err)
		}
		fmt.Fprintf(c.stdout, "replication %s defined: task %s\n", args[0], id)
		return nil
	}
	return cmd
}

// newReplicationsUndefineCmd returns `stint replications undefine`.
func (c *cli) newReplicationsUndefineCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "undefine NAME",
		Short: "Delete a persistent replication and remove its task",
		Long: `Delete the persistent replication NAME and remove its task; a running task
halts at its next write. The target keeps the rows copied so far.`,
		Args: exactArgs(1, "NAME"),
	}
	db := addDBFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		st, client, closeAll, err := c.openReplications(ctx, db)
		if err != nil {
			return err
		}
		defer closeAll()
		err = replication.Undefine(ctx, st.Pool(), client, args[0])
		if errors.Is(err, replication.ErrNoDefinition) {
			return fmt.Errorf("replication definition %q not found", args[0])
		}
		if err != nil {
			return c.schemaHint(err)
		}
		fmt.Fprintf(c.stdout, "replication %s undefined\n", args[0])
		return nil
	}
	return cmd
}

// newReplicationsTriggerCmd returns `stint replications trigger` and its
// subcommand install.
func (c *cli) newReplicationsTriggerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "trigger",
		Short: "Manage the change trigger of a source table",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	var dsn, table, column string
	install := &cobra.Command{
		Use:   "install --dsn SOURCE --table TABLE --column COLUMN",
		Short: "Make a column of a source table a change column, maintained by a trigger",
		Long: `Make COLUMN of TABLE in the source database SOURCE a change column, as a
replication needs: a bigint set from a sequence on every insert and update. In
one transaction it adds the column if missing, creates the sequence, the trigger
function and the trigger, gives every existing row a change value, and creates
an index on the column. It may be run again. Backfilling and creating the index
lock the table against writes while they run.`,
		Example: `  stint replications trigger install --dsn postgres://app@src/shop --table public.orders --column chg`,
		Args:    exactArgs(0),
	}
	f := install.Flags()
	f.StringVar(&dsn, "dsn", "", "the source database's connection string (required)")
	f.StringVar(&table, "table", "", "the table, optionally schema-qualified (required)")
	f.StringVar(&column, "column", "chg", "the change column")
	install.RunE = func(cmd *cobra.Command, _ []string) error {
		return c.runTriggerInstall(cmd.Context(), dsn, table, column)
	}
	cmd.AddCommand(install)
	return cmd
}

// runTriggerInstall implements `stint replications trigger install`.
func (c *cli) runTriggerInstall(ctx context.Context, dsn, table, column string) error {
	if dsn == "" || table == "" {
		return usageErrorf("--dsn and --table are required")
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		// pgx leaves the password out of its parse errors.
		return usageErrorf("--dsn: %v", err)
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	cfg.RuntimeParams["application_name"] = "stint:trigger"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect to the source database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ct, err := replication.InstallChangeTrigger(ctx, conn, table, column)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "change column %s of %s installed: sequence %s, function %s, trigger %s, index %s; %d rows backfilled\n",
		column, table, ct.Sequence, ct.Function, ct.Trigger, ct.Index, ct.Backfilled)
	return nil
}
