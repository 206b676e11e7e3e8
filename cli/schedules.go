package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
)

// newSchedulesCmd returns `stint schedules` and its subcommands.
func (c *cli) newSchedulesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "schedules",
		Short: "List, add and remove periodic schedules",
		Long: `A schedule fires a task of a behavior at the times its spec gives: five cron
fields read in its time zone (UTC by default), a descriptor such as @daily, or
@every 10m. Each tick fires once across all server nodes; after downtime the
missed ticks fire once, as the latest of them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(c.newSchedulesLsCmd(), c.newSchedulesAddCmd(), c.newSchedulesRmCmd())
	return cmd
}

// newSchedulesLsCmd returns `stint schedules ls`.
func (c *cli) newSchedulesLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the schedules with their last and next tick",
		Args:  exactArgs(0),
	}
	db := addDBFlag(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the schedules as JSON")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		client, closeClient, err := c.openClient(cmd.Context(), db)
		if err != nil {
			return err
		}
		defer closeClient()
		list, err := client.Schedules(cmd.Context())
		if err != nil {
			return fmt.Errorf("list schedules: %w", c.schemaHint(err))
		}
		if asJSON {
			if list == nil {
				list = []api.ScheduleInfo{}
			}
			for i := range list {
				c.reg.RedactSchedule(&list[i].Schedule) // no password is ever printed
			}
			return writeJSON(c.stdout, struct {
				Schedules []api.ScheduleInfo `json:"schedules"`
			}{list})
		}
		if len(list) == 0 {
			fmt.Fprintln(c.stderr, "no schedules")
			return nil
		}
		tw := newTable(c.stdout)
		fmt.Fprintln(tw, "NAME\tBEHAVIOR\tSPEC\tZONE\tORIGIN\tLAST TICK\tNEXT TICK")
		for _, s := range list {
			origin, zone := "added", s.TimeZone
			if s.Registered {
				origin = "behavior"
			}
			if zone == "" {
				zone = "UTC"
			}
			next := "-"
			if !s.NextTick.IsZero() {
				next = formatTime(&s.NextTick)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Behavior, s.Spec, zone, origin, formatTime(s.LastTick), next)
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write table: %w", err)
		}
		return nil
	}
	return cmd
}

// newSchedulesAddCmd returns `stint schedules add`.
func (c *cli) newSchedulesAddCmd() *cobra.Command {
	var spec, zone, params string
	cmd := &cobra.Command{
		Use:   "add NAME BEHAVIOR --spec SPEC",
		Short: "Add a schedule, or replace the added schedule of that name",
		Example: `  stint schedules add nightly-echo demo.echo --spec '0 3 * * *' --zone Europe/Berlin --params '{"text":"nightly"}'
  stint schedules add poll-echo demo.echo --spec '@every 5m' --params '{"text":"poll"}'`,
		Args: exactArgs(2, "NAME", "BEHAVIOR"),
	}
	db := addDBFlag(cmd)
	cmd.Flags().StringVar(&spec, "spec", "", "when it fires: five cron fields, @hourly/@daily/..., or @every DURATION (required)")
	cmd.Flags().StringVar(&zone, "zone", "", "the IANA time zone of the cron fields (default UTC)")
	cmd.Flags().StringVar(&params, "params", "", "the params of every task it fires: JSON, @FILE, or @- for standard input")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if spec == "" {
			return usageErrorf("--spec is required: five cron fields, @daily and the like, or @every 10m")
		}
		raw, err := readParams(params, cmd.InOrStdin())
		if err != nil {
			return err
		}
		client, closeClient, err := c.openClient(cmd.Context(), db)
		if err != nil {
			return err
		}
		defer closeClient()
		sc := api.Schedule{Name: args[0], Behavior: api.BehaviorID(args[1]), Spec: spec, TimeZone: zone, Params: raw}
		if err := client.AddSchedule(cmd.Context(), sc); err != nil {
			if errors.Is(err, api.ErrInvalid) {
				return usageErrorf("%w", err)
			}
			return fmt.Errorf("add schedule: %w", c.schemaHint(err))
		}
		fmt.Fprintf(c.stdout, "schedule %s added\n", sc.Name)
		return nil
	}
	return cmd
}

// newSchedulesRmCmd returns `stint schedules rm`.
func (c *cli) newSchedulesRmCmd() *cobra.Command {
	return c.newRemoveCmd("rm NAME", "Remove a schedule (a behavior's own comes back when a node that runs it starts)", "schedule",
		(*impl.Client).RemoveSchedule)
}

// newRemoveCmd returns a command that removes the thing (a noun such as
// "schedule") its one argument names, with remove: it prints "NOUN NAME
// removed", and says "no such NOUN" for api.ErrNotFound.
func (c *cli) newRemoveCmd(use, short, noun string, remove func(*impl.Client, context.Context, string) error) *cobra.Command {
	cmd := &cobra.Command{Use: use, Short: short, Args: exactArgs(1, "NAME")}
	db := addDBFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		client, closeClient, err := c.openClient(cmd.Context(), db)
		if err != nil {
			return err
		}
		defer closeClient()
		if err := remove(client, cmd.Context(), args[0]); err != nil {
			switch {
			case errors.Is(err, api.ErrInvalid):
				return usageErrorf("%w", err)
			case errors.Is(err, api.ErrNotFound):
				return fmt.Errorf("%s %s: no such %s", noun, args[0], noun)
			}
			return fmt.Errorf("remove %s: %w", noun, c.schemaHint(err))
		}
		fmt.Fprintf(c.stdout, "%s %s removed\n", noun, args[0])
		return nil
	}
	return cmd
}
