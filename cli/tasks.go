package cli

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// Bounds of tasks ls --limit, as api.Filter accepts them.
const (
	defaultListLimit = 100
	maxListLimit     = 1000
)

// newTasksCmd returns `stint tasks` and its subcommands.
func (c *cli) newTasksCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tasks",
		Short: "Inspect and steer tasks",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	cmd.AddCommand(c.newTasksLsCmd(), c.newTasksShowCmd())
	cmd.AddCommand(c.newTaskActionCmds()...)
	cmd.AddCommand(c.newTaskStepCmds()...)
	cmd.AddCommand(c.newTasksWaitCmd())
	return cmd
}

// tasksLsOptions are the flags of stint tasks ls.
type tasksLsOptions struct {
	db       *dbFlag
	behavior string
	status   string
	parent   string
	group    string
	after    string
	limit    int
	json     bool
}

// newTasksLsCmd returns `stint tasks ls`.
func (c *cli) newTasksLsCmd() *cobra.Command {
	o := &tasksLsOptions{}
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List tasks, a page at a time, in id order",
		Long: `List the tasks matching the filters in id order, a page at a time. When more
tasks match, the last line names the cursor to pass as --after for the next page
(with --json, the "next" field).`,
		Example: `  stint tasks ls --behavior demo.echo --status failure
  stint tasks ls --limit 500 --after greeting-1`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.runTasksLs(cmd, o)
		},
	}
	o.db = addDBFlag(cmd)
	addReadDBFlag(cmd, o.db)
	f := cmd.Flags()
	f.StringVar(&o.behavior, "behavior", "", "only tasks of this behavior")
	f.StringVar(&o.status, "status", "", "only tasks in this state: "+orList(api.Statuses()))
	f.StringVar(&o.parent, "parent", "", "only children of this task")
	f.StringVar(&o.group, "group", "", "only tasks with this group key")
	f.StringVar(&o.after, "after", "", "cursor: only tasks after this id (the previous page's next)")
	f.IntVar(&o.limit, "limit", defaultListLimit, "page size, 1 to "+strconv.Itoa(maxListLimit))
	f.BoolVar(&o.json, "json", false, "print the page as JSON")
	return cmd
}

// runTasksLs implements `stint tasks ls`.
func (c *cli) runTasksLs(cmd *cobra.Command, o *tasksLsOptions) error {
	ctx := cmd.Context()
	if o.limit < 1 || o.limit > maxListLimit {
		return usageErrorf("--limit %d is outside 1..%d", o.limit, maxListLimit)
	}
	status := api.Status(o.status)
	if status != "" && !status.Valid() {
		return usageErrorf("--status %q is not a task state: want %s", o.status, orList(api.Statuses()))
	}
	client, closeClient, err := c.openClient(ctx, o.db)
	if err != nil {
		return err
	}
	defer closeClient()

	page, err := client.List(ctx, api.Filter{
		Behavior: api.BehaviorID(o.behavior),
		Status:   status,
		ParentID: api.TaskID(o.parent),
		GroupKey: o.group,
		After:    api.TaskID(o.after),
		Limit:    o.limit,
		// The table prints no params, result nor progress: they are not
		// read. --json prints the tasks whole.
		Brief: !o.json,
	})
	if err != nil {
		return fmt.Errorf("list tasks: %w", c.schemaHint(err))
	}
	c.reg.RedactTasks(page.Tasks) // no password is ever printed
	if o.json {
		if page.Tasks == nil {
			page.Tasks = []api.Task{}
		}
		return writeJSON(c.stdout, page)
	}
	if len(page.Tasks) == 0 {
		fmt.Fprintln(c.stderr, "no tasks match")
		return nil
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "ID\tBEHAVIOR\tSTATUS\tPRIORITY\tATTEMPT\tNODE\tUPDATED")
	for _, t := range page.Tasks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n",
			t.ID, t.Behavior, shortStatus(t), t.Priority, t.Attempt, orDash(t.Node), formatTime(&t.UpdatedAt))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	if page.Next != "" {
		fmt.Fprintf(c.stdout, "next: %s (more tasks match: pass --after %s)\n", page.Next, page.Next)
	}
	return nil
}

// newTasksShowCmd returns `stint tasks show`.
func (c *cli) newTasksShowCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show every field of a task",
		Args:  exactArgs(1, "ID"),
	}
	db := addDBFlag(cmd)
	addReadDBFlag(cmd, db)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the task as JSON")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		id := api.TaskID(args[0])
		if err := spi.CheckTaskID("id", id); err != nil {
			return err
		}
		client, closeClient, err := c.openClient(ctx, db)
		if err != nil {
			return err
		}
		defer closeClient()
		t, err := client.Get(ctx, id)
		if errors.Is(err, api.ErrNotFound) {
			return fmt.Errorf("task %s not found", id)
		}
		if err != nil {
			return fmt.Errorf("get task %s: %w", id, c.schemaHint(err))
		}
		c.reg.RedactTask(&t) // no password is ever printed
		if asJSON {
			return writeJSON(c.stdout, t)
		}
		return c.printTask(t)
	}
	return cmd
}

// printTask prints every field of t, its JSON fields indented.
func (c *cli) printTask(t api.Task) error {
	tw := newTable(c.stdout)
	row := func(name, value string) { fmt.Fprintf(tw, "%s:\t%s\n", name, value) }
	row("id", string(t.ID))
	row("behavior", string(t.Behavior))
	if t.Version > 0 {
		row("version", strconv.Itoa(t.Version))
	}
	row("status", c.statusText(t))
	row("finished", strconv.FormatBool(t.Finished()))
	row("priority", strconv.Itoa(t.Priority))
	row("attempt", strconv.Itoa(t.Attempt))
	row("errors", strconv.Itoa(t.Errors))
	row("node", orDash(t.Node))
	row("lease", orDash(t.Lease))
	row("due", formatTime(t.ScheduleNotBefore))
	row("lease expires", formatTime(t.LostNotBefore))
	row("resubmit", strconv.FormatBool(t.Resubmit))
	row("parent", orDash(string(t.ParentID)))
	row("group", orDash(t.GroupKey))
	row("trace", orDash(t.Trace))
	row("created", formatTime(&t.CreatedAt))
	row("updated", formatTime(&t.UpdatedAt))
	row("executed", formatTime(t.ExecutedAt))
	row("finished at", formatTime(t.FinishedAt))
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write task: %w", err)
	}
	var errJSON []byte
	if t.Error != nil {
		raw, err := jsonMarshal(t.Error)
		if err != nil {
			return err
		}
		errJSON = raw
	}
	for _, f := range []struct {
		name string
		raw  []byte
	}{
		{"params", t.Params},
		{"result", t.Result},
		{"error", errJSON},
		{"progress", t.Progress},
	} {
		fmt.Fprintf(c.stdout, "%s: %s\n", f.name, prettyJSON(f.raw, ""))
	}
	if err := c.printSteps(t.Steps); err != nil {
		return err
	}
	signals := make([][]string, len(t.Signals))
	for i, s := range t.Signals {
		signals[i] = []string{s.Topic, "key " + orDash(s.Key), formatTime(&s.At), compactJSON(s.Payload)}
	}
	if err := c.printSection("signals (not consumed yet, oldest first)", signals); err != nil {
		return err
	}
	events := make([][]string, len(t.Events))
	for i, e := range t.Events {
		events[i] = []string{e.Key, formatTime(&e.At), compactJSON(e.Value)}
	}
	return c.printSection("events", events)
}

// orList lists words for a message: "a, b or c".
func orList[S ~string](words []S) string {
	if len(words) == 0 {
		return ""
	}
	out := make([]string, len(words))
	for i, w := range words {
		out[i] = string(w)
	}
	if len(out) == 1 {
		return out[0]
	}
	return strings.Join(out[:len(out)-1], ", ") + " or " + out[len(out)-1]
}

// shortStatus is t's status for a table column: "retrying" for a task
// whose last run failed and that runs again, "waiting (rate limit L)" or
// "waiting (concurrency cap)" for a due task a limit holds back, "waiting
// (signal TOPIC)" for a task asleep until a signal comes, else its status.
func shortStatus(t api.Task) string {
	switch {
	case t.Retrying():
		return "retrying"
	case t.Waiting != nil && t.Waiting.Reason == api.WaitRateLimit:
		return "waiting (rate limit " + t.Waiting.Limit + ")"
	case t.Waiting != nil && t.Waiting.Reason == api.WaitDependencies:
		return "waiting (dependencies)"
	case t.Waiting != nil && t.Waiting.Reason == api.WaitSignal:
		return "waiting (signal " + t.Waiting.Key + ")"
	case t.Waiting != nil && t.Waiting.Reason == api.WaitConcurrency:
		return "waiting (concurrency cap)"
	case t.Waiting != nil && t.Waiting.Reason == api.WaitNoNode && t.Waiting.Version > 0:
		return fmt.Sprintf("waiting (a node of version %d)", t.Waiting.Version)
	case t.Waiting != nil:
		return "waiting (" + strings.ReplaceAll(t.Waiting.Reason, "_", " ") + ")"
	}
	return string(t.Status)
}

// waitText says what a waiting task waits on: "waiting on rate limit L
// (key K) until T", "waiting for signal TOPIC", "waiting on the
// concurrency cap of B (key K)",
// "waiting: B is paused", "waiting: no live node runs B (node-a runs
// ...)", "waiting for a node of a newer release: ..." or "waiting: every
// node that runs B is full (node-a runs 8 of 8)"; a reason this release
// does not know is named as it is.
func waitText(w *api.Wait) string {
	var b strings.Builder
	switch w.Reason {
	case api.WaitDependencies:
		return "waiting for its workflow dependencies " + strings.Join(w.Dependencies, ", ")
	case api.WaitSignal:
		return "waiting for signal " + w.Key
	case api.WaitRateLimit:
		fmt.Fprintf(&b, "waiting on rate limit %s", w.Limit)
	case api.WaitPaused:
		fmt.Fprintf(&b, "waiting: %s is paused", w.Limit)
	case api.WaitGroupHeld:
		return "waiting: its group " + w.Key + " is held"
	case api.WaitNoNode:
		if w.Version > 0 {
			return "waiting for a node of a newer release: " + w.Detail
		}
		fmt.Fprintf(&b, "waiting: no live node runs %s (%s)", w.Limit, w.Detail)
	case api.WaitNodesFull:
		fmt.Fprintf(&b, "waiting: every node that runs %s is full (%s)", w.Limit, w.Detail)
	case api.WaitConcurrency:
		fmt.Fprintf(&b, "waiting on the concurrency cap of %s", w.Limit)
	default:
		fmt.Fprintf(&b, "waiting (%s)", strings.ReplaceAll(w.Reason, "_", " "))
	}
	if w.Key != "" {
		fmt.Fprintf(&b, " (key %s)", w.Key)
	}
	if w.Until != nil {
		fmt.Fprintf(&b, " until %s", formatTime(w.Until))
	}
	return b.String()
}

// statusText describes t's status: a task whose last run failed and that
// runs again as "retrying (attempt n of m, next at t): error", apart from a
// final failure; a due task a limit holds back as "scheduled, waiting on
// ..." (see waitText).
func (c *cli) statusText(t api.Task) string {
	if t.Waiting != nil && !t.Retrying() {
		return string(t.Status) + ", " + waitText(t.Waiting)
	}
	if !t.Retrying() {
		return string(t.Status)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "retrying (attempt %d", t.Attempt)
	if reg, ok := c.reg.Lookup(t.Behavior); ok && reg.MaxAttempts() > 0 {
		fmt.Fprintf(&b, " of %d", reg.MaxAttempts())
	}
	fmt.Fprintf(&b, ", next at %s)", formatTime(t.ScheduleNotBefore))
	if t.Error != nil {
		fmt.Fprintf(&b, ": %s", t.Error.Error())
	}
	return b.String()
}
