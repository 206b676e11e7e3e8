package impl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// runContext is the spi.RunContext of a run.
type runContext struct {
	s *Server
	r *run
}

func (rc *runContext) TaskID() api.TaskID  { return rc.r.claimed.ID }
func (rc *runContext) Attempt() int        { return rc.r.claimed.Attempt }
func (rc *runContext) IsResubmitted() bool { return rc.r.claimed.Resubmitted }

func (rc *runContext) Progress(v any) (bool, error) {
	rc.s.mu.Lock()
	raw := rc.r.progress
	rc.s.mu.Unlock()
	if raw == nil {
		return false, nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return true, fmt.Errorf("decode progress of task %s: %w", rc.r.claimed.ID, err)
	}
	return true, nil
}

func (rc *runContext) Checkpoint(ctx context.Context, progress any) error {
	return rc.checkpoint(ctx, nil, progress)
}

func (rc *runContext) CheckpointTx(ctx context.Context, tx pgx.Tx, progress any) error {
	if tx == nil {
		return errors.New("checkpoint: nil transaction")
	}
	return rc.checkpoint(ctx, tx, progress)
}

func (rc *runContext) checkpoint(ctx context.Context, tx pgx.Tx, progress any) error {
	raw, err := json.Marshal(progress)
	if err != nil {
		return fmt.Errorf("checkpoint task %s: encode progress: %w", rc.r.claimed.ID, err)
	}
	if err := spi.CheckJSONB("progress", raw); err != nil {
		return fmt.Errorf("checkpoint task %s: %w", rc.r.claimed.ID, err)
	}
	if tx == nil {
		var cancel context.CancelFunc
		if ctx, cancel, err = rc.sending(ctx, "checkpoint"); err != nil {
			return err
		}
		defer cancel()
	}
	received := rc.r.unconsumed(rc.s)
	err = rc.s.st.Checkpoint(ctx, tx, rc.r.claimed.LeaseRef, raw, rc.r.reg.Policy.KeepSteps, received)
	if errors.Is(err, api.ErrHalt) {
		rc.r.cancel(err)
	}
	if err != nil {
		return err
	}
	if tx == nil {
		// A caller's transaction may yet roll back: its messages stay
		// with the run, for its next checkpoint or finish to consume
		// (again, which changes nothing, once tx committed).
		rc.r.consumed(rc.s, len(received))
	}
	rc.s.mu.Lock()
	rc.r.progress = raw
	rc.r.active = time.Now()
	rc.s.mu.Unlock()
	return nil
}

func (rc *runContext) SetPriority(ctx context.Context, priority int) error {
	if priority < 0 || priority > 32767 {
		return api.Invalid("priority", "%d is outside 0..32767", priority)
	}
	ctx, cancel, err := rc.sending(ctx, "set priority of")
	if err != nil {
		return err
	}
	defer cancel()
	err = rc.s.st.SetPriority(ctx, rc.r.claimed.LeaseRef, priority)
	if errors.Is(err, api.ErrHalt) {
		rc.r.cancel(err)
	}
	return err
}

func (rc *runContext) Heartbeat(ctx context.Context) error {
	sent := time.Now()
	held, err := rc.s.st.Renew(ctx, []store.Renewal{rc.renewal()})
	if err != nil {
		return err
	}
	if !held[rc.r.claimed.ID] {
		err := fmt.Errorf("heartbeat task %s: %w", rc.r.claimed.ID, api.ErrHalt)
		rc.r.cancel(err)
		return err
	}
	rc.s.mu.Lock()
	rc.r.deadline = sent.Add(rc.r.lease)
	rc.r.active = time.Now()
	rc.s.mu.Unlock()
	return nil
}

func (rc *runContext) Spawn(ctx context.Context, reqs ...api.SubmitRequest) ([]api.Submission, error) {
	tasks := make([]store.NewTask, len(reqs))
	regs := make([]*spi.Registration, len(reqs))
	for i, req := range reqs {
		t, reg, err := rc.s.prepare(req)
		if err != nil {
			return nil, fmt.Errorf("spawn child %d (%s): %w", i, req.Behavior, err)
		}
		tasks[i], regs[i] = t, reg
	}
	if err := rc.s.checkRateUses(ctx, tasks, regs); err != nil {
		return nil, fmt.Errorf("spawn children: %w", err)
	}
	// Children due now wake the claimers at once, delayed ones when due.
	anyDue := slices.ContainsFunc(tasks, func(t store.NewTask) bool { return t.Delay == 0 })
	led := anyDue && rc.s.kick.lead()
	if led {
		tasks[0].WakeClaimers = true
	}
	ctx, cancel, err := rc.sending(ctx, "spawn children of")
	if err != nil {
		return nil, err
	}
	defer cancel()
	subs, err := rc.s.st.Spawn(ctx, rc.r.claimed.LeaseRef, tasks)
	if errors.Is(err, api.ErrHalt) {
		rc.r.cancel(err)
	}
	if err != nil {
		return nil, err
	}
	rc.s.kick.stored(anyDue, led, earliestDelay(tasks))
	return subs, nil
}

func (rc *runContext) AddNodes(ctx context.Context, g api.WorkflowGrowth) error {
	return rc.addNodes(ctx, nil, g)
}

func (rc *runContext) AddNodesTx(ctx context.Context, tx pgx.Tx, g api.WorkflowGrowth) error {
	if tx == nil {
		return fmt.Errorf("add nodes: %w", api.Invalid("tx", "is nil"))
	}
	return rc.addNodes(ctx, tx, g)
}

func (rc *runContext) addNodes(ctx context.Context, tx pgx.Tx, g api.WorkflowGrowth) error {
	c := rc.r.claimed
	if c.ParentID == "" {
		return fmt.Errorf("add nodes: %w", api.Invalid("nodes", "task %s is no workflow node", c.ID))
	}
	add, regs, err := rc.s.prepareGrowth(c.ParentID, c.ID, g, c.Trace)
	if err != nil {
		return fmt.Errorf("add nodes to workflow %s: %w", c.ParentID, err)
	}
	if err := rc.s.checkRateUses(ctx, add.Nodes, regs); err != nil {
		return fmt.Errorf("add nodes to workflow %s: %w", c.ParentID, err)
	}
	if tx == nil {
		var cancel context.CancelFunc
		if ctx, cancel, err = rc.sending(ctx, "add nodes of"); err != nil {
			return err
		}
		defer cancel()
	}
	err = rc.s.st.GrowWorkflow(ctx, tx, c.LeaseRef, c.ParentID, add)
	if errors.Is(err, api.ErrHalt) {
		rc.r.cancel(err)
	}
	return err
}

func (rc *runContext) WorkflowNode(ctx context.Context, name string) (api.Task, error) {
	parent := rc.r.claimed.ParentID
	if parent == "" || checkNodeName(name) != nil {
		return api.Task{}, fmt.Errorf("workflow node %q: %w", name, api.ErrNotFound)
	}
	t, err := rc.s.Get(store.ReadPrimary(ctx), parent+"/"+api.TaskID(name))
	if err == nil && t.ParentID != parent {
		err = api.ErrNotFound
	}
	if err != nil {
		return api.Task{}, fmt.Errorf("workflow node %q: %w", name, err)
	}
	return t, nil
}

// sending returns the context of a write of the run (a checkpoint, a
// priority, children) about to be sent. A statement abandoned when its
// context ends may still run on the server after the call returned, and
// then land after a later write of the same run and win: older progress or
// priority put back, children spawned after the run went on without them.
// So ctx stops a write only before it is sent; once sent, it runs to its
// end, bounded by the run's lease. verb names the write in the error.
func (rc *runContext) sending(ctx context.Context, verb string) (context.Context, context.CancelFunc, error) {
	if ctx.Err() != nil {
		return ctx, func() {}, fmt.Errorf("%s task %s: %w", verb, rc.r.claimed.ID, context.Cause(ctx))
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rc.r.lease)
	return ctx, cancel, nil
}

func (rc *runContext) renewal() store.Renewal {
	return store.Renewal{LeaseRef: rc.r.claimed.LeaseRef, Duration: rc.r.lease}
}
