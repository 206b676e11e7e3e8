package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/ingest"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

// openIngestAdmin opens the store, a client and the ingest admin actions on
// the database db names. close releases them.
func (c *cli) openIngestAdmin(ctx context.Context, db *dbFlag) (*ingest.Admin, *impl.Client, func(), error) {
	st, err := c.openStore(ctx, db, postgres.MaxConns(4))
	if err != nil {
		return nil, nil, nil, err
	}
	client, err := impl.NewClient(st, impl.ClientConfig{Registry: c.reg, Logger: c.log})
	if err != nil {
		st.Close()
		return nil, nil, nil, fmt.Errorf("create client: %w", err)
	}
	return ingest.NewAdmin(client), client, func() { client.Close(); st.Close() }, nil
}

// ingestError words an admin error for the command line.
func (c *cli) ingestError(verb string, id string, err error) error {
	if errors.Is(err, api.ErrNotFound) {
		return fmt.Errorf("%s %s: not found", verb, id)
	}
	if errors.Is(err, api.ErrConflict) {
		// The sentinels' words ("task state does not allow this: illegal
		// state transition") add nothing to the reason that follows them.
		msg := err.Error()
		for _, sentinel := range []error{api.ErrConflict, ingest.ErrIllegalTransition} {
			msg = strings.ReplaceAll(msg, sentinel.Error()+": ", "")
		}
		if !strings.HasPrefix(msg, verb+" ") { // else it names the action and id itself
			msg = fmt.Sprintf("%s %s: %s", verb, id, msg)
		}
		return &exitError{code: exitFailure, err: errors.New(msg)}
	}
	return fmt.Errorf("%s %s: %w", verb, id, c.schemaHint(err))
}

// newIngestCmd returns `stint ingest` and its subcommands.
func (c *cli) newIngestCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ingest",
		Short: "Submit ingest batches and steer the ingest queue",
		Long: `Submit ingest batches (the Merritt workflow: a batch spawns one job per object;
each job runs Estimating, Provisioning, Downloading, Processing, Storing,
Recording and Notify) and act on the queue as an operator.

A server runs the ingest behaviors with its working directories in
$` + envIngestDir + `/work and its object storage in $` + envIngestDir + `/storage
(default: the system's temporary directory), and the profiles' callback URLs
from the JSON file $` + envIngestProfiles + `
({"PROFILE": {"callback_url": "...", "notify": ["depositor@example.org"]}}).
With $` + envIngestSMTP + ` (smtp://[user:password@]host:port?from=ADDRESS) set,
a profile's notify addresses get a mail when a batch is queued and one with
its report; a failed mail is logged and shown in the batch, never fails it.
Estimating lowers the priority of a job of $` + envIngestLargeBytes + ` bytes
or more (default 1000000000; negative: off) to $` + envIngestLargePriority + `
(default 10). A job deposited again under a local id gets the identifier
stored for it; a manifest that names another fails the job.
See 'stint batches' to inspect batches.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(c.newIngestSubmitCmd())
	cmd.AddCommand(c.newIngestActionCmds()...)
	cmd.AddCommand(c.newIngestQueueCmds()...)
	return cmd
}

// newIngestActionCmds returns the operator actions of `stint ingest` on
// one collection, batch or job.
func (c *cli) newIngestActionCmds() []*cobra.Command {
	type action struct {
		use, arg, short, done string
		do                    func(context.Context, *ingest.Admin, string) (string, error)
	}
	actions := []action{
		{"hold-collection", "PROFILE", "Hold a collection: its pending batches and jobs are not picked up", "held",
			func(ctx context.Context, a *ingest.Admin, p string) (string, error) {
				return "", a.HoldCollection(ctx, p)
			}},
		{"release-collection", "PROFILE", "Release a collection hold", "released",
			func(ctx context.Context, a *ingest.Admin, p string) (string, error) {
				return "", a.ReleaseCollection(ctx, p)
			}},
		{"requeue", "ID", "Requeue a Failed job at the successor of its last successful state, or every Failed job of a batch; the batch reports again", "requeued",
			func(ctx context.Context, a *ingest.Admin, id string) (string, error) {
				ids, err := a.Requeue(ctx, api.TaskID(id))
				if err != nil || len(ids) == 1 && ids[0] == api.TaskID(id) {
					return "", err
				}
				return fmt.Sprintf(" (%d failed jobs requeued; the batch reports again)", len(ids)), nil
			}},
		{"fail", "JOB", "Send a waiting job to Failed (it fails when next picked up)", "failed",
			func(ctx context.Context, a *ingest.Admin, id string) (string, error) {
				return "", a.Fail(ctx, api.TaskID(id))
			}},
		{"delete", "ID", "Delete a Held, Failed or Completed job, or such a batch with its jobs", "deleted",
			func(ctx context.Context, a *ingest.Admin, id string) (string, error) {
				return "", a.Delete(ctx, api.TaskID(id))
			}},
		{"hold", "ID", "Hold a Pending job or batch", "held",
			func(ctx context.Context, a *ingest.Admin, id string) (string, error) {
				return "", a.Hold(ctx, api.TaskID(id))
			}},
		{"release", "ID", "Release a held job or batch (Held -> Pending)", "released",
			func(ctx context.Context, a *ingest.Admin, id string) (string, error) {
				return "", a.Release(ctx, api.TaskID(id))
			}},
	}
	var cmds []*cobra.Command
	for _, a := range actions {
		sub := &cobra.Command{Use: a.use + " " + a.arg, Short: a.short, Args: exactArgs(1, a.arg)}
		db := addDBFlag(sub)
		sub.RunE = func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if a.arg != "PROFILE" {
				if err := spi.CheckTaskID("id", api.TaskID(args[0])); err != nil {
					return err
				}
			}
			admin, _, closeAdmin, err := c.openIngestAdmin(ctx, db)
			if err != nil {
				return err
			}
			defer closeAdmin()
			more, err := a.do(ctx, admin, args[0])
			if err != nil {
				return c.ingestError(a.use, args[0], err)
			}
			fmt.Fprintf(c.stdout, "%s %s%s\n", args[0], a.done, more)
			return nil
		}
		cmds = append(cmds, sub)
	}
	return cmds
}

// newIngestQueueCmds returns `stint ingest pause` and `resume`.
func (c *cli) newIngestQueueCmds() []*cobra.Command {
	var cmds []*cobra.Command
	for _, pause := range []bool{true, false} {
		use, short, done := "pause", "Pause the ingest queue: nothing new is picked up", "paused"
		if !pause {
			use, short, done = "resume", "Resume the ingest queue", "resumed"
		}
		sub := &cobra.Command{Use: use, Short: short, Args: exactArgs(0)}
		db := addDBFlag(sub)
		sub.RunE = func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			admin, _, closeAdmin, err := c.openIngestAdmin(ctx, db)
			if err != nil {
				return err
			}
			defer closeAdmin()
			if pause {
				err = admin.PauseQueue(ctx)
			} else {
				err = admin.ResumeQueue(ctx)
			}
			if err != nil {
				return fmt.Errorf("%s the ingest queue: %w", use, c.schemaHint(err))
			}
			fmt.Fprintf(c.stdout, "ingest queue %s\n", done)
			return nil
		}
		cmds = append(cmds, sub)
	}
	return cmds
}

// ingestSubmitOptions are the flags of stint ingest submit.
type ingestSubmitOptions struct {
	db        *dbFlag
	profile   string
	submitter string
	manifest  string
	url       string
	title     string
	creator   string
	date      string
	priority  int
	wait      bool
	json      bool
}

// newIngestSubmitCmd returns `stint ingest submit`.
func (c *cli) newIngestSubmitCmd() *cobra.Command {
	o := &ingestSubmitOptions{}
	cmd := &cobra.Command{
		Use:   "submit --profile P --submitter S (--manifest FILE | --url URL)",
		Short: "Submit an ingest batch",
		Long: `Submit an ingest batch: one file (--url) or a checkm-style manifest (--manifest
FILE, or - for standard input), one file a line:

  URL | digest algorithm | digest | size | file name | local id | primary id

Files with the same local id form one object. URLs are http, https or file;
digests md5, sha1, sha256 or sha512. A bad manifest is refused, naming the
line, and nothing is stored (exit code 2). With --wait, stint waits for the
batch's report.`,
		Example: `  stint ingest submit --profile demo --submitter me --manifest objects.checkm --wait`,
		Args:    exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.runIngestSubmit(cmd, o)
		},
	}
	o.db = addDBFlag(cmd)
	f := cmd.Flags()
	f.StringVar(&o.profile, "profile", "", "profile (collection) of the batch")
	f.StringVar(&o.submitter, "submitter", "", "the depositor")
	f.StringVar(&o.manifest, "manifest", "", "manifest file, or - for standard input")
	f.StringVar(&o.url, "url", "", "a single file to ingest as one object")
	f.StringVar(&o.title, "title", "", "title of the objects (ERC what)")
	f.StringVar(&o.creator, "creator", "", "creator of the objects (ERC who)")
	f.StringVar(&o.date, "date", "", "date of the objects (ERC when)")
	f.IntVar(&o.priority, "priority", 0, "priority of the jobs, 0 to 32767, lower first (default 5)")
	f.BoolVar(&o.wait, "wait", false, "wait for the batch's report")
	f.BoolVar(&o.json, "json", false, "print JSON")
	return cmd
}

// runIngestSubmit implements `stint ingest submit`.
func (c *cli) runIngestSubmit(cmd *cobra.Command, o *ingestSubmitOptions) error {
	ctx := cmd.Context()
	p := ingest.BatchParams{Submitter: o.submitter, Profile: o.profile, PayloadURL: o.url,
		Title: o.title, Creator: o.creator, Date: o.date}
	if o.manifest != "" {
		var raw []byte
		var err error
		if o.manifest == "-" {
			raw, err = io.ReadAll(cmd.InOrStdin())
		} else {
			raw, err = os.ReadFile(o.manifest)
		}
		if err != nil {
			return usageErrorf("--manifest %s: %w", o.manifest, err)
		}
		p.Manifest = string(raw)
	}
	if cmd.Flags().Changed("priority") {
		p.Priority = &o.priority
	}
	// Check the batch before any database is involved.
	raw, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("encode the batch: %w", err)
	}
	if err := c.precheck(api.SubmitRequest{Behavior: ingest.BatchBehavior, Params: raw}); err != nil {
		return ingestInputError(err)
	}
	client, closeClient, err := c.openClient(ctx, o.db)
	if err != nil {
		return err
	}
	defer closeClient()
	f, err := ingest.SubmitBatch(ctx, client, p)
	if err != nil {
		return c.schemaHint(err)
	}
	if o.json {
		if err := writeJSONLine(c.stdout, f.Submission()); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(c.stdout, "batch %s submitted: %d objects, profile %s\n", f.ID(), len(mustObjects(raw)), p.Profile)
	}
	if !o.wait {
		return nil
	}
	t, err := c.awaitWithProgress(ctx, client, f.ID())
	if err != nil {
		return c.waitEnded(ctx, awaited{what: "batch", id: f.ID(), show: "batches", submitted: true}, 0, err)
	}
	if o.json {
		c.reg.RedactTask(&t)
		if err := writeJSONLine(c.stdout, t); err != nil {
			return err
		}
	} else {
		printOutcome(c.stdout, t)
	}
	if t.Status != api.StatusSuccess {
		if !o.json {
			c.printFailedJobs(ctx, client, t.ID)
		}
		return silentExit(exitFailure)
	}
	return nil
}

// shownFailedJobs is how many failed jobs a failed batch's outcome lists.
const shownFailedJobs = 5

// printFailedJobs prints the errors of the first failed jobs of batch id
// and where to see the rest.
func (c *cli) printFailedJobs(ctx context.Context, tasks api.Tasks, id api.TaskID) {
	page, err := tasks.List(ctx, api.Filter{ParentID: id, Status: api.StatusFailure, Limit: shownFailedJobs + 1})
	if err != nil {
		c.log.Warn(c.name+": cannot list the failed jobs", "batch", id, "err", err)
	}
	for i, j := range page.Tasks {
		if i == shownFailedJobs {
			fmt.Fprintln(c.stdout, "  ...")
			break
		}
		msg := "(no error recorded)"
		if j.Error != nil {
			msg = j.Error.Error()
		}
		fmt.Fprintf(c.stdout, "  job %s: %s\n", j.ID, msg)
	}
	fmt.Fprintf(c.stdout, "see every job: %s batches show %s\n", c.name, id)
}

// ingestFlags are the flags of ingest submit by the batch params' fields.
var ingestFlags = map[string]string{
	"payload_url": "--url", "manifest": "--manifest", "profile": "--profile", "submitter": "--submitter",
	"title": "--title", "creator": "--creator", "date": "--date", "priority": "--priority",
}

// ingestFieldWord matches a field name of the batch params in a message.
var ingestFieldWord = regexp.MustCompile(`\b(payload_url|manifest|profile|submitter|title|creator|date|priority)\b`)

// ingestInputError words an error about the batch params in the terms of
// the command line: it names the flags, not the JSON fields they fill.
func ingestInputError(err error) error {
	var ie *api.InvalidError
	if !errors.As(err, &ie) {
		return err
	}
	if flag, ok := ingestFlags[strings.TrimPrefix(ie.Field, "params.")]; ok {
		return &api.InvalidError{Field: flag, Reason: ie.Reason, Err: ie.Err}
	}
	reason := ingestFieldWord.ReplaceAllStringFunc(ie.Reason, func(name string) string { return ingestFlags[name] })
	return &api.InvalidError{Field: "batch", Reason: reason, Err: ie.Err}
}

// mustObjects returns the objects of checked batch params.
func mustObjects(raw []byte) []ingest.Object {
	var p ingest.BatchParams
	_ = json.Unmarshal(raw, &p)
	return p.Objects()
}

// newBatchesCmd returns `stint batches ls|show`.
func (c *cli) newBatchesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "batches",
		Short: "Inspect ingest batches and their jobs",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(c.newBatchesLsCmd(), c.newBatchesShowCmd())
	return cmd
}

// newBatchesLsCmd returns `stint batches ls`.
func (c *cli) newBatchesLsCmd() *cobra.Command {
	var profile, after string
	var limit int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List ingest batches with their Merritt state and job counts",
		Args:  exactArgs(0),
	}
	db := addDBFlag(cmd)
	f := cmd.Flags()
	f.StringVar(&profile, "profile", "", "only batches of this profile (collection)")
	f.StringVar(&after, "after", "", "cursor: only batches after this id (the previous page's next)")
	f.IntVar(&limit, "limit", defaultListLimit, "page size, 1 to "+strconv.Itoa(maxListLimit))
	f.BoolVar(&asJSON, "json", false, "print JSON")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
		if limit < 1 || limit > maxListLimit {
			return usageErrorf("--limit %d is outside 1..%d", limit, maxListLimit)
		}
		admin, _, closeAdmin, err := c.openIngestAdmin(ctx, db)
		if err != nil {
			return err
		}
		defer closeAdmin()
		batches, next, err := admin.Batches(ctx, profile, api.TaskID(after), limit)
		if err != nil {
			return c.schemaHint(err)
		}
		if asJSON {
			return writeJSON(c.stdout, struct {
				Batches []ingest.BatchView `json:"batches"`
				Next    api.TaskID         `json:"next,omitempty"`
			}{batches, next})
		}
		if len(batches) == 0 {
			fmt.Fprintln(c.stderr, "no batches")
			return nil
		}
		tw := newTable(c.stdout)
		fmt.Fprintln(tw, "ID\tSTATUS\tPROFILE\tSUBMITTER\tJOBS\tCOMPLETED\tFAILED\tHELD\tACTIVE\tCREATED")
		for _, b := range batches {
			total := 0
			for _, n := range b.Counts {
				total += n
			}
			done, failed, held := b.Counts[ingest.JobCompleted], b.Counts[ingest.JobFailed], b.Counts[ingest.JobHeld]
			status := string(b.Status)
			if b.CollectionHeld && b.Status != ingest.BatchHeld {
				status += " (collection held)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", b.ID, status, orDash(b.Profile), orDash(b.Submitter),
				total, done, failed, held, total-done-failed-held, formatTime(&b.CreatedAt))
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write table: %w", err)
		}
		if next != "" {
			fmt.Fprintf(c.stdout, "next: %s (more batches: pass --after %s)\n", next, next)
		}
		return nil
	}
	return cmd
}

// newBatchesShowCmd returns `stint batches show`.
func (c *cli) newBatchesShowCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show a batch, its report and its jobs with their Merritt states",
		Args:  exactArgs(1, "ID"),
	}
	db := addDBFlag(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		id := api.TaskID(args[0])
		if err := spi.CheckTaskID("id", id); err != nil {
			return err
		}
		admin, _, closeAdmin, err := c.openIngestAdmin(ctx, db)
		if err != nil {
			return err
		}
		defer closeAdmin()
		b, err := admin.Batch(ctx, id)
		if err != nil {
			return c.ingestError("show batch", args[0], err)
		}
		if asJSON {
			return writeJSON(c.stdout, b)
		}
		return c.printBatch(b)
	}
	return cmd
}

// printBatch prints a batch's details and a table of its jobs.
func (c *cli) printBatch(b ingest.BatchView) error {
	tw := newTable(c.stdout)
	row := func(name, value string) { fmt.Fprintf(tw, "%s:\t%s\n", name, value) }
	row("id", string(b.ID))
	status := string(b.Status)
	if b.CollectionHeld {
		status += " (collection " + b.Profile + " is held)"
	}
	row("status", status)
	row("profile", orDash(b.Profile))
	row("submitter", orDash(b.Submitter))
	row("task status", string(b.TaskStatus))
	row("created", formatTime(&b.CreatedAt))
	row("updated", formatTime(&b.UpdatedAt))
	if b.Report != nil {
		r := b.Report
		row("report", fmt.Sprintf("%d jobs: %d succeeded, %d failed, %d deleted (report %d, %s)", r.Jobs,
			len(r.Succeeded), len(r.Failed), r.Deleted, b.Reports, formatTime(&r.At)))
		if len(r.Recovered) > 0 {
			row("recovered", joinIDs(r.Recovered))
		}
		if len(r.Failed) > 0 {
			row("failed jobs", joinIDs(r.Failed))
		}
	}
	if b.Error != "" {
		row("error", b.Error)
	}
	for _, n := range b.Notices {
		outcome := "sent " + formatTime(&n.At)
		if n.Error != "" {
			outcome = "FAILED " + formatTime(&n.At) + ": " + n.Error
		}
		row("notice", fmt.Sprintf("%s: %s", n.Kind, outcome))
	}
	var steps []string
	for _, h := range b.History {
		steps = append(steps, h.To)
	}
	if len(steps) > 0 {
		row("history", "Pending -> "+strings.Join(steps, " -> "))
	}
	var counts []string
	for s, n := range b.Counts {
		counts = append(counts, fmt.Sprintf("%s %d", s, n))
	}
	sort.Strings(counts)
	row("jobs", orDash(strings.Join(counts, ", ")))
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write batch: %w", err)
	}
	if len(b.Jobs) == 0 {
		return nil
	}
	fmt.Fprintln(c.stdout)
	tw = newTable(c.stdout)
	fmt.Fprintln(tw, "JOB\tSTATUS\tLAST SUCCESSFUL\tRETRIES\tPRIORITY\tLOCAL ID\tIDENTIFIER\tNODE\tNOTE")
	for _, j := range b.Jobs {
		note := j.Note
		if j.Error != "" {
			note = j.Error
		}
		status := string(j.Status)
		if j.CollectionHeld && j.Status != ingest.JobHeld {
			status += " (held)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", j.ID, status, orDash(string(j.LastSuccessfulStatus)),
			j.RetryCount, j.Priority, orDash(j.LocalID), orDash(j.Identifier), orDash(j.Node), orDash(note))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write jobs: %w", err)
	}
	return nil
}

func joinIDs(ids []api.TaskID) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = string(id)
	}
	return strings.Join(s, " ")
}
