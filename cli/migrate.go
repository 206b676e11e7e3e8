package cli

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/stinthq/stint/migrations"
)

// newMigrateCmd returns `stint migrate` and its subcommands.
func (c *cli) newMigrateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply, revert or list the schema migrations",
		Long: `Apply, revert or list stint's schema migrations. The schema comes in lines:
stint's own ("stint") and one per built-in behavior with tables of its own
("ingest", "replication"), each numbered from 1. Migrators take an advisory
lock, so running them from several places at once is safe.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	cmd.AddCommand(
		c.newMigrateSubCmd("up", "Apply every pending migration", c.migrateUp),
		c.newMigrateSubCmd("down", "Revert the newest applied migration (this drops its tables and their data)", c.migrateDown),
		c.newMigrateSubCmd("status", "List the migrations: applied (and when) or pending", c.migrateStatus),
	)
	return cmd
}

// newMigrateSubCmd returns a migrate subcommand that runs fn on a
// connection to the --db database.
func (c *cli) newMigrateSubCmd(use, short string, fn func(ctx context.Context, conn *pgx.Conn) error) *cobra.Command {
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  exactArgs(0),
	}
	db := addDBFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
		dsn, err := db.URL()
		if err != nil {
			return err
		}
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return fmt.Errorf("connect to the database: %w", err)
		}
		defer conn.Close(context.WithoutCancel(ctx))
		return fn(ctx, conn)
	}
	return cmd
}

// migrateUp applies pending migrations and says which.
func (c *cli) migrateUp(ctx context.Context, conn *pgx.Conn) error {
	before, err := migrations.List(ctx, conn)
	if err != nil {
		return fmt.Errorf("list migrations: %w", err)
	}
	if err := migrations.Up(ctx, conn); err != nil {
		return err
	}
	after, err := migrations.List(ctx, conn)
	if err != nil {
		return fmt.Errorf("list migrations: %w", err)
	}
	applied := 0
	for i, m := range after {
		if !m.AppliedAt.IsZero() && (i >= len(before) || before[i].AppliedAt.IsZero()) {
			fmt.Fprintf(c.stdout, "applied %s\n", m.Migration.String())
			applied++
		}
	}
	if applied == 0 {
		fmt.Fprintln(c.stdout, "the schema is up to date: no pending migrations")
	}
	return nil
}

// migrateDown reverts the newest applied migration and says which.
func (c *cli) migrateDown(ctx context.Context, conn *pgx.Conn) error {
	before, err := migrations.List(ctx, conn)
	if err != nil {
		return fmt.Errorf("list migrations: %w", err)
	}
	// The one Down reverts: applied last, of any line.
	var newest *migrations.Status
	for i := range before {
		if !before[i].AppliedAt.IsZero() && (newest == nil || !before[i].AppliedAt.Before(newest.AppliedAt)) {
			newest = &before[i]
		}
	}
	if newest == nil {
		fmt.Fprintln(c.stdout, "no migration is applied: nothing to revert")
		return nil
	}
	if err := migrations.Down(ctx, conn); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "reverted %s\n", newest.Migration.String())
	return nil
}

// migrateStatus prints a table of the migrations.
func (c *cli) migrateStatus(ctx context.Context, conn *pgx.Conn) error {
	list, err := migrations.List(ctx, conn)
	if err != nil {
		return fmt.Errorf("list migrations: %w", err)
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "LINE\tVERSION\tNAME\tAPPLIED AT")
	for _, m := range list {
		applied := "pending"
		if !m.AppliedAt.IsZero() {
			applied = formatTime(&m.AppliedAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m.Line, strconv.Itoa(m.Version), m.Name, applied)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}
