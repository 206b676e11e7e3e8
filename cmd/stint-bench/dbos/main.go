// Command stint-bench-dbos runs DBOS Transact for Go for stint-bench, as
// a child process speaking stint-bench's line protocol on its standard
// input and output (see cmd/stint-bench/child.go). It is a module of its
// own so that DBOS's dependencies stay out of stint's go.mod; stint-bench
// builds it into the user's cache folder on first use.
//
//	stint-bench-dbos worker DSN [flags]  on "go" launches DBOS and runs the
//	                                     no-op workflow from the queue,
//	                                     reporting "ran N"
//	stint-bench-dbos client DSN [flags]  only enqueues (the schema must
//	                                     exist: start a worker first)
//	stint-bench-dbos bench DSN [flags]   launched DBOS and a client in one
//	                                     process, for the scenarios that
//	                                     time both ends on one clock
//
// Worker and client answer "add N CHUNK": N no-op workflows enqueued,
// CHUNK in each transaction (Enqueue with WithEnqueueTransaction), then
// "ok" or "error MESSAGE". The bench process answers, each with "ok JSON"
// (durations in microseconds) or "error MESSAGE":
//
//	latency RATE TOTAL       TOTAL single enqueues at RATE a second from
//	                         the client: enqueue returned, workflow
//	                         started, GetResult returned
//	resume N                 N workflows asleep in Recv, then one Send at a
//	                         time, each after the last one's Recv returned:
//	                         Send's call to Recv's return
//	throughput N SENDERS [bulk]
//	                         N workflows asleep in Recv; SENDERS goroutines
//	                         send each a message (bulk: SendBulk in chunks
//	                         of 1,000): until the last Send returned and
//	                         until all N workflows succeeded
//	events K GAP             one workflow sets K events, each GAP after a
//	                         client's GetEvent began waiting for it:
//	                         SetEvent's call to GetEvent's return
//
// Closing standard input stops the process.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	appName   = "stint-bench"
	queueName = "bench"
	topic     = "go"
	// wfNoop, wfWait and wfEvents name the registered workflows.
	wfNoop   = "noop"
	wfWait   = "wait"
	wfEvents = "events"
)

// config is what the flags set.
type config struct {
	mode, dsn   string
	poll        time.Duration // the queue's base polling interval
	concurrency int           // the queue's worker concurrency
	coalesce    time.Duration // Config.NotificationCoalesceInterval
	verbose     bool
}

// runner is the process's DBOS state; the workflows reach it through the
// package variable r, since DBOS registers plain functions.
type runner struct {
	cfg    config
	ctx    dbos.Context // launched in worker and bench modes
	client dbos.Client  // client and bench modes
	pool   *pgxpool.Pool

	ran     atomic.Int64
	armed   atomic.Bool
	starts  sync.Map // workflow id -> time.Time its run began (when armed)
	resumed sync.Map // workflow id -> chan time.Time, told when its Recv returned

	gate  chan struct{}  // the events workflow sets its next event when told
	setAt chan time.Time // when it called SetEvent, in order
}

var r *runner

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "stint-bench-dbos:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 2 {
		return errors.New("usage: stint-bench-dbos worker|client|bench DSN [flags]")
	}
	cfg := config{mode: args[0], dsn: args[1]}
	fs := flag.NewFlagSet("stint-bench-dbos", flag.ContinueOnError)
	fs.DurationVar(&cfg.poll, "poll", time.Second, "the queue's base polling interval (DBOS's default: 1s)")
	fs.IntVar(&cfg.concurrency, "concurrency", 0, "the queue's worker concurrency (0: no limit, DBOS's default)")
	fs.DurationVar(&cfg.coalesce, "coalesce", 0, "Config.NotificationCoalesceInterval (0: DBOS's default, 10ms)")
	fs.BoolVar(&cfg.verbose, "v", false, "log DBOS's warnings")
	if err := fs.Parse(args[2:]); err != nil {
		return err
	}
	ctx := context.Background()
	r = &runner{cfg: cfg}
	defer r.close()
	if err := r.open(ctx); err != nil {
		return err
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		line := in.Text()
		if line == "go" {
			if err := r.launch(); err != nil {
				return err
			}
			go r.reportRan(ctx)
			continue
		}
		answer, err := r.do(ctx, strings.Fields(line))
		switch {
		case err != nil:
			fmt.Printf("error %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		case answer == "":
			fmt.Println("ok")
		default:
			fmt.Println("ok " + answer)
		}
	}
	return nil
}

// open builds the DBOS context, client and pool the mode needs.
func (r *runner) open(ctx context.Context) error {
	level := slog.LevelError
	if r.cfg.verbose {
		level = slog.LevelWarn
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	var err error
	if r.pool, err = pgxpool.New(ctx, r.cfg.dsn); err != nil {
		return fmt.Errorf("open a pool: %w", err)
	}
	if r.cfg.mode == "worker" || r.cfg.mode == "bench" {
		r.ctx, err = dbos.NewContext(ctx, dbos.Config{
			AppName:                      appName,
			DatabaseURL:                  r.cfg.dsn,
			ExecutorID:                   fmt.Sprintf("stint-bench-%d", os.Getpid()),
			Logger:                       log,
			NotificationCoalesceInterval: r.cfg.coalesce,
		})
		if err != nil {
			return fmt.Errorf("DBOS context: %w", err)
		}
		dbos.RegisterWorkflow(r.ctx, noopWorkflow, dbos.WithWorkflowName(wfNoop))
		dbos.RegisterWorkflow(r.ctx, waitWorkflow, dbos.WithWorkflowName(wfWait))
		dbos.RegisterWorkflow(r.ctx, eventsWorkflow, dbos.WithWorkflowName(wfEvents))
		opts := []dbos.QueueOption{dbos.WithQueueBasePollingInterval(r.cfg.poll)}
		if r.cfg.concurrency > 0 {
			opts = append(opts, dbos.WithWorkerConcurrency(r.cfg.concurrency))
		}
		if _, err := dbos.RegisterQueue(r.ctx, queueName, opts...); err != nil {
			return fmt.Errorf("register the queue: %w", err)
		}
	}
	switch r.cfg.mode {
	case "worker":
		return nil
	case "bench":
		if err := r.launch(); err != nil {
			return err
		}
	case "client":
	default:
		return fmt.Errorf("unknown mode %q: want worker, client or bench", r.cfg.mode)
	}
	r.client, err = dbos.NewClient(ctx, dbos.ClientConfig{DatabaseURL: r.cfg.dsn, AppName: appName, Logger: log})
	if err != nil {
		return fmt.Errorf("DBOS client: %w", err)
	}
	return nil
}

func (r *runner) launch() error {
	if err := dbos.Launch(r.ctx); err != nil {
		return fmt.Errorf("launch DBOS: %w", err)
	}
	return nil
}

func (r *runner) close() {
	if r.client != nil {
		_ = dbos.Shutdown(r.client, 30*time.Second)
	}
	if r.ctx != nil {
		_ = dbos.Shutdown(r.ctx, 30*time.Second)
	}
	if r.pool != nil {
		r.pool.Close()
	}
}

// reportRan prints "ran N" whenever the count of runs changed, every 10 ms.
func (r *runner) reportRan(ctx context.Context) {
	var last int64
	for {
		time.Sleep(10 * time.Millisecond)
		if n := r.ran.Load(); n != last {
			last = n
			fmt.Printf("ran %d\n", n)
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// do runs one command and returns its answer.
func (r *runner) do(ctx context.Context, f []string) (string, error) {
	if len(f) == 0 {
		return "", errors.New("empty command")
	}
	nums := make([]int, 0, len(f)-1)
	var durs []time.Duration
	for _, s := range f[1:] {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			nums = append(nums, n)
		} else if d, err := time.ParseDuration(s); err == nil {
			durs = append(durs, d)
		}
	}
	var out any
	var err error
	switch {
	case f[0] == "add" && len(nums) == 2:
		return "", r.add(ctx, nums[0], nums[1])
	case f[0] == "latency" && len(nums) == 2 && r.cfg.mode == "bench":
		out, err = r.latency(ctx, nums[0], nums[1])
	case f[0] == "resume" && len(nums) == 1 && r.cfg.mode == "bench":
		out, err = r.resume(ctx, nums[0])
	case f[0] == "throughput" && len(nums) == 2 && r.cfg.mode == "bench":
		out, err = r.throughput(ctx, nums[0], nums[1], len(f) == 4 && f[3] == "bulk")
	case f[0] == "events" && len(nums) == 1 && len(durs) == 1 && r.cfg.mode == "bench":
		out, err = r.events(ctx, nums[0], durs[0])
	default:
		return "", fmt.Errorf("bad command %q in mode %s", strings.Join(f, " "), r.cfg.mode)
	}
	if err != nil {
		return "", err
	}
	raw, err := json.Marshal(out)
	return string(raw), err
}

// add enqueues n no-op workflows, chunk to a transaction.
func (r *runner) add(ctx context.Context, n, chunk int) error {
	c := r.client
	if c == nil {
		c = r.ctx
	}
	for left := n; left > 0; {
		k := min(left, chunk)
		tx, err := r.pool.Begin(ctx)
		if err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		for range k {
			if _, err := dbos.Enqueue[int](c, queueName, wfNoop, 0, dbos.WithEnqueueTransaction(tx)); err != nil {
				_ = tx.Rollback(ctx)
				return fmt.Errorf("enqueue: %w", err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return fmt.Errorf("commit %d enqueues: %w", k, err)
		}
		left -= k
	}
	return nil
}

// ---- workflows

func noopWorkflow(ctx dbos.Context, _ int) (int, error) {
	r.ran.Add(1)
	if r.armed.Load() {
		if id, err := dbos.GetWorkflowID(ctx); err == nil {
			r.starts.LoadOrStore(id, time.Now())
		}
	}
	return 0, nil
}

func waitWorkflow(ctx dbos.Context, _ int) (string, error) {
	msg, err := dbos.Recv[string](ctx, topic, time.Hour)
	if err != nil {
		return "", err
	}
	now := time.Now()
	if id, err := dbos.GetWorkflowID(ctx); err == nil {
		if ch, ok := r.resumed.Load(id); ok {
			ch.(chan time.Time) <- now
		}
	}
	return msg, nil
}

func eventsWorkflow(ctx dbos.Context, k int) (int, error) {
	for i := range k {
		select {
		case <-r.gate:
		case <-ctx.Done():
			return i, ctx.Err()
		}
		r.setAt <- time.Now()
		if err := dbos.SetEvent(ctx, eventKey(i), i); err != nil {
			return i, err
		}
	}
	return k, nil
}

func eventKey(i int) string { return fmt.Sprintf("e%d", i) }

// ---- scenarios

// micros converts durations to whole microseconds for the answer.
func micros(ds []time.Duration) []int64 {
	out := make([]int64, len(ds))
	for i, d := range ds {
		out[i] = d.Microseconds()
	}
	return out
}

// latency enqueues total workflows at rate a second, each in a goroutine
// of its own, and times each: enqueue returned, run began, result read.
func (r *runner) latency(ctx context.Context, rate, total int) (any, error) {
	r.armed.Store(true)
	defer r.armed.Store(false)
	at := make([]time.Time, total)
	stored, awaited := make([]time.Duration, total), make([]time.Duration, total)
	errs := make([]error, total)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range total {
		time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))))
		wg.Add(1)
		go func() {
			defer wg.Done()
			at[i] = time.Now()
			h, err := dbos.Enqueue[int](r.client, queueName, wfNoop, 0, dbos.WithEnqueueWorkflowID(fmt.Sprintf("lat-%07d", i)))
			if err != nil {
				errs[i] = err
				return
			}
			stored[i] = time.Since(at[i])
			_, errs[i] = h.GetResult(dbos.WithHandlePollingInterval(r.cfg.poll), dbos.WithHandleTimeout(time.Minute))
			awaited[i] = time.Since(at[i])
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	started := make([]time.Duration, total)
	for i := range total {
		t, ok := r.starts.Load(fmt.Sprintf("lat-%07d", i))
		if !ok {
			return nil, fmt.Errorf("workflow lat-%07d ran unseen", i)
		}
		started[i] = t.(time.Time).Sub(at[i])
	}
	return map[string][]int64{"stored": micros(stored), "start": micros(started), "await": micros(awaited)}, nil
}

// startWaiting starts n wait workflows called prefix-<i> and returns once
// each is asleep in Recv: it recorded the deadline of its wait, the step
// Recv writes before it waits.
func (r *runner) startWaiting(ctx context.Context, prefix string, n int, told bool) ([]string, error) {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%06d", prefix, i)
		if told {
			r.resumed.Store(ids[i], make(chan time.Time, 1))
		}
	}
	const starters = 16
	errs := make([]error, starters)
	var wg sync.WaitGroup
	for s := range starters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := s; i < n; i += starters {
				if _, err := dbos.RunWorkflow(r.ctx, waitWorkflow, i, dbos.WithWorkflowID(ids[i])); err != nil {
					errs[s] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("start the waiting workflows: %w", err)
	}
	q := `SELECT count(*) >= $2 FROM dbos.operation_outputs WHERE function_name = 'DBOS.sleep' AND workflow_uuid LIKE $1 || '-%'`
	if err := r.until(ctx, 5*time.Minute, q, prefix, n); err != nil {
		return nil, fmt.Errorf("wait for %d workflows asleep in Recv: %w", n, err)
	}
	return ids, nil
}

// until runs the boolean query q every 5 ms until it holds.
func (r *runner) until(ctx context.Context, timeout time.Duration, q string, args ...any) error {
	deadline := time.Now().Add(timeout)
	for {
		var ok bool
		if err := r.pool.QueryRow(ctx, q, args...).Scan(&ok); err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s", timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// resume wakes n sleeping workflows one at a time.
func (r *runner) resume(ctx context.Context, n int) (any, error) {
	ids, err := r.startWaiting(ctx, "resume", n, true)
	if err != nil {
		return nil, err
	}
	samples := make([]time.Duration, n)
	for i, id := range ids {
		ch, _ := r.resumed.Load(id)
		t0 := time.Now()
		if err := dbos.Send(r.client, id, "x", topic); err != nil {
			return nil, fmt.Errorf("send to %s: %w", id, err)
		}
		select {
		case t1 := <-ch.(chan time.Time):
			samples[i] = t1.Sub(t0)
		case <-time.After(time.Minute):
			return nil, fmt.Errorf("%s did not resume within a minute", id)
		}
	}
	return map[string][]int64{"samples": micros(samples)}, nil
}

// throughput sends each of n sleeping workflows a message from senders
// goroutines and times the sends and the workflows' ends.
func (r *runner) throughput(ctx context.Context, n, senders int, bulk bool) (any, error) {
	ids, err := r.startWaiting(ctx, "many", n, false)
	if err != nil {
		return nil, err
	}
	errs := make([]error, senders)
	var next atomic.Int64
	const chunk = 1_000
	start := time.Now()
	var wg sync.WaitGroup
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if bulk {
					lo := int(next.Add(chunk)) - chunk
					if lo >= n {
						return
					}
					msgs := make([]dbos.SendMessage, 0, chunk)
					for _, id := range ids[lo:min(lo+chunk, n)] {
						msgs = append(msgs, dbos.SendMessage{DestinationID: id, Message: "x", Topic: topic})
					}
					if errs[s] = dbos.SendBulk(r.client, msgs); errs[s] != nil {
						return
					}
					continue
				}
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if errs[s] = dbos.Send(r.client, ids[i], "x", topic); errs[s] != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	sent := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("send: %w", err)
	}
	q := `SELECT count(*) >= $1 FROM dbos.workflow_status WHERE status = 'SUCCESS' AND name = '` + wfWait + `'`
	if err := r.until(ctx, 10*time.Minute, q, n); err != nil {
		return nil, fmt.Errorf("wait for %d workflows to end: %w", n, err)
	}
	all := time.Since(start)
	return map[string]int64{"sent": sent.Microseconds(), "all": all.Microseconds()}, nil
}

// events has one workflow set k events, each gap after a GetEvent of the
// client began waiting for it.
func (r *runner) events(ctx context.Context, k int, gap time.Duration) (any, error) {
	r.gate, r.setAt = make(chan struct{}), make(chan time.Time, k)
	h, err := dbos.RunWorkflow(r.ctx, eventsWorkflow, k, dbos.WithWorkflowID("events"))
	if err != nil {
		return nil, fmt.Errorf("start the events workflow: %w", err)
	}
	samples := make([]time.Duration, k)
	for i := range k {
		got := make(chan error, 1)
		var t1 time.Time
		go func() {
			_, err := dbos.GetEvent[int](r.client, "events", eventKey(i), time.Minute)
			t1 = time.Now()
			got <- err
		}()
		time.Sleep(gap)
		r.gate <- struct{}{}
		if err := <-got; err != nil {
			return nil, fmt.Errorf("get event %d: %w", i, err)
		}
		samples[i] = t1.Sub(<-r.setAt)
	}
	if _, err := h.GetResult(); err != nil {
		return nil, fmt.Errorf("the events workflow: %w", err)
	}
	return map[string][]int64{"samples": micros(samples)}, nil
}
