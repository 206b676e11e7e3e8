// Package replication holds the built-in behaviors replication (one-shot)
// and replication.continuous: the CouchDB replicator for
// PostgreSQL tables on stint.
//
// A replication copies the rows of a source table into a target table of
// another database (Params). The source has a change column, a bigint that
// grows with every insert and update (InstallChangeTrigger maintains it from
// a sequence); the replication reads the rows in batches in change order and
// upserts them into the target by primary key, guarded so that a row is
// only overwritten by a newer one (target.change < excluded.change). A
// one-shot replication runs until it has caught up with the source and
// succeeds with its stats (Result); a continuous one keeps following the
// source until it is removed.
//
// # Ids
//
// The task id (the couch job_id, TaskID) is deterministic from the source,
// the target, the filter and the owner, so submitting one replication twice
// makes one task. The replication id (ReplicationID) hashes everything that
// could change the result. Two tasks with one replication id collide: a run
// holds a session advisory lock keyed by the replication id on the target
// database for its whole duration, so at most one of them runs (race-free,
// unlike listing the other tasks, and released by PostgreSQL when the
// holder's connection ends, also when its node is killed). A run that finds
// the lock held by another replication follows the CouchDB replicator: if
// the holder is transient the run reschedules itself as crashing; if it is
// persistent the run fails permanently, naming it. A lock held by an older
// run of the same task (a node that lost its lease but still has its
// connection) is taken from it by terminating that backend, which also
// fences that run's writes to the target.
//
// # Reading without missing rows
//
// Change values are taken at write time but become visible at commit, out
// of order. A batch therefore reads only up to a horizon: the highest
// change value visible in a snapshot, once every writing transaction of
// the source database still running when that snapshot was taken has
// ended (the trigger assigns the transaction id before it takes a change
// value, so every value at or below the horizon belongs to a transaction
// that has ended). Batches never skip a row, and each row is read at its
// newest version. A long write transaction in the source database holds
// the horizon back until it ends. Rows need a change value from the
// trigger (a sequence with cache 1): rows without one are not replicated,
// and rows deleted from the source outright stay in the target (mark
// deletes with Params.TombstoneColumn).
//
// # Checkpoints and crashes
//
// Progress (the last change value replicated, the source's head, stats,
// the consecutive error count) is the task's checkpoint, stored at a run's
// first batch and then every Config.CheckpointInterval. The lag a
// monitoring view shows (Info) is the source's head minus the last change
// replicated, as of the last checkpoint; while a run has not checkpointed
// yet it is unknown, not zero. Two layouts give two guarantees:
//
//   - Shared: the target database is the stint database. The checkpoint
//     is written with RunContext.CheckpointTx in the transaction that
//     writes the batch's rows, so the checkpoint and the rows it covers
//     commit together.
//   - Separate: any other target. The checkpoint is written with
//     RunContext.Checkpoint after the batch's transaction committed, so it
//     never covers rows that are not in the target; a crash between the
//     two replays the batches since the previous checkpoint.
//
// Either way a run resumes after its last checkpoint and replays what
// followed it; replays are harmless because the upsert is keyed by primary
// key and guarded by the change column, and a stale run cannot write
// concurrently (see Ids). The target ends equal to the source: no row
// lost, none duplicated. Only the stats differ: RowsRead counts replayed
// rows again, and RowsWritten does not count the writes of batches that
// committed after the last checkpoint of a crashed run (their replays
// change nothing).
//
// A run that fails (a source or target unreachable, a query error) is
// "crashing": it is retried after the backoff penalty min * 2^min(n,
// log2(max/min)), jittered to 75-100% (Penalty; n counts the consecutive
// crashes), and a run that stays healthy for Config.HealthThreshold resets
// the count ("healing"). The count lives in the progress, so healing does
// not need a success.
//
// # One-shot and continuous
//
// The two modes are two behaviors because the engine's rotation
// (spi.Rotation: at most max_jobs running per node, the oldest stopped for
// waiting ones within max_churn per interval) is a behavior policy:
// replication.continuous is preemptible, replication is not, so a one-shot
// replication is never stopped halfway for rotation. A preempted run
// checkpoints and is due again at once; so does a continuous run on a
// server that stops, which does not wait for it.
//
// # The stint database
//
// Persistent definitions, and the check whether a target is the stint
// database (the shared layout), need the stint database: Config.DB, or
// Config.OpenDB for processes that build their registry before they open
// it. Without it, persistent replications run from their task's params as
// submitted and checkpoints never share the target's transaction.
//
// # Transient and persistent
//
// A transient replication is a task submitted directly (api.Submit with
// OneShot or Continuous); its task is deleted Config.Retention (24 hours)
// after it ended, by the cleanup behavior. A persistent replication is a
// row of the definitions table stint_replication, written by Define (which
// checks the definition first and refuses an invalid one) and removed by
// Undefine; each submits or removes the task in the same call. The task
// reads its definition when it starts and at each checkpoint, restarting
// when it changed, and records its terminal state (completed or failed) in
// the row, which outlives the task.
//
// States, as in the CouchDB replicator: pending, running, crashing,
// completed, failed (see StateOf); `stint replications ls|show` shows them.
package replication

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// The behavior ids.
const (
	OneShotBehavior    api.BehaviorID = "replication"
	ContinuousBehavior api.BehaviorID = "replication.continuous"
)

// OneShot is the kind of one-shot replications.
var OneShot = api.Kind[Params, Result]{ID: OneShotBehavior}

// Continuous is the kind of continuous replications.
var Continuous = api.Kind[Params, Result]{ID: ContinuousBehavior}

// KindFor returns Continuous or OneShot.
func KindFor(continuous bool) api.Kind[Params, Result] {
	if continuous {
		return Continuous
	}
	return OneShot
}

// Result is what a replication did: the result of a one-shot replication,
// and the stats of a continuous one in its progress.
type Result struct {
	// ReplicationID is the replication id the run computed.
	ReplicationID string `json:"replication_id"`
	// Seq is the last change value replicated (the last sequence).
	Seq int64 `json:"seq"`
	// RowsRead counts the source rows read, replays included.
	RowsRead int64 `json:"rows_read"`
	// RowsWritten counts the target rows inserted or updated.
	RowsWritten int64 `json:"rows_written"`
	// RowsDeleted counts the target rows deleted for tombstones.
	RowsDeleted int64 `json:"rows_deleted"`
}

// Progress is a replication's checkpoint: where it is and how it has been
// doing. It is the task's progress.
type Progress struct {
	Result
	// SourceSeq is the highest change value the source had when the
	// replication last looked: SourceSeq - Seq is the lag in changes.
	SourceSeq int64 `json:"source_seq"`
	// SourceSeqAt is when the replication read SourceSeq (the node's
	// clock); zero when it never did.
	SourceSeqAt time.Time `json:"source_seq_at,omitzero"`
	// Checkpoints counts the checkpoints written.
	Checkpoints int64 `json:"checkpoints"`
	// CheckpointedAt is when this checkpoint was taken (the node's clock);
	// zero (and absent) before the first.
	CheckpointedAt time.Time `json:"checkpointed_at,omitzero"`
	// Errors counts consecutive crashes; a run healthy for the health
	// threshold resets it.
	Errors int `json:"errors"`
	// LastError is the error of the last crash.
	LastError string `json:"last_error,omitempty"`
	// HealthySince is when the current run started replicating; nil when
	// no run replicates (the last one stopped or crashed, or the current
	// one has not checkpointed yet).
	HealthySince *time.Time `json:"healthy_since,omitempty"`
	// Layout is "shared" (checkpoints commit with the rows) or "separate".
	Layout string `json:"layout,omitempty"`
	// Definition and Version name the persistent definition the run used.
	Definition string `json:"definition,omitempty"`
	Version    int64  `json:"version,omitempty"`
}

// Config configures the replication behaviors. Zero fields take the
// defaults of the CouchDB replicator.
type Config struct {
	// DB is the stint database: the definitions of persistent
	// replications, and the check whether a target is the stint database
	// (the shared layout). Optional: without it (and without OpenDB),
	// persistent replications run from their task's params as submitted,
	// and checkpoints never share the target's transaction.
	DB *pgxpool.Pool
	// OpenDB supplies DB on first use, for processes that build their
	// registry before they open the database. It is called until it
	// succeeds; its result is kept.
	OpenDB func(ctx context.Context) (*pgxpool.Pool, error)
	// BatchSize is the default number of rows per batch. Defaults to 1,000.
	BatchSize int
	// CheckpointInterval is the time between checkpoints. Defaults to 30
	// seconds.
	CheckpointInterval time.Duration
	// PollInterval is how long a continuous replication that caught up
	// waits before it looks at the source again. Defaults to 1 second.
	PollInterval time.Duration
	// MinBackoff and MaxBackoff bound the backoff penalty after crashes.
	// Default to 32 seconds and 172,800 seconds (2 days); MaxBackoff is
	// capped at 30 days.
	MinBackoff, MaxBackoff time.Duration
	// HealthThreshold is how long a run must replicate without error for
	// its error count to reset. Defaults to 120 seconds.
	HealthThreshold time.Duration
	// Lease is the activity timeout: a run whose node stops renewing is
	// taken over this long after the last renewal. Defaults to 61 seconds.
	Lease time.Duration
	// Rotation shares each node's slots among continuous replications
	// (max_jobs, max_churn, interval, min run time). Zero fields take the
	// replicator's defaults: 500, 100, 15 s, 60 s.
	Rotation spi.Rotation
	// Retention is how long a replication's task is kept after it ended
	// (success or failure) before the cleanup behavior deletes it.
	// Defaults to 24 hours.
	Retention time.Duration
	// ConnectTimeout bounds connecting to a source or target. Defaults to
	// 10 seconds.
	ConnectTimeout time.Duration
	// Logger receives the behaviors' logs. Defaults to slog.Default().
	Logger *slog.Logger

	// hook, when set, is called at points of a run, for tests: "run" (at
	// once), "start" (replicating; n: the sequence it resumes from), "batch-written" (n: the batch
	// number, the transaction still open), "horizon-wait" (n: the source
	// transactions waited for), "completed", "end" (returning, its
	// connections closed).
	hook func(ctx context.Context, event string, task api.TaskID, n int64)
}

// Defaults of Config.
const (
	DefaultBatchSize          = 1000
	DefaultCheckpointInterval = 30 * time.Second
	DefaultPollInterval       = time.Second
	DefaultMinBackoff         = 32 * time.Second
	DefaultMaxBackoff         = 172800 * time.Second
	DefaultHealthThreshold    = 120 * time.Second
	DefaultLease              = 61 * time.Second
	DefaultRetention          = 24 * time.Hour
	maxBackoffCap             = 30 * 24 * time.Hour
)

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.BatchSize <= 0 {
		c.BatchSize = DefaultBatchSize
	}
	c.BatchSize = min(c.BatchSize, MaxBatchSize)
	if c.CheckpointInterval <= 0 {
		c.CheckpointInterval = DefaultCheckpointInterval
	}
	if c.PollInterval <= 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	c.MaxBackoff = min(max(c.MaxBackoff, c.MinBackoff), maxBackoffCap)
	c.MinBackoff = min(c.MinBackoff, c.MaxBackoff)
	if c.HealthThreshold <= 0 {
		c.HealthThreshold = DefaultHealthThreshold
	}
	if c.Lease <= 0 {
		c.Lease = DefaultLease
	}
	c.Rotation = c.Rotation.WithDefaults()
	if c.Retention <= 0 {
		c.Retention = DefaultRetention
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Register adds replication and replication.continuous to r.
func Register(r *spi.Registry, cfg Config) error {
	shared := &shared{cfg: cfg.withDefaults(), db: cfg.DB}
	if err := spi.Register(r, spi.Behavior[Params, Result](&Behavior{shared: shared, continuous: false})); err != nil {
		return fmt.Errorf("register replication: %w", err)
	}
	if err := spi.Register(r, spi.Behavior[Params, Result](&Behavior{shared: shared, continuous: true})); err != nil {
		return fmt.Errorf("register replication: %w", err)
	}
	return nil
}

// shared is what the two behaviors share.
type shared struct {
	cfg Config

	mu sync.Mutex
	// db is the stint database, once known.
	db *pgxpool.Pool
	// stintIdentity caches the identity of the stint database.
	stintIdentity string
}

// stintDB returns the stint database, opening it with Config.OpenDB on
// first use; nil when there is none (or it cannot be opened now, which is
// logged).
func (s *shared) stintDB(ctx context.Context) *pgxpool.Pool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.db != nil || s.cfg.OpenDB == nil {
		return s.db
	}
	db, err := s.cfg.OpenDB(ctx)
	if err != nil {
		s.cfg.Logger.Warn("stint: replication: the stint database is not available: persistent definitions are not read", "err", err)
		return nil
	}
	s.db = db
	return db
}

// Behavior is one of the two replication behaviors.
type Behavior struct {
	*shared
	continuous bool
}

var (
	_ spi.Behavior[Params, Result]   = (*Behavior)(nil)
	_ spi.PolicyProvider             = (*Behavior)(nil)
	_ spi.FailureRescheduler[Params] = (*Behavior)(nil)
	_ spi.Combiner[Params]           = (*Behavior)(nil)
	_ spi.Starter                    = (*Behavior)(nil)
)

// Kind returns OneShot or Continuous.
func (b *Behavior) Kind() api.Kind[Params, Result] { return KindFor(b.continuous) }

// TaskID returns the job id (see TaskID).
func (b *Behavior) TaskID(ids spi.IDs, p Params) api.TaskID {
	return ids.Deterministic(p.jobParts()...)
}

// Policy returns the lease (activity timeout), the transient retention and,
// for continuous replications, the rotation.
func (b *Behavior) Policy() spi.Policy {
	pol := spi.Policy{
		Lease:            b.cfg.Lease,
		BackoffMin:       b.cfg.MinBackoff,
		BackoffMax:       b.cfg.MaxBackoff,
		Retention:        b.cfg.Retention,
		FailureRetention: b.cfg.Retention,
	}
	if b.continuous {
		rot := b.cfg.Rotation
		pol.Rotation = &rot
	}
	return pol
}

// Combine merges a submit into a still scheduled task: the newer params
// win, except that a transient submit does not take over a persistent
// replication's task.
func (b *Behavior) Combine(persisted, submitted Params) Params {
	if persisted.Definition != "" && submitted.Definition == "" {
		return persisted
	}
	return submitted
}

// RescheduleAfterFailure retries a crash after the backoff penalty for the
// crash count the run reported (the "errors" property, which healing
// resets), or the engine's count of consecutive failures; a permanent
// error fails the replication.
func (b *Behavior) RescheduleAfterFailure(_ Params, te *api.TaskError, failures int) (time.Duration, bool) {
	if te == nil || !te.Retryable {
		return 0, false
	}
	n := failures
	switch v := te.Properties[propErrors].(type) {
	case int:
		n = v
	case float64:
		n = int(v)
	}
	return Penalty(b.cfg.MinBackoff, b.cfg.MaxBackoff, n), true
}

// Start reconciles the persistent definitions of this behavior with their
// tasks when a server starts (see Reconcile). Without a stint database it
// does nothing.
func (b *Behavior) Start(ctx context.Context, tasks api.Tasks) error {
	db := b.stintDB(ctx)
	if db == nil {
		return nil
	}
	if _, err := reconcile(ctx, db, tasks, b.continuous); err != nil {
		// A server must start even when its definitions cannot be read
		// (the table may not be migrated yet on an old schema).
		b.cfg.Logger.Warn("stint: replication: reconciling definitions failed", "behavior", b.Kind().ID, "err", err)
	}
	return nil
}

// propErrors is the TaskError property carrying the crash count.
const propErrors = "errors"

// decodeProgress decodes a task's progress, or returns the zero Progress.
func decodeProgress(raw json.RawMessage) (Progress, error) {
	var p Progress
	if len(raw) == 0 || string(raw) == "null" {
		return p, nil
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return p, fmt.Errorf("decode replication progress: %w", err)
	}
	return p, nil
}
