package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// newBehaviorsCmd returns `stint behaviors` and its subcommands.
func (c *cli) newBehaviorsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "behaviors",
		Short: "List behaviors, pause and resume their claims on every node",
		Long: `A behavior's runtime settings, shared by every node: pause stops the claims of
its tasks on every node until resume (running tasks run on; its due tasks wait,
and 'stint tasks show' says they wait because it is paused).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(c.newBehaviorsLsCmd(),
		newAdminActionCmd(c, adminAction[api.BehaviorID]{noun: "behavior", verb: "pause", example: "demo.echo",
			short: "Stop the claims of a behavior's tasks on every node until resume; running tasks run on",
			done: func(prog, id string) string {
				return fmt.Sprintf("paused: its tasks wait until '%s behaviors resume %s'", prog, id)
			},
			check: c.checkRegistered, act: (*impl.Client).Pause}),
		newAdminActionCmd(c, adminAction[api.BehaviorID]{noun: "behavior", verb: "resume", example: "demo.echo",
			short: "Let the nodes claim a paused behavior's tasks again",
			done:  func(string, string) string { return "resumed" },
			check: c.checkRegistered, act: (*impl.Client).Resume}))
	return cmd
}

// behaviorRow is a behavior as `stint behaviors ls` shows it.
type behaviorRow struct {
	Behavior api.BehaviorID `json:"behavior"`
	// Registered is set when this program registers the behavior.
	Registered bool `json:"registered"`
	// Paused is set while an operator paused it.
	Paused bool `json:"paused"`
	// Lease is the lease set at runtime in place of its policy's, as Go
	// writes a duration ("1m0s"); empty keeps the policy's.
	Lease string `json:"lease,omitempty"`
	// Nodes are the registered nodes that run it.
	Nodes []string `json:"nodes"`
}

// newBehaviorsLsCmd returns `stint behaviors ls`.
func (c *cli) newBehaviorsLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the behaviors: paused or not, their lease set at runtime, the nodes that run them",
		Long: `List the behaviors this program registers, those a registered node runs and
those with runtime settings, in name order: whether each is paused, its lease
when one was set at runtime (else its policy's applies), and the nodes that run
it.`,
		Args: exactArgs(0),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the behaviors as JSON")
	return c.withClient(cmd, func(ctx context.Context, client *impl.Client, _ []string) error {
		rows, err := c.behaviorRows(ctx, client)
		if err != nil {
			return err
		}
		if asJSON {
			return writeJSON(c.stdout, struct {
				Behaviors []behaviorRow `json:"behaviors"`
			}{rows})
		}
		tw := newTable(c.stdout)
		fmt.Fprintln(tw, "BEHAVIOR\tPAUSED\tLEASE\tNODES")
		for _, b := range rows {
			paused, lease := "no", "-"
			if b.Paused {
				paused = "yes"
			}
			if b.Lease != "" {
				lease = b.Lease
			}
			nodes := orDash(strings.Join(b.Nodes, ","))
			if !b.Registered {
				nodes += " (not registered here)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", b.Behavior, paused, lease, nodes)
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write table: %w", err)
		}
		return nil
	})
}

// behaviorRows returns the behaviors registered here, run by a node or
// with runtime settings, in name order.
func (c *cli) behaviorRows(ctx context.Context, client *impl.Client) ([]behaviorRow, error) {
	settings, err := client.Behaviors(ctx)
	if err != nil {
		return nil, fmt.Errorf("list behaviors: %w", c.schemaHint(err))
	}
	nodes, err := client.Nodes(ctx)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", c.schemaHint(err))
	}
	byID := map[api.BehaviorID]*behaviorRow{}
	row := func(id api.BehaviorID) *behaviorRow {
		if byID[id] == nil {
			_, registered := c.reg.Lookup(id)
			byID[id] = &behaviorRow{Behavior: id, Registered: registered, Nodes: []string{}}
		}
		return byID[id]
	}
	for _, id := range c.reg.IDs() {
		row(id)
	}
	for _, s := range settings {
		r := row(s.Behavior)
		r.Paused = s.Paused
		if s.Lease > 0 {
			r.Lease = s.Lease.String()
		}
	}
	for _, n := range nodes {
		for _, b := range n.Behaviors {
			r := row(b)
			r.Nodes = append(r.Nodes, n.ID)
		}
	}
	rows := make([]behaviorRow, 0, len(byID))
	for _, r := range byID {
		rows = append(rows, *r)
	}
	slices.SortFunc(rows, func(a, b behaviorRow) int { return strings.Compare(string(a.Behavior), string(b.Behavior)) })
	return rows, nil
}

// checkRegistered refuses a behavior this program does not register,
// listing those it does.
func (c *cli) checkRegistered(id api.BehaviorID) error {
	if err := spi.CheckBehaviorID(id); err != nil {
		return err
	}
	if _, ok := c.reg.Lookup(id); !ok {
		return &api.InvalidError{Field: "behavior", Err: api.ErrUnknownBehavior,
			Reason: fmt.Sprintf("%q is not registered in %s; known behaviors: %s", id, c.name, c.knownBehaviors())}
	}
	return nil
}

// newGroupsCmd returns `stint groups` and its subcommands.
func (c *cli) newGroupsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "groups",
		Short: "List, hold and release group keys",
		Long: `A group key (a submit's --group, or the one its behavior derives) is the scope of
holds and limits. A held group key's tasks are not claimed on any node until it
is released; running tasks run on.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(c.newGroupsLsCmd(),
		newAdminActionCmd(c, adminAction[string]{noun: "group", verb: "hold", example: "acme",
			short: "Keep the tasks of a group key from being claimed, on every node, until release",
			done: func(prog, key string) string {
				return fmt.Sprintf("held: its tasks wait until '%s groups release %s'", prog, key)
			},
			check: checkGroupKey, act: (*impl.Client).HoldGroup}),
		newAdminActionCmd(c, adminAction[string]{noun: "group", verb: "release", example: "acme",
			short: "Release a held group key: its tasks may be claimed again",
			done:  func(string, string) string { return "released" },
			check: checkGroupKey, act: (*impl.Client).ReleaseGroup}))
	return cmd
}

// newGroupsLsCmd returns `stint groups ls`.
func (c *cli) newGroupsLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the held group keys",
		Args:  exactArgs(0),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the held group keys as JSON")
	return c.withClient(cmd, func(ctx context.Context, client *impl.Client, _ []string) error {
		keys, err := client.HeldGroups(ctx)
		if err != nil {
			return fmt.Errorf("list held groups: %w", c.schemaHint(err))
		}
		if asJSON {
			if keys == nil {
				keys = []string{}
			}
			return writeJSON(c.stdout, struct {
				HeldGroups []string `json:"held_groups"`
			}{keys})
		}
		if len(keys) == 0 {
			fmt.Fprintln(c.stderr, "no group keys held")
			return nil
		}
		tw := newTable(c.stdout)
		fmt.Fprintln(tw, "HELD GROUP KEY")
		for _, k := range keys {
			fmt.Fprintln(tw, k)
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write table: %w", err)
		}
		return nil
	})
}

// checkGroupKey checks the KEY argument of groups hold and release.
func checkGroupKey(key string) error { return spi.CheckGroupKey("KEY", key) }

// adminAction is an operator's action on a behavior or a group key,
// `stint behaviors|groups VERB ARG`.
type adminAction[T ~string] struct {
	// noun names what ARG is: "behavior" or "group".
	noun, verb, short string
	// example is an ARG for the help's example.
	example string
	// done says what was done, after the noun and ARG, for the program
	// prog and ARG quoted for a shell.
	done func(prog, arg string) string
	// check refuses a bad ARG before any database is involved.
	check func(T) error
	act   func(*impl.Client, context.Context, T) error
}

// newAdminActionCmd returns the command of a.
func newAdminActionCmd[T ~string](c *cli, a adminAction[T]) *cobra.Command {
	argName := strings.ToUpper(a.noun)
	if a.noun == "group" {
		argName = "KEY"
	}
	cmd := &cobra.Command{
		Use:     a.verb + " " + argName,
		Short:   a.short,
		Example: fmt.Sprintf("  stint %ss %s %s", a.noun, a.verb, a.example),
		Args:    exactArgs(1, argName),
	}
	cmd.PreRunE = func(_ *cobra.Command, args []string) error { return a.check(T(args[0])) }
	return c.withClient(cmd, func(ctx context.Context, client *impl.Client, args []string) error {
		arg := T(args[0])
		if err := a.act(client, ctx, arg); err != nil {
			// The store's error names the action and its argument.
			return c.schemaHint(err)
		}
		fmt.Fprintf(c.stdout, "%s %s %s\n", a.noun, shellQuote(string(arg)), a.done(c.name, shellQuote(string(arg))))
		return nil
	})
}

// withClient gives cmd --db and makes it run run with a client on that
// database, closed when run returns.
func (c *cli) withClient(cmd *cobra.Command, run func(ctx context.Context, client *impl.Client, args []string) error) *cobra.Command {
	db := addDBFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		client, closeClient, err := c.openClient(cmd.Context(), db)
		if err != nil {
			return err
		}
		defer closeClient()
		return run(cmd.Context(), client, args)
	}
	return cmd
}

// shellQuote returns s as a shell reads it back: as it is when it holds
// nothing a shell would read otherwise, else in single quotes.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._:@+=/,-", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
