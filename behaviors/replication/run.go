package replication

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// Error codes of failed runs.
const (
	codeSource     = "source_failed"
	codeTarget     = "target_failed"
	codeSchema     = "schema_mismatch"
	codeCollision  = "collision"
	codeDefinition = "definition"
	codeCrash      = "crash"
)

// runErr is an error of a run with the code it is reported with.
type runErr struct {
	code string
	err  error
}

func (e *runErr) Error() string { return e.err.Error() }
func (e *runErr) Unwrap() error { return e.err }

func sourceErr(err error) error { return &runErr{code: codeSource, err: err} }
func targetErr(err error) error { return &runErr{code: codeTarget, err: err} }

// errRestart ends a run whose persistent definition changed: it runs again
// at once with the new one.
var errRestart = errors.New("the replication's definition changed")

// Run replicates: a one-shot replication until it caught up with the
// source, a continuous one until its context ends.
func (b *Behavior) Run(ctx context.Context, rc spi.RunContext, p Params) (Result, error) {
	r := &run{Behavior: b, rc: rc, params: p}
	defer r.hook(context.WithoutCancel(ctx), "end", 0)
	defer r.close()
	r.hook(ctx, "run", 0)
	res, err := r.run(ctx)
	if err == nil {
		return res, nil
	}
	return Result{}, r.fail(ctx, err)
}

// run is one run of a replication task.
type run struct {
	*Behavior
	rc     spi.RunContext
	params Params
	// readyAt is when the run started replicating (connected, checked,
	// locked): the start of its healthy time.
	readyAt time.Time

	prog           Progress
	db             *pgxpool.Pool // the stint database; nil without one
	src            *source
	dst            *target
	shared         bool // checkpoints commit with the rows
	ready          bool // connected and locked: replicating
	batches        int
	lastCheckpoint time.Time
	forceCP        bool
}

// hook calls the test hook, if any.
func (r *run) hook(ctx context.Context, event string, n int64) {
	if r.cfg.hook != nil {
		r.cfg.hook(ctx, event, r.rc.TaskID(), n)
	}
}

func (r *run) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if r.src != nil {
		_ = r.src.conn.Close(ctx)
	}
	if r.dst != nil {
		// Release the replication lock before the run returns (closing
		// the session would, but only once the server notices).
		_, _ = r.dst.conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
		_ = r.dst.conn.Close(ctx)
	}
}

// run sets up and replicates; see Run.
func (r *run) run(ctx context.Context) (Result, error) {
	if _, err := r.rc.Progress(&r.prog); err != nil {
		return Result{}, err
	}
	r.db = r.stintDB(ctx)
	if err := r.readDefinition(ctx); err != nil {
		return Result{}, err
	}
	pl, err := r.connect(ctx)
	if err != nil {
		return Result{}, err
	}
	repID := ReplicationID(r.params, pl.keys, r.continuous)
	if r.prog.ReplicationID != repID {
		// A new replication id starts from scratch (CouchDB finds no
		// checkpoint for it); the crash count carries over.
		r.prog = Progress{Result: Result{ReplicationID: repID}, Errors: r.prog.Errors, LastError: r.prog.LastError,
			Definition: r.prog.Definition, Version: r.prog.Version}
	}
	if err := r.lock(ctx, repID); err != nil {
		return Result{}, err
	}
	if r.db != nil {
		stintID, err := r.stintDatabase(ctx)
		if err != nil {
			return Result{}, err
		}
		dstID, err := databaseIdentity(ctx, r.dst.conn)
		if err != nil {
			return Result{}, targetErr(err)
		}
		r.shared = stintID == dstID
	}
	r.prog.Layout = "separate"
	if r.shared {
		r.prog.Layout = "shared"
	}
	r.readyAt = time.Now()
	r.prog.HealthySince = &r.readyAt
	r.ready = true
	r.lastCheckpoint = r.readyAt
	// Checkpoint at the first batch (or the first look, when there is
	// nothing to copy), not a whole interval later: until then the stored
	// progress is that of an earlier run, and its lag says nothing true.
	r.forceCP = true
	r.hook(ctx, "start", r.prog.Seq)
	return r.replicate(ctx)
}

// readDefinition reads a persistent replication's definition into the
// run's params, and fails for good when it is gone or now belongs to
// another task.
func (r *run) readDefinition(ctx context.Context) error {
	if r.params.Definition == "" || r.db == nil {
		return nil
	}
	def, err := loadDefinition(ctx, r.db, r.params.Definition)
	if errors.Is(err, errNoDefinition) {
		return api.Permanent(codeDefinition, "persistent replication %q is no longer defined", r.params.Definition)
	}
	if err != nil {
		return err
	}
	if def.TaskID != r.rc.TaskID() {
		return api.Permanent(codeDefinition, "persistent replication %q is now run by task %s", def.Name, def.TaskID)
	}
	r.params = def.Params
	r.prog.Definition, r.prog.Version = def.Name, def.Version
	return clearState(ctx, r.db, def.Name, r.rc.TaskID())
}

// connect opens the source and the target, checks their tables and
// prepares the plan's statements on both.
func (r *run) connect(ctx context.Context) (*plan, error) {
	p := r.params
	srcTable, err := parseTable(p.Source.Table)
	if err != nil {
		return nil, api.Permanent(codeDefinition, "source table: %v", err)
	}
	dstTable, err := parseTable(p.Target.Table)
	if err != nil {
		return nil, api.Permanent(codeDefinition, "target table: %v", err)
	}
	srcConn, err := connect(ctx, p.Source.DSN, "stint:source", r.cfg.ConnectTimeout)
	if err != nil {
		return nil, sourceErr(fmt.Errorf("source: %w", err))
	}
	r.src = &source{conn: srcConn, waiting: func(n int) { r.hook(ctx, "horizon-wait", int64(n)) }}
	self := appName(r.rc.TaskID(), p.Definition != "")
	dstConn, err := connect(ctx, p.Target.DSN, self, r.cfg.ConnectTimeout)
	if err != nil {
		return nil, targetErr(fmt.Errorf("target: %w", err))
	}
	r.dst = &target{conn: dstConn, self: self}

	srcInfo, err := describeTable(ctx, srcConn, srcTable, p.ChangeColumn)
	if err != nil {
		return nil, sourceErr(fmt.Errorf("source: %w", err))
	}
	dstInfo, err := describeTable(ctx, dstConn, dstTable, p.ChangeColumn)
	if err != nil {
		return nil, targetErr(fmt.Errorf("target: %w", err))
	}
	pl, err := makePlan(p, srcInfo, dstInfo)
	if err != nil {
		return nil, err
	}
	if err := checkNulls(ctx, srcConn, pl); err != nil {
		return nil, sourceErr(err)
	}
	for _, w := range pl.warnings {
		r.cfg.Logger.Warn("stint: replication: "+w, "task", r.rc.TaskID())
	}
	r.src.plan, r.dst.plan = pl, pl
	if err := r.src.prepare(ctx); err != nil {
		return nil, err
	}
	if err := r.dst.prepare(ctx); err != nil {
		return nil, targetErr(err)
	}
	return pl, nil
}

// lock takes the replication's lock on the target: one run of a
// replication at a time, whichever task runs it.
func (r *run) lock(ctx context.Context, repID string) error {
	h, err := r.dst.lock(ctx, repID)
	if err != nil {
		return targetErr(err)
	}
	if h == nil {
		return nil
	}
	if h.persistent {
		return api.Permanent(codeCollision,
			"replication %s is already run by persistent replication task %s: one of them must go", repID, h.task)
	}
	return &runErr{code: codeCollision,
		err: fmt.Errorf("duplicate replication running: transient task %s runs replication %s; retrying later", h.task, repID)}
}

// stintDatabase returns the identity of the stint database, cached.
func (r *run) stintDatabase(ctx context.Context) (string, error) {
	r.mu.Lock()
	id := r.stintIdentity
	r.mu.Unlock()
	if id != "" {
		return id, nil
	}
	id, err := databaseIdentity(ctx, r.db)
	if err != nil {
		return "", fmt.Errorf("stint database: %w", err)
	}
	r.mu.Lock()
	r.stintIdentity = id
	r.mu.Unlock()
	return id, nil
}

// replicate copies batches until caught up (one-shot) or until ctx ends
// (continuous).
func (r *run) replicate(ctx context.Context) (Result, error) {
	n := r.params.BatchSize
	if n <= 0 {
		n = r.cfg.BatchSize
	}
	for {
		if err := context.Cause(ctx); err != nil {
			return Result{}, err
		}
		head, err := r.src.horizon(ctx, r.prog.Seq)
		if err != nil {
			return Result{}, sourceErr(err)
		}
		r.prog.SourceSeq, r.prog.SourceSeqAt = max(r.prog.SourceSeq, head), time.Now()
		if head <= r.prog.Seq {
			if !r.continuous {
				return r.complete(ctx)
			}
			if r.checkpointDue() {
				if err := r.checkpoint(ctx); err != nil {
					return Result{}, err
				}
			}
			if err := spi.Sleep(ctx, r.cfg.PollInterval); err != nil {
				return Result{}, err
			}
			continue
		}
		for r.prog.Seq < head {
			if err := context.Cause(ctx); err != nil {
				return Result{}, err
			}
			if err := r.copyBatch(ctx, head, n); err != nil {
				return Result{}, err
			}
		}
		if r.checkpointDue() {
			if err := r.checkpoint(ctx); err != nil {
				return Result{}, err
			}
		}
	}
}

// copyBatch copies the next batch of rows up to head and checkpoints when
// due: in the batch's transaction in the shared layout, after it
// otherwise.
func (r *run) copyBatch(ctx context.Context, head int64, n int) error {
	b, err := r.src.read(ctx, r.prog.Seq, head, n)
	if err != nil {
		return sourceErr(err)
	}
	r.batches++
	due := r.checkpointDue() // first: it may reset the error count
	next := r.prog
	next.Seq = b.lastSeq
	if b.count < n {
		next.Seq = head // every row up to head was read
	}
	next.RowsRead += int64(b.count)
	var inTx func(pgx.Tx, int64, int64) error
	var stored *Progress
	if due && r.shared {
		inTx = func(tx pgx.Tx, written, deleted int64) error {
			cp := next
			cp.RowsWritten += written
			cp.RowsDeleted += deleted
			cp.Checkpoints++
			cp.CheckpointedAt = time.Now()
			if err := r.rc.CheckpointTx(ctx, tx, cp); err != nil {
				return fmt.Errorf("checkpoint with the batch: %w", err)
			}
			stored = &cp
			return nil
		}
	}
	if b.count == 0 {
		r.prog = next
		return nil
	}
	written, deleted, err := r.dst.write(ctx, b, func(ev string) { r.hook(ctx, ev, int64(r.batches)) }, inTx)
	if err != nil {
		if errors.Is(err, api.ErrHalt) {
			return err
		}
		return targetErr(err)
	}
	if stored != nil {
		r.prog = *stored
		r.lastCheckpoint, r.forceCP = time.Now(), false
		return r.checkDefinition(ctx)
	}
	next.RowsWritten += written
	next.RowsDeleted += deleted
	r.prog = next
	if due {
		return r.checkpoint(ctx)
	}
	return nil
}

// checkpointDue reports whether the next checkpoint is due: the interval
// passed, or the run just healed (it ran healthy for the threshold, and
// its error count resets, recorded at once).
func (r *run) checkpointDue() bool {
	if r.prog.Errors > 0 && time.Since(r.readyAt) >= r.cfg.HealthThreshold {
		r.prog.Errors = 0
		r.forceCP = true
	}
	return r.forceCP || time.Since(r.lastCheckpoint) >= r.cfg.CheckpointInterval
}

// checkpoint stores the progress (on the stint database, outside any
// transaction of the target), then looks whether a persistent definition
// changed.
func (r *run) checkpoint(ctx context.Context) error {
	r.prog.Checkpoints++
	r.prog.CheckpointedAt = time.Now()
	if err := r.rc.Checkpoint(ctx, r.prog); err != nil {
		r.prog.Checkpoints--
		return fmt.Errorf("checkpoint: %w", err)
	}
	r.lastCheckpoint, r.forceCP = time.Now(), false
	return r.checkDefinition(ctx)
}

// checkDefinition returns errRestart when the persistent definition the run
// uses was updated.
func (r *run) checkDefinition(ctx context.Context) error {
	if r.prog.Definition == "" || r.db == nil {
		return nil
	}
	v, err := definitionVersion(ctx, r.db, r.prog.Definition, r.rc.TaskID())
	if errors.Is(err, errNoDefinition) {
		return api.Permanent(codeDefinition, "persistent replication %q is no longer defined", r.prog.Definition)
	}
	if err != nil {
		return err
	}
	if v != r.prog.Version {
		return errRestart
	}
	return nil
}

// complete ends a one-shot replication that caught up: a last checkpoint
// (so that a later submit of the task resumes from here) and, for a
// persistent one, its terminal state.
func (r *run) complete(ctx context.Context) (Result, error) {
	r.prog.Errors, r.prog.LastError = 0, ""
	if err := r.checkpoint(ctx); err != nil {
		return Result{}, err
	}
	res := r.prog.Result
	if r.prog.Definition != "" && r.db != nil {
		raw, _ := json.Marshal(res)
		if err := recordState(ctx, r.db, r.prog.Definition, r.rc.TaskID(), StateCompleted, raw); err != nil {
			return Result{}, err
		}
	}
	r.hook(ctx, "completed", r.prog.Seq)
	return res, nil
}

// fail turns the error that ended a run into what the run returns: a
// stopped run (preempted, server stopping) checkpoints and returns; a
// permanent error fails the replication; anything else is a crash,
// counted in the progress (reset first if the run was healthy long enough)
// and retried after the backoff penalty.
func (r *run) fail(ctx context.Context, err error) error {
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	// The progress stored from here on is that of a run that no longer
	// replicates.
	r.prog.HealthySince = nil
	if errors.Is(err, errRestart) {
		if cerr := r.rc.Checkpoint(bg, r.prog); cerr != nil {
			return cerr
		}
		r.cfg.Logger.Info("stint: replication: definition changed; restarting", "task", r.rc.TaskID(), "definition", r.prog.Definition)
		return spi.Snooze(0)
	}
	if ctx.Err() != nil {
		cause := context.Cause(ctx)
		if r.ready && !errors.Is(cause, api.ErrHalt) {
			// Preempted or stopping: the lease still holds.
			if cerr := r.rc.Checkpoint(bg, r.prog); cerr != nil {
				r.cfg.Logger.Warn("stint: replication: checkpoint on stop failed", "task", r.rc.TaskID(), "err", cerr)
			}
		}
		return cause
	}
	if errors.Is(err, api.ErrHalt) {
		return err
	}
	var te *api.TaskError
	if errors.As(err, &te) && !te.Retryable {
		if r.prog.Definition != "" && r.db != nil {
			raw, _ := json.Marshal(te)
			if serr := recordState(bg, r.db, r.prog.Definition, r.rc.TaskID(), StateFailed, raw); serr != nil {
				r.cfg.Logger.Warn("stint: replication: recording the failed state failed", "task", r.rc.TaskID(), "err", serr)
			}
		}
		return te
	}
	code := codeCrash
	var re *runErr
	switch {
	case errIsSchema(err):
		code = codeSchema
	case errors.As(err, &re):
		code = re.code
	}
	n := r.prog.Errors + 1
	if r.ready && time.Since(r.readyAt) >= r.cfg.HealthThreshold {
		n = 1 // healed: this run was healthy long enough
	}
	r.prog.Errors, r.prog.LastError = n, err.Error()
	if cerr := r.rc.Checkpoint(bg, r.prog); cerr != nil && !errors.Is(cerr, api.ErrHalt) {
		r.cfg.Logger.Warn("stint: replication: recording the crash failed", "task", r.rc.TaskID(), "err", cerr)
	}
	r.cfg.Logger.Info("stint: replication crashed", "task", r.rc.TaskID(), "errors", n, "err", err)
	return &api.TaskError{Retryable: true, Code: code, Message: err.Error(), Properties: map[string]any{propErrors: n}}
}
