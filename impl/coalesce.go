package impl

// Concurrent single submits share statements: each Submit outside a
// caller's transaction joins a batch, and a batch goes out as one submit
// statement and one commit.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// maxCoalesced is the most calls one batch of single submits or signals
// holds.
const maxCoalesced = 1000

// The single submits of a Client share batches (Client.coalesce, a
// batchQueue) keyed by task id: a submit whose id is in the open batch
// joins a later one, so that its dedup is that of two submits one after
// the other (a submit of a new id, store.NewTask.Unique, has no key).
// Within a batch the tasks go out in id order, so that two batches in the
// database at once lock their rows in the same order. Each submit's own
// checks (validation, rate limits) run before it joins: a refused submit
// never reaches a batch. A batch the database refuses for one of its rows
// (an error of the statement, not of the database's availability) is
// split in halves, each sent on its own, down to single submits: the
// others are stored and only the failing row's submit gets the error.
// An error wrapping ctx's error always means that nothing was stored.
func (c *Client) submitBatches() batchKind[*coalesced] {
	return batchKind[*coalesced]{
		send:       c.storeCoalesced,
		key:        func(e *coalesced) (api.TaskID, bool) { return e.task.ID, !e.task.Unique },
		maxEntries: maxCoalesced,
	}
}

// coalesced is one submit in a batch.
type coalesced struct {
	queued
	task store.NewTask
	sub  api.Submission
	err  error
}

// submitCoalesced stores t, due to no Combiner, in a batch with the
// concurrent single submits of c; see submitBatches.
func (c *Client) submitCoalesced(ctx context.Context, t store.NewTask) (api.Submission, error) {
	if err := ctx.Err(); err != nil {
		return api.Submission{}, fmt.Errorf("submit %s: %w", t.Behavior, err)
	}
	e := &coalesced{task: t}
	if !c.coalesce.do(ctx, e) {
		return api.Submission{}, fmt.Errorf("submit %s: not sent: %w", t.Behavior, ctx.Err())
	}
	return e.sub, e.err
}

// storeCoalesced stores entries in one statement, or, when the database
// refuses it for a row, in halves; see submitBatches.
func (c *Client) storeCoalesced(ctx context.Context, entries []*coalesced) {
	if slices.ContainsFunc(entries, func(e *coalesced) bool { return !e.task.Unique }) {
		slices.SortFunc(entries, func(a, b *coalesced) int { return strings.Compare(string(a.task.ID), string(b.task.ID)) })
	}
	tasks := make([]store.NewTask, len(entries))
	for i, e := range entries {
		tasks[i] = e.task
	}
	subs, led, due, err := c.storePlain(ctx, nil, tasks, false)
	switch {
	case err == nil:
		for i, e := range entries {
			e.sub = subs[i]
		}
		c.countSubmitted(ctx, tasks)
		c.kick.stored(due, led, earliestDelay(tasks))
	case len(entries) > 1 && rowRefused(err):
		half := len(entries) / 2
		c.storeCoalesced(ctx, entries[:half])
		c.storeCoalesced(ctx, entries[half:])
	default:
		for _, e := range entries {
			e.err = err
		}
	}
}

// rowRefused reports whether err is the database refusing a statement for
// what it holds (a constraint, a trigger, a deadlock), which another
// statement without some of its rows may not meet, rather than the
// database failing to serve it.
func rowRefused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && classify(err) == ""
}
