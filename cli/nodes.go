package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store/postgres"
)

// newNodesCmd returns `stint nodes` and its subcommands.
func (c *cli) newNodesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "Inspect server nodes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	cmd.AddCommand(c.newNodesLsCmd())
	return cmd
}

// nodeJSON is a node as `stint nodes ls --json` prints it.
type nodeJSON struct {
	api.Node
	// HeartbeatAgeMS is how long ago, by the database's clock, the node
	// last renewed its heartbeat.
	HeartbeatAgeMS int64 `json:"heartbeat_age_ms"`
}

// newNodesLsCmd returns `stint nodes ls`.
func (c *cli) newNodesLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the registered server nodes with the age of their heartbeat",
		Long: `List the registered server nodes, oldest first, with the stint version each
runs, the age of their last heartbeat as measured by the database's clock, and
how the database served it: the incidents going on (unreachable, recovery,
read_only, listener, ...) as the node reported them with its last heartbeat,
else "ok" and the last incident that ended. A node whose heartbeat is much older than its heartbeat interval
(5s by default) has probably died, or cannot reach the database.`,
		Args: exactArgs(0),
	}
	db := addDBFlag(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the nodes as JSON")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
		st, err := c.openStore(ctx, db, postgres.MaxConns(2))
		if err != nil {
			return err
		}
		defer st.Close()
		nodes, err := st.Nodes(ctx)
		if err != nil {
			return fmt.Errorf("list nodes: %w", c.schemaHint(err))
		}
		var now time.Time
		if err := st.Pool().QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			return fmt.Errorf("read the database's clock: %w", err)
		}
		if asJSON {
			out := make([]nodeJSON, len(nodes))
			for i, n := range nodes {
				out[i] = nodeJSON{Node: n, HeartbeatAgeMS: now.Sub(n.HeartbeatAt).Milliseconds()}
			}
			return writeJSON(c.stdout, struct {
				Nodes []nodeJSON `json:"nodes"`
			}{out})
		}
		if len(nodes) == 0 {
			fmt.Fprintln(c.stderr, "no nodes registered")
			return nil
		}
		tw := newTable(c.stdout)
		fmt.Fprintln(tw, "ID\tVERSION\tHOST\tPID\tWORKERS\tBEHAVIORS\tSTARTED\tHEARTBEAT AGE\tDATABASE")
		for _, n := range nodes {
			behaviors := make([]string, len(n.Behaviors))
			for i, b := range n.Behaviors {
				behaviors[i] = string(b)
				if v := n.BehaviorVersions[b]; v > 0 {
					behaviors[i] += "@" + strconv.Itoa(v)
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n",
				n.ID, orDash(n.Version), orDash(n.Host), strconv.Itoa(n.PID), n.MaxWorkers, orDash(strings.Join(behaviors, ",")),
				formatTime(&n.StartedAt), formatAge(now.Sub(n.HeartbeatAt)), databaseState(n, now))
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write table: %w", err)
		}
		return nil
	}
	return cmd
}

// databaseState says how the database served a node, as the node reported
// with its last heartbeat: the incidents going on, each with how long it
// has lasted and its failures, else "ok" and the last incident that ended.
func databaseState(n api.Node, now time.Time) string {
	if len(n.Incidents) > 0 {
		parts := make([]string, len(n.Incidents))
		for i, in := range n.Incidents {
			parts[i] = fmt.Sprintf("%s for %s (%d failures)", in.Cause, formatAge(now.Sub(in.Started)), in.Failures)
		}
		return strings.Join(parts, ", ")
	}
	if l := n.LastIncident; l != nil {
		return fmt.Sprintf("ok · last: %s for %s, %s ago", l.Cause, formatAge(l.Ended.Sub(l.Started)), formatAge(now.Sub(l.Ended)))
	}
	return "ok"
}

// formatAge formats an age for a table: to the tenth of a second under a
// minute, to the second above.
func formatAge(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	if d < time.Minute {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
