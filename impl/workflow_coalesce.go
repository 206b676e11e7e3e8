package impl

// Concurrent workflow submits share statements: each SubmitWorkflow
// outside a caller's transaction joins a batch, and a batch goes out as
// one statement and one commit (store.Workflows.SubmitWorkflows), as
// single submits do (coalesce.go).

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
)

// A batch of workflows is full, and goes out at once even while another
// is in the database, when it holds maxCoalescedWorkflows workflows or
// maxCoalescedNodes nodes. A workflow of more nodes goes in a batch of
// its own.
const (
	maxCoalescedWorkflows = 1000
	maxCoalescedNodes     = 10_000
)

// workflowCoalescer gathers the SubmitWorkflow calls of a Client into
// batches, by coalescer's rules:
//
//   - A batch goes out when no batch is in the database (a lone submit
//     goes out at once, alone), or when it is full; the others wait for
//     the batches in the database to return. No timer delays a batch.
//   - A batch never holds a workflow's id twice: a submit of an id in the
//     open batch joins a later one, which goes out after it, so that the
//     second stores nothing (Created false), as it would one after the
//     other. The store takes a batch's rows in id order.
//   - A workflow is validated (and its rate limits checked) before it
//     joins: a refused request never reaches a batch.
//   - Each workflow of a batch is decided on its own (see
//     store.Workflows.SubmitWorkflows): an id taken by a task that is not
//     a workflow is refused by the statement itself, row by row; a
//     statement refused for a row (a node's id taken by another task) is
//     sent again in halves, down to the workflow at fault, which alone
//     gets the error.
//   - A caller learns its outcome once its batch's statement committed,
//     or failed. A caller whose context ends before its batch goes out is
//     dropped from it and gets ctx's error: its workflow is not stored.
//     Once its batch is in the database, it waits for the batch's
//     outcome.
type workflowCoalescer struct {
	mu sync.Mutex
	// queue holds the batches not sent yet, the next to go first.
	queue []*workflowBatch
	// inFlight counts the batches in the database.
	inFlight int
}

// workflowBatch is a batch of workflow submits.
type workflowBatch struct {
	entries []*coalescedWorkflow
	ids     map[api.TaskID]struct{}
	nodes   int
	sent    bool
	// done is closed once every entry has its outcome.
	done chan struct{}
}

// coalescedWorkflow is one workflow submit in a batch.
type coalescedWorkflow struct {
	ctx     context.Context // the caller's, for its values (the trace)
	wf      store.NewWorkflow
	gone    bool // the caller gave up before the batch went out
	created bool
	err     error
}

// full reports whether b goes out without waiting for the batches in the
// database.
func (b *workflowBatch) full() bool {
	return len(b.entries) >= maxCoalescedWorkflows || b.nodes >= maxCoalescedNodes
}

// takes reports whether b, not sent yet, may take e.
func (b *workflowBatch) takes(e *coalescedWorkflow) bool {
	if b.full() || (len(b.entries) > 0 && b.nodes+len(e.wf.Nodes) > maxCoalescedNodes) {
		return false
	}
	_, dup := b.ids[e.wf.Task.ID]
	return !dup
}

// add appends e to b.
func (b *workflowBatch) add(e *coalescedWorkflow) {
	b.entries = append(b.entries, e)
	b.ids[e.wf.Task.ID] = struct{}{}
	b.nodes += len(e.wf.Nodes)
}

// join adds e to the first batch of the queue that takes it, or to a new
// one at the end. q.mu is held.
func (q *workflowCoalescer) join(e *coalescedWorkflow) *workflowBatch {
	for _, b := range q.queue {
		if b.takes(e) {
			b.add(e)
			return b
		}
	}
	b := &workflowBatch{ids: map[api.TaskID]struct{}{}, done: make(chan struct{})}
	b.add(e)
	q.queue = append(q.queue, b)
	return b
}

// take removes the batches that go out now from the queue, marks them
// sent and counts them in flight: the first when none is in flight, and
// full ones. Entries whose callers gave up are left out. q.mu is held.
func (q *workflowCoalescer) take() []*workflowBatch {
	var out []*workflowBatch
	for len(q.queue) > 0 && (q.inFlight == 0 || q.queue[0].full()) {
		b := q.queue[0]
		q.queue[0] = nil
		q.queue = q.queue[1:]
		b.sent = true
		b.entries = slices.DeleteFunc(b.entries, func(e *coalescedWorkflow) bool { return e.gone })
		q.inFlight++
		out = append(out, b)
	}
	return out
}

// submitWorkflowCoalesced stores wf in a batch with the concurrent
// workflow submits of c; see workflowCoalescer. It reports whether wf was
// created.
func (c *Client) submitWorkflowCoalesced(ctx context.Context, wf store.NewWorkflow) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("submit workflow %s: %w", wf.Task.ID, err)
	}
	q := &c.workflows
	e := &coalescedWorkflow{ctx: ctx, wf: wf}
	q.mu.Lock()
	b := q.join(e)
	send := q.take()
	q.mu.Unlock()
	// The caller sends its own batch; others that go out now (full ones)
	// go side by side.
	own := false
	for _, s := range send {
		if s == b {
			own = true
		} else {
			go c.sendWorkflows(s)
		}
	}
	if own {
		c.sendWorkflows(b)
	}
	select {
	case <-b.done:
	case <-ctx.Done():
		q.mu.Lock()
		if !b.sent {
			e.gone = true
			q.mu.Unlock()
			return false, fmt.Errorf("submit workflow %s: not sent: %w", wf.Task.ID, ctx.Err())
		}
		q.mu.Unlock()
		<-b.done
	}
	return e.created, e.err
}

// sendWorkflows stores b's workflows, gives each entry its outcome, and
// sends the batches that may go out now that b returned, each in a
// goroutine.
func (c *Client) sendWorkflows(b *workflowBatch) {
	if len(b.entries) > 0 {
		wfs := make([]store.NewWorkflow, len(b.entries))
		for i, e := range b.entries {
			wfs[i] = e.wf
		}
		// The batch outlives any one caller's context, and carries the
		// first one's values.
		out, err := c.st.SubmitWorkflows(context.WithoutCancel(b.entries[0].ctx), nil, wfs)
		for i, e := range b.entries {
			if err != nil {
				e.err = unavailable(err)
				continue
			}
			e.created, e.err = out[i].Created, out[i].Err
		}
	}
	close(b.done)
	q := &c.workflows
	q.mu.Lock()
	q.inFlight--
	next := q.take()
	q.mu.Unlock()
	for _, s := range next {
		go c.sendWorkflows(s)
	}
}
