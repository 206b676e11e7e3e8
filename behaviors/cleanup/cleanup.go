// Package cleanup holds the built-in behavior cleanup: one singleton task
// that deletes finished tasks past their behavior's retention and then
// reschedules itself. The rest of the upkeep (dropping dead nodes and feed
// consumers, trimming the change feed) is every server's own
// (impl.Maintenance), so it happens whether or not cleanup runs.
//
// The task has a deterministic id and the Polaris dedup (spi.DedupShare),
// so every server that starts submits it (spi.Starter) and there is one
// task however many servers do; its lease makes sure one node at a time
// runs it. A run goes through the behaviors of the registry it was built
// with and, for each, deletes the tasks that succeeded for good longer ago
// than the behavior's Policy.Retention and those that failed for good
// longer ago than its Policy.FailureRetention (defaults: 7 and 30 days), in
// small batches (store.DeleteFinished, which skips locked rows and never
// waits), each its own short statement, until a batch comes back short. A
// successful run is due again Config.Interval after it began (5 minutes by
// default; at once when it took longer), so that a finished task is kept
// at most about an interval past its retention however long the runs take
// under the load; a failed one is retried with backoff, never given up.
//
// A task submitted with a retention of its own (api.SubmitRequest.Retention)
// is kept that long after it finished for good, whatever its outcome, in
// place of its behavior's; a run deletes those past it too, whatever their
// behavior (store.DeleteExpired).
//
// Other tasks of behaviors the registry does not hold are not deleted:
// their retention is unknown.
package cleanup

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
)

// BehaviorID is the cleanup behavior's id.
const BehaviorID api.BehaviorID = "cleanup"

// Kind is the kind of the cleanup behavior.
var Kind = api.Kind[Params, Result]{ID: BehaviorID}

// Params are the cleanup task's params: none.
type Params struct{}

// Result is what a cleanup run did.
type Result struct {
	// Deleted counts the tasks deleted per behavior and status, e.g.
	// "demo.echo/success".
	Deleted map[string]int `json:"deleted,omitempty"`
	// DeletedTotal is the sum of Deleted.
	DeletedTotal int `json:"deleted_total"`
	// Batches counts the delete statements.
	Batches int `json:"batches"`
	// LongestBatch is the longest a delete statement took: about how long
	// its row locks were held. In JSON, in milliseconds.
	LongestBatch time.Duration `json:"-"`
	LongestMS    float64       `json:"longest_batch_ms"`
	// Took is how long the run took. In JSON, in milliseconds.
	Took   time.Duration `json:"-"`
	TookMS float64       `json:"took_ms"`
}

// Config configures the cleanup behavior. Zero fields take the defaults.
type Config struct {
	// Interval is the time from the start of a run to the start of the
	// next. Defaults to 5 minutes.
	Interval time.Duration
	// BatchSize caps the tasks one delete statement removes. Defaults to
	// 1,000: small enough that no statement holds its row locks long.
	BatchSize int
	// BatchPause is a pause between delete statements, to leave the
	// database to others during a large cleanup. Defaults to none.
	BatchPause time.Duration
	// Lease is the cleanup task's lease. Defaults to 30 seconds.
	Lease time.Duration
	// Logger receives the behavior's logs. Defaults to slog.Default().
	Logger *slog.Logger

	// observe, when set, is called at the start (true) and end (false) of
	// every run, for tests.
	observe func(start bool)
}

// Defaults of Config.
const (
	DefaultInterval  = 5 * time.Minute
	DefaultBatchSize = 1000
)

func (c Config) withDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = DefaultInterval
	}
	if c.BatchSize <= 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.Lease <= 0 {
		c.Lease = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Store is what the cleanup needs of the store; a store.Store has it.
type Store interface {
	DeleteFinished(ctx context.Context, p store.DeleteFinishedParams) (int, error)
	DeleteExpired(ctx context.Context, limit int) (map[string]int, error)
}

var _ Store = store.Store(nil)

// Cleanup is the cleanup behavior.
type Cleanup struct {
	st  Store
	reg *spi.Registry
	cfg Config
}

var (
	_ spi.Behavior[Params, Result]           = (*Cleanup)(nil)
	_ spi.PolicyProvider                     = (*Cleanup)(nil)
	_ spi.Starter                            = (*Cleanup)(nil)
	_ spi.SuccessRescheduler[Params, Result] = (*Cleanup)(nil)
	_ spi.FailureRescheduler[Params]         = (*Cleanup)(nil)
)

// New returns the cleanup behavior deleting, from st, the finished tasks of
// the behaviors in reg (read at each run, so behaviors registered after it
// count too).
func New(st Store, reg *spi.Registry, cfg Config) *Cleanup {
	return &Cleanup{st: st, reg: reg, cfg: cfg.withDefaults()}
}

// Register adds the cleanup behavior on st to r, for the behaviors of r.
func Register(r *spi.Registry, st Store, cfg Config) error {
	if st == nil {
		return fmt.Errorf("register cleanup: no store")
	}
	if err := spi.Register(r, spi.Behavior[Params, Result](New(st, r, cfg))); err != nil {
		return fmt.Errorf("register cleanup: %w", err)
	}
	return nil
}

// TaskID returns the singleton's id, the same for every submit.
func TaskID() api.TaskID { return spi.NewIDs(BehaviorID).Deterministic("singleton") }

// Kind returns Kind.
func (c *Cleanup) Kind() api.Kind[Params, Result] { return Kind }

// TaskID returns the singleton's id.
func (c *Cleanup) TaskID(ids spi.IDs, _ Params) api.TaskID { return ids.Deterministic("singleton") }

// Policy makes every submit share the one task.
func (c *Cleanup) Policy() spi.Policy {
	return spi.Policy{Lease: c.cfg.Lease, Dedup: spi.DedupShare, MaxConcurrency: 1}
}

// Start submits the singleton; when it exists, the submit changes nothing.
func (c *Cleanup) Start(ctx context.Context, tasks api.Tasks) error {
	if _, err := tasks.Submit(ctx, api.SubmitRequest{Behavior: BehaviorID, Params: []byte(`{}`)}); err != nil {
		return fmt.Errorf("submit the cleanup task: %w", err)
	}
	return nil
}

// RescheduleAfterSuccess runs the cleanup again an interval after the run
// r began, or at once when it took longer.
func (c *Cleanup) RescheduleAfterSuccess(_ Params, r Result) (time.Duration, bool) {
	return max(c.cfg.Interval-r.Took, 0), true
}

// RescheduleAfterFailure retries after a backoff up to the interval: the
// singleton never fails for good.
func (c *Cleanup) RescheduleAfterFailure(_ Params, _ *api.TaskError, failures int) (time.Duration, bool) {
	return spi.Backoff(min(time.Second, c.cfg.Interval), c.cfg.Interval, failures), true
}

// Run deletes the expired finished tasks of every behavior and maintains
// the feed and the nodes table.
func (c *Cleanup) Run(ctx context.Context, _ spi.RunContext, _ Params) (Result, error) {
	if c.cfg.observe != nil {
		c.cfg.observe(true)
		defer c.cfg.observe(false)
	}
	start := time.Now()
	res := Result{Deleted: map[string]int{}}
	for _, id := range c.reg.IDs() {
		reg, ok := c.reg.Lookup(id)
		if !ok {
			continue
		}
		for _, s := range []struct {
			status api.Status
			keep   time.Duration
		}{{api.StatusSuccess, reg.Policy.Retention}, {api.StatusFailure, reg.Policy.FailureRetention}} {
			n, err := c.deleteFinished(ctx, &res, id, s.status, s.keep)
			if n > 0 {
				res.Deleted[string(id)+"/"+string(s.status)] = n
			}
			if err != nil {
				return res, err
			}
		}
	}
	if err := c.deleteExpired(ctx, &res); err != nil {
		return res, err
	}
	res.Took = time.Since(start)
	res.TookMS = float64(res.Took.Microseconds()) / 1000
	res.LongestMS = float64(res.LongestBatch.Microseconds()) / 1000
	if res.DeletedTotal > 0 {
		c.cfg.Logger.Info("stint: cleanup", "deleted", res.DeletedTotal, "batches", res.Batches, "took", res.Took)
	}
	return res, nil
}

// deleteFinished deletes the tasks of behavior that ended with status
// longer than keep ago, a batch at a time until a batch comes back short.
func (c *Cleanup) deleteFinished(ctx context.Context, res *Result, behavior api.BehaviorID, status api.Status, keep time.Duration) (int, error) {
	total := 0
	for {
		began := time.Now()
		n, err := c.st.DeleteFinished(ctx, store.DeleteFinishedParams{Behavior: behavior, Status: status, OlderThan: keep, Limit: c.cfg.BatchSize})
		res.LongestBatch = max(res.LongestBatch, time.Since(began))
		if err != nil {
			return total, fmt.Errorf("cleanup: %w", err)
		}
		res.Batches++
		total += n
		res.DeletedTotal += n
		if n < c.cfg.BatchSize {
			return total, nil
		}
		if err := c.pause(ctx); err != nil {
			return total, err
		}
	}
}

// deleteExpired deletes the tasks past their own retention, a batch at a
// time until a batch comes back short.
func (c *Cleanup) deleteExpired(ctx context.Context, res *Result) error {
	for {
		began := time.Now()
		deleted, err := c.st.DeleteExpired(ctx, c.cfg.BatchSize)
		res.LongestBatch = max(res.LongestBatch, time.Since(began))
		if err != nil {
			return fmt.Errorf("cleanup: %w", err)
		}
		res.Batches++
		n := 0
		for k, v := range deleted {
			res.Deleted[k] += v
			n += v
		}
		res.DeletedTotal += n
		if n < c.cfg.BatchSize {
			return nil
		}
		if err := c.pause(ctx); err != nil {
			return err
		}
	}
}

// pause waits BatchPause, or returns early when ctx ends.
func (c *Cleanup) pause(ctx context.Context) error {
	if err := context.Cause(ctx); err != nil {
		return err
	}
	if c.cfg.BatchPause <= 0 {
		return nil
	}
	return spi.Sleep(ctx, c.cfg.BatchPause)
}
