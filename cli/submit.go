package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// submitOptions are the flags of stint submit.
type submitOptions struct {
	db       *dbFlag
	params   string
	id       string
	priority int
	delay    time.Duration
	keep     time.Duration
	debounce time.Duration
	maxWait  time.Duration
	group    string
	wait     bool
	timeout  time.Duration
	json     bool
}

// newSubmitCmd returns `stint submit`.
func (c *cli) newSubmitCmd() *cobra.Command {
	o := &submitOptions{}
	cmd := &cobra.Command{
		Use:   "submit BEHAVIOR --params JSON|@FILE",
		Short: "Submit a task, optionally waiting for its result",
		Long: `Submit a task of BEHAVIOR with the given params and print its id and whether
it was created (a submit of an existing id merges into that task).

The params are JSON, given inline, as @FILE to read them from a file, or as @-
to read them from standard input. Bad input (malformed JSON, an unknown
behavior, params the behavior rejects, a bad id) is reported naming the
offending field, stores nothing, and exits with code 2.

With --debounce WINDOW --debounce-max MAXWAIT, submits of the same id within
the window make one run, due a window after the last of them (its params win),
but never later than MAXWAIT after the first: see docs/debounce.md. The id
must repeat: give --id, or a behavior that derives it from the params.

With --wait, stint waits until the task has finished, showing its progress on
standard error, and prints its result or error; it exits with code 1 if the
task failed. Ctrl-C stops waiting (exit code 130); the task runs on. With --json, the submission is printed as one line of JSON and,
with --wait, the finished task as a second line.`,
		Example: `  stint submit demo.echo --params '{"text":"hi"}' --wait
  stint submit demo.echo --params @params.json --id greeting-1 --delay 1m
  stint submit demo.echo --params '{"text":"hi"}' --id greeting-2 --debounce 5s --debounce-max 1m`,
		Args: exactArgs(1, "BEHAVIOR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.runSubmit(cmd, o, args[0])
		},
	}
	o.db = addDBFlag(cmd)
	addReadDBFlag(cmd, o.db)
	f := cmd.Flags()
	f.StringVar(&o.params, "params", "", "params as JSON, @FILE or @- for standard input (default {})")
	f.StringVar(&o.id, "id", "", "task id instead of the one the behavior derives from the params")
	f.IntVar(&o.priority, "priority", 0, "priority from 0 to 32767, lower runs first (default: the behavior's)")
	f.DurationVar(&o.delay, "delay", 0, "postpone the first run by this long, e.g. 30s or 5m")
	f.DurationVar(&o.keep, "retention", 0, "keep the task this long after it finished for good, e.g. 24h (default: the behavior's retention)")
	f.StringVar(&o.group, "group", "", "group key, the scope of holds and limits")
	f.DurationVar(&o.debounce, "debounce", 0, "debounce with the other submits of the id: run a window this long after the last one, e.g. 5s (needs --debounce-max)")
	f.DurationVar(&o.maxWait, "debounce-max", 0, "with --debounce, run at most this long after the first submit of a stream, e.g. 1m")
	f.BoolVar(&o.wait, "wait", false, "wait for the task to finish and print its result")
	f.DurationVar(&o.timeout, "timeout", 0, "with --wait, give up waiting after this long (0 waits until interrupted)")
	f.BoolVar(&o.json, "json", false, "print JSON")
	return cmd
}

// runSubmit implements `stint submit`.
func (c *cli) runSubmit(cmd *cobra.Command, o *submitOptions, behavior string) error {
	ctx := cmd.Context()
	req := api.SubmitRequest{
		Behavior:  api.BehaviorID(behavior),
		ID:        api.TaskID(o.id),
		Delay:     o.delay,
		Retention: o.keep,
		GroupKey:  o.group,
		Notify:    o.wait,
	}
	if cmd.Flags().Changed("priority") {
		if o.priority < 0 || o.priority > 32767 {
			return usageErrorf("--priority %d is outside 0..32767", o.priority)
		}
		p := o.priority
		req.Priority = &p
	}
	if o.delay < 0 {
		return usageErrorf("--delay %s is negative", o.delay)
	}
	if o.keep < 0 {
		return usageErrorf("--retention %s is negative", o.keep)
	}
	if o.timeout < 0 {
		return usageErrorf("--timeout %s is negative", o.timeout)
	}
	if o.timeout > 0 && !o.wait {
		return usageErrorf("--timeout needs --wait")
	}
	switch debounce, maxWait := cmd.Flags().Changed("debounce"), cmd.Flags().Changed("debounce-max"); {
	case debounce && !maxWait:
		return usageErrorf("--debounce needs --debounce-max, the longest a stream of submits may postpone the task")
	case maxWait && !debounce:
		return usageErrorf("--debounce-max needs --debounce")
	case debounce:
		req.Debounce = &api.Debounce{Window: o.debounce, MaxWait: o.maxWait}
	}
	params, err := readParams(o.params, cmd.InOrStdin())
	if err != nil {
		return err
	}
	req.Params = params
	if err := c.precheck(req); err != nil {
		return err
	}

	client, closeClient, err := c.openClient(ctx, o.db)
	if err != nil {
		return err
	}
	defer closeClient()

	sub, err := client.Submit(ctx, req)
	if err != nil {
		return c.schemaHint(err)
	}
	if o.json {
		if err := writeJSONLine(c.stdout, sub); err != nil {
			return err
		}
	} else {
		what := "created"
		if !sub.Created {
			what = "exists; the submit was merged into it"
		}
		fmt.Fprintf(c.stdout, "task %s: %s (status %s)\n", sub.ID, what, sub.Status)
	}
	if !o.wait {
		return nil
	}

	return c.waitAndPrint(ctx, client, sub.ID, o)
}

// waitAndPrint awaits task id for `submit --wait`, showing its progress,
// and prints how it ended. A task that failed is exit code 1.
func (c *cli) waitAndPrint(ctx context.Context, tasks api.Tasks, id api.TaskID, o *submitOptions) error {
	waitCtx := ctx
	if o.timeout > 0 {
		var cancel context.CancelFunc
		waitCtx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	task, err := c.awaitWithProgress(waitCtx, tasks, id)
	if err != nil {
		return c.waitEnded(ctx, awaited{what: "task", id: id, show: "tasks", submitted: true}, o.timeout, err)
	}
	if o.json {
		c.reg.RedactTask(&task)
		if err := writeJSONLine(c.stdout, task); err != nil {
			return err
		}
	} else {
		printOutcome(c.stdout, task)
	}
	if task.Status == api.StatusFailure {
		return silentExit(exitFailure)
	}
	return nil
}

// readParams returns the JSON params given by the --params flag value s:
// inline JSON, @FILE, or @- for r. Empty s means no params.
func readParams(s string, r io.Reader) (json.RawMessage, error) {
	return readJSON("params", "--params", s, r)
}

// readJSON returns the JSON value of field given as s by source (a flag
// or an argument): inline JSON, @FILE, or @- for r. Empty s means none.
// Malformed JSON is an *api.InvalidError naming field.
func readJSON(field, source, s string, r io.Reader) (json.RawMessage, error) {
	if s == "" {
		return nil, nil
	}
	raw, from := []byte(s), source
	if name, ok := strings.CutPrefix(s, "@"); ok {
		var err error
		if name == "-" {
			raw, err = io.ReadAll(r)
			from = "standard input"
		} else {
			raw, err = os.ReadFile(name)
			from = name
		}
		if err != nil {
			return nil, usageErrorf("%s %s: cannot read the %s: %w", source, s, field, err)
		}
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, api.Invalid(field, "malformed JSON in %s: %v", from, err)
	}
	return raw, nil
}

// precheck validates the behavior, params and id of req before any
// database is involved, so that bad input is reported even when the
// database cannot be reached. The client validates everything again.
func (c *cli) precheck(req api.SubmitRequest) error {
	reg, ok := c.reg.Lookup(req.Behavior)
	if !ok {
		if err := spi.CheckBehaviorID(req.Behavior); err != nil {
			return err
		}
		return &api.InvalidError{Field: "behavior", Err: api.ErrUnknownBehavior,
			Reason: fmt.Sprintf("%q is not registered; known behaviors: %s", req.Behavior, c.knownBehaviors())}
	}
	if _, err := reg.Decode(req.Params); err != nil {
		return err
	}
	if req.ID != "" {
		if err := spi.CheckTaskID("id", req.ID); err != nil {
			return err
		}
	}
	return nil
}

// knownBehaviors lists the registered behaviors for error messages.
func (c *cli) knownBehaviors() string {
	ids := c.reg.IDs()
	names := make([]string, len(ids))
	for i, id := range ids {
		names[i] = string(id)
	}
	return strings.Join(names, ", ")
}

// awaitWithProgress awaits task id, reporting its progress on c.stderr
// until it has finished.
func (c *cli) awaitWithProgress(ctx context.Context, tasks api.Tasks, id api.TaskID) (api.Task, error) {
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.showProgress(pctx, tasks, id)
	}()
	task, err := tasks.Await(ctx, id)
	cancel()
	<-done
	return task, err
}

// showProgress reports the state of task id on c.stderr every second until
// ctx ends. On a terminal it keeps one line up to date; elsewhere it prints
// a line whenever the state changes.
func (c *cli) showProgress(ctx context.Context, tasks api.Tasks, id api.TaskID) {
	terminal := isTerminal(c.stderr)
	start := time.Now()
	var last string
	drawn := false
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		task, err := tasks.Get(ctx, id)
		if err == nil && !task.Finished() {
			line := c.progressLine(task)
			switch {
			case terminal:
				fmt.Fprintf(c.stderr, "\r\033[K%s [%s]", line, time.Since(start).Round(time.Second))
				drawn = true
			case line != last:
				fmt.Fprintln(c.stderr, line)
			}
			last = line
		}
		select {
		case <-ctx.Done():
			if drawn {
				fmt.Fprint(c.stderr, "\r\033[K")
			}
			return
		case <-tick.C:
		}
	}
}

// progressLine describes a task that has not finished yet.
func (c *cli) progressLine(t api.Task) string {
	var b strings.Builder
	fmt.Fprintf(&b, "waiting for task %s: ", t.ID)
	if t.Retrying() {
		b.WriteString(c.statusText(t))
		return b.String()
	}
	b.WriteString(string(t.Status))
	if t.Attempt > 0 {
		fmt.Fprintf(&b, ", attempt %d", t.Attempt)
	}
	if t.Status == api.StatusRunning && t.Node != "" {
		fmt.Fprintf(&b, " on %s", t.Node)
	}
	if t.Errors > 0 {
		fmt.Fprintf(&b, ", %d consecutive errors", t.Errors)
	}
	if t.Status != api.StatusRunning && t.ScheduleNotBefore != nil && t.ScheduleNotBefore.After(time.Now()) {
		fmt.Fprintf(&b, ", due %s", formatTime(t.ScheduleNotBefore))
	}
	if t.Waiting != nil {
		b.WriteString(", " + waitText(t.Waiting))
	}
	return b.String()
}

// printOutcome prints a finished task's status and its result or error.
func printOutcome(w io.Writer, t api.Task) {
	fmt.Fprintf(w, "task %s: %s", t.ID, t.Status)
	if t.Attempt > 0 {
		fmt.Fprintf(w, " (attempt %d", t.Attempt)
		if t.Node != "" {
			fmt.Fprintf(w, " on %s", t.Node)
		}
		fmt.Fprint(w, ")")
	}
	fmt.Fprintln(w)
	switch t.Status {
	case api.StatusSuccess:
		fmt.Fprintf(w, "result: %s\n", prettyJSON(t.Result, ""))
	case api.StatusFailure:
		if t.Error == nil {
			fmt.Fprintln(w, "error: (none recorded)")
			return
		}
		fmt.Fprintf(w, "error: %s\n", t.Error.Error())
		if len(t.Error.Properties) > 0 {
			raw, err := json.Marshal(t.Error.Properties)
			if err == nil {
				fmt.Fprintf(w, "details: %s\n", prettyJSON(raw, ""))
			}
		}
	}
}

// writeJSONLine writes v to w as one line of JSON.
func writeJSONLine(w io.Writer, v any) error {
	if err := json.NewEncoder(w).Encode(v); err != nil {
		return fmt.Errorf("write JSON: %w", err)
	}
	return nil
}

// exactArgs returns a cobra.PositionalArgs that wants exactly n arguments,
// named by names in its error message: "stint submit: missing BEHAVIOR",
// "stint submit takes one argument, BEHAVIOR, not 2: ...".
func exactArgs(n int, names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) == n:
			return nil
		case n == 0:
			return usageErrorf("%s takes no arguments, got %s", cmd.CommandPath(), quoteArgs(args))
		case len(args) < n:
			return usageErrorf("%s: missing %s", cmd.CommandPath(), strings.Join(names[len(args):], " "))
		case n == 1:
			return usageErrorf("%s takes one argument, %s, not %d: %s", cmd.CommandPath(), names[0], len(args), quoteArgs(args))
		}
		return usageErrorf("%s takes %d arguments, %s, not %d: %s", cmd.CommandPath(), n, strings.Join(names, " "), len(args), quoteArgs(args))
	}
}

// quoteArgs writes command-line arguments for a message: each quoted, and
// separated by spaces.
func quoteArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = strconv.Quote(a)
	}
	return strings.Join(q, " ")
}
