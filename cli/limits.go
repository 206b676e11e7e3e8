package cli

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/timefmt"
	"github.com/stinthq/stint/spi"
)

// newLimitsCmd returns `stint limits` and its subcommands.
func (c *cli) newLimitsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "limits",
		Short: "List, set and remove rate limits and concurrency caps",
		Long: `Flow control across the cluster, changed at runtime. A rate limit is named and
shared by the behaviors whose tasks use it: each key of it (a customer, an
external API) may start LIMIT units per PERIOD, and as many at once after a
PERIOD idle. A concurrency cap bounds the running tasks of a behavior, of one
group key (--key) or in all. A task held back by a limit waits, due, without
failing or counting an attempt; 'stint tasks show' says what it waits on.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	set := &cobra.Command{
		Use:   "set",
		Short: "Set a rate limit or a concurrency cap",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	set.AddCommand(c.newLimitsSetRateCmd(), c.newLimitsSetConcurrencyCmd())
	rm := &cobra.Command{
		Use:   "rm",
		Short: "Remove a rate limit or a concurrency cap",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	rm.AddCommand(c.newLimitsRmRateCmd(), c.newLimitsRmConcurrencyCmd())
	cmd.AddCommand(c.newLimitsLsCmd(), set, rm)
	return cmd
}

// newLimitsLsCmd returns `stint limits ls`.
func (c *cli) newLimitsLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the rate limits (use per key, waiting tasks, next free unit) and the concurrency caps",
		Args:  exactArgs(0),
	}
	db := addDBFlag(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the limits as JSON (periods in nanoseconds)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		client, closeClient, err := c.openClient(cmd.Context(), db)
		if err != nil {
			return err
		}
		defer closeClient()
		rate, err := client.RateLimits(cmd.Context())
		if err != nil {
			return fmt.Errorf("list rate limits: %w", c.schemaHint(err))
		}
		conc, err := client.ConcurrencyLimits(cmd.Context())
		if err != nil {
			return fmt.Errorf("list concurrency limits: %w", c.schemaHint(err))
		}
		if asJSON {
			if rate == nil {
				rate = []api.RateLimitInfo{}
			}
			if conc == nil {
				conc = []api.ConcurrencyInfo{}
			}
			return writeJSON(c.stdout, struct {
				Rate        []api.RateLimitInfo   `json:"rate"`
				Concurrency []api.ConcurrencyInfo `json:"concurrency"`
			}{rate, conc})
		}
		return c.printLimits(rate, conc)
	}
	return cmd
}

// printLimits prints the rate limits, a row per key (a limit no key used
// lately has one row), then the concurrency caps; an empty kind is said
// on stderr.
func (c *cli) printLimits(rate []api.RateLimitInfo, conc []api.ConcurrencyInfo) error {
	if len(rate) == 0 {
		fmt.Fprintln(c.stderr, "no rate limits")
	} else {
		tw := newTable(c.stdout)
		fmt.Fprintln(tw, "RATE LIMIT\tLIMIT\tPERIOD\tKEY\tUSED\tWAITING\tNEXT FREE")
		for _, l := range rate {
			if len(l.Keys) == 0 {
				fmt.Fprintf(tw, "%s\t%d\t%s\t-\t0\t%d\t-\n", l.Name, l.Limit, timefmt.Duration(l.Period), l.Waiting)
			}
			for _, k := range l.Keys {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%d\t%s\n", l.Name, l.Limit, timefmt.Duration(l.Period), orDash(k.Key), k.Used, k.Waiting, formatTime(k.NextFree))
			}
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write table: %w", err)
		}
	}
	if len(conc) == 0 {
		fmt.Fprintln(c.stderr, "no concurrency limits")
		return nil
	}
	if len(rate) > 0 {
		fmt.Fprintln(c.stdout)
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "CONCURRENCY\tKEY\tMAX\tWEIGHT\tRUNNING\tWAITING")
	for _, l := range conc {
		maxText, weight := strconv.Itoa(l.Max), "-"
		if l.Max == 0 {
			maxText = "policy"
		}
		if l.Key != "" && l.Weight != 0 { // a behavior's cap as a whole has no weight
			weight = strconv.Itoa(l.Weight)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\n", l.Behavior, orDash(l.Key), maxText, weight, l.Running, l.Waiting)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

// newLimitsSetRateCmd returns `stint limits set rate`.
func (c *cli) newLimitsSetRateCmd() *cobra.Command {
	var limit int64
	var period time.Duration
	cmd := &cobra.Command{
		Use:   "rate NAME --limit N --period DURATION",
		Short: "Store a rate limit, or change the one of that name",
		Example: `  stint limits set rate partner-api --limit 100 --period 1m
  stint limits set rate mail --limit 5 --period 1s`,
		Args: exactArgs(1, "NAME"),
	}
	db := addDBFlag(cmd)
	cmd.Flags().Int64Var(&limit, "limit", 0, "the most units a key may start per period, and its burst: at least 1 (required)")
	cmd.Flags().DurationVar(&period, "period", 0, "the time over which the limit refills, such as 1s, 1m or 1h: at least 1ms (required)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		for _, f := range []string{"limit", "period"} {
			if !cmd.Flags().Changed(f) {
				return usageErrorf("--%s is required", f)
			}
		}
		l := api.RateLimit{Name: args[0], Limit: limit, Period: period}
		if err := spi.CheckRateLimit(l); err != nil {
			return usageErrorf("set rate limit %q: %w", l.Name, err)
		}
		client, closeClient, err := c.openClient(cmd.Context(), db)
		if err != nil {
			return err
		}
		defer closeClient()
		if err := client.SetRateLimit(cmd.Context(), l); err != nil {
			if errors.Is(err, api.ErrInvalid) {
				return usageErrorf("%w", err)
			}
			return fmt.Errorf("set rate limit: %w", c.schemaHint(err))
		}
		fmt.Fprintf(c.stdout, "rate limit %s set: %d per %s\n", l.Name, l.Limit, timefmt.Duration(l.Period))
		return nil
	}
	return cmd
}

// newLimitsSetConcurrencyCmd returns `stint limits set concurrency`.
func (c *cli) newLimitsSetConcurrencyCmd() *cobra.Command {
	var key string
	var maxRunning, weight int
	var force bool
	cmd := &cobra.Command{
		Use:   "concurrency BEHAVIOR [--key KEY] --max N [--weight W] [--force]",
		Short: "Cap the running tasks of a behavior, or of one of its group keys, across all nodes",
		Long: `Cap the running tasks of a behavior across all nodes: of one group key with
--key (overriding its policy's GroupConcurrency for that key), else of the
behavior as a whole (overriding its ClusterConcurrency). Tasks running over a
lowered cap run on. On a key, --weight sets its share of the claims of a
behavior with fair share, and --max 0 keeps the policy's cap. A behavior this
program does not register and no live node runs is refused, as a typo would
be: --force sets the cap anyway, for a behavior whose nodes are not deployed
yet.`,
		Example: `  stint limits set concurrency demo.echo --max 4
  stint limits set concurrency ingest.job --key acme --max 2 --weight 3`,
		Args: exactArgs(1, "BEHAVIOR"),
	}
	db := addDBFlag(cmd)
	cmd.Flags().StringVar(&key, "key", "", "the group key the cap is for (default: the behavior as a whole)")
	cmd.Flags().IntVar(&maxRunning, "max", 0, "the most tasks that may run at once: at least 1, or 0 on a key to set only --weight (required)")
	cmd.Flags().IntVar(&weight, "weight", 0, "the key's share of claims under fair share (default 1; only with --key)")
	cmd.Flags().BoolVar(&force, "force", false, "set the cap of a behavior that no live node runs yet")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if !cmd.Flags().Changed("max") {
			return usageErrorf("--max is required")
		}
		l := api.ConcurrencyLimit{Behavior: api.BehaviorID(args[0]), Key: key, Max: maxRunning, Weight: weight, Force: force}
		if err := spi.CheckConcurrencyLimit(l); err != nil {
			return usageErrorf("set concurrency limit of %s: %w", capName(l.Behavior, l.Key), err)
		}
		client, closeClient, err := c.openClient(cmd.Context(), db)
		if err != nil {
			return err
		}
		defer closeClient()
		if err := client.SetConcurrencyLimit(cmd.Context(), l); err != nil {
			if errors.Is(err, api.ErrUnknownBehavior) {
				return usageErrorf("%w; pass --force to set it for a behavior whose nodes are not deployed yet", err)
			}
			if errors.Is(err, api.ErrInvalid) {
				return usageErrorf("%w", err)
			}
			return fmt.Errorf("set concurrency limit: %w", c.schemaHint(err))
		}
		fmt.Fprintf(c.stdout, "concurrency limit of %s set: %s\n", capName(l.Behavior, l.Key), describeCap(l))
		return nil
	}
	return cmd
}

// capName names the cap of behavior and key: "b" or "b key k".
func capName(behavior api.BehaviorID, key string) string {
	if key == "" {
		return string(behavior)
	}
	return fmt.Sprintf("%s key %q", behavior, key)
}

// describeCap says what a cap allows: "at most 4 running", with its weight.
func describeCap(l api.ConcurrencyLimit) string {
	s := fmt.Sprintf("at most %d running", l.Max)
	if l.Max == 0 {
		s = "the policy's cap"
	}
	if l.Weight != 0 {
		s += fmt.Sprintf(", weight %d", l.Weight)
	}
	return s
}

// newLimitsRmRateCmd returns `stint limits rm rate`.
func (c *cli) newLimitsRmRateCmd() *cobra.Command {
	return c.newRemoveCmd("rate NAME", "Remove a rate limit; tasks that name it start unlimited", "rate limit",
		(*impl.Client).RemoveRateLimit)
}

// newLimitsRmConcurrencyCmd returns `stint limits rm concurrency`.
func (c *cli) newLimitsRmConcurrencyCmd() *cobra.Command {
	var key string
	cmd := &cobra.Command{
		Use:   "concurrency BEHAVIOR [--key KEY]",
		Short: "Remove a concurrency cap; the behavior's policy applies again",
		Args:  exactArgs(1, "BEHAVIOR"),
	}
	db := addDBFlag(cmd)
	cmd.Flags().StringVar(&key, "key", "", "the group key of the cap (default: the behavior's cap as a whole)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		client, closeClient, err := c.openClient(cmd.Context(), db)
		if err != nil {
			return err
		}
		defer closeClient()
		behavior := api.BehaviorID(args[0])
		if err := client.RemoveConcurrencyLimit(cmd.Context(), behavior, key); err != nil {
			switch {
			case errors.Is(err, api.ErrInvalid):
				return usageErrorf("%w", err)
			case errors.Is(err, api.ErrNotFound):
				return fmt.Errorf("concurrency limit of %s: no such concurrency limit", capName(behavior, key))
			}
			return fmt.Errorf("remove concurrency limit: %w", c.schemaHint(err))
		}
		fmt.Fprintf(c.stdout, "concurrency limit of %s removed\n", capName(behavior, key))
		return nil
	}
	return cmd
}
