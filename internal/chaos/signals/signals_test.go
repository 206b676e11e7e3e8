package signals

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/chaos"
	"github.com/stinthq/stint/spi"
)

// receiverParams are the params of chaos.signals: task N receives K
// messages.
type receiverParams struct {
	N int `json:"n"`
	K int `json:"k"`
}

var receiverKind = api.Kind[receiverParams, int]{ID: "chaos.signals"}

// topic is the topic of chaos.signals' messages.
const topic = "msg"

// maxWait is the longest wait of chaos.signals: past the test's deadline,
// so that only a signal wakes a sleeping task.
const maxWait = time.Hour

// message is a signal's payload: its index among its task's messages, in
// the order they were sent.
type message struct {
	I int `json:"i"`
}

// receiver is chaos.signals. A run records itself in chaos_signal_run
// (its attempt, how many messages its task had consumed, whether its
// first receive found one), then takes its task's messages one by one,
// each written in chaos_signal_ledger in the transaction of the
// checkpoint that consumes it, after some work before and inside that
// transaction (where the faults strike). With none left it records that
// it waits and sleeps on the topic; with K consumed it succeeds.
type receiver struct {
	pool *pgxpool.Pool
	node string
}

func (receiver) Kind() api.Kind[receiverParams, int]             { return receiverKind }
func (receiver) TaskID(ids spi.IDs, p receiverParams) api.TaskID { return ids.Deterministic(p.N) }
func (receiver) Policy() spi.Policy {
	return spi.Policy{Lease: chaos.Lease, MaxAttempts: 1000, BackoffMin: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond}
}

func (r receiver) Run(ctx context.Context, rc spi.RunContext, p receiverParams) (int, error) {
	var got int
	if _, err := rc.Progress(&got); err != nil {
		return 0, err
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	run := hex.EncodeToString(b)
	receive := func() (api.Signal, bool, error) {
		if got >= p.K {
			return api.Signal{}, false, nil
		}
		sg, ok, err := rc.Receive(ctx, topic)
		if err != nil {
			return sg, false, api.Retryable("receive", "receive: %v", err)
		}
		return sg, ok, nil
	}
	sg, ok, err := receive()
	if err != nil {
		return 0, err
	}
	if _, err := r.pool.Exec(ctx, `INSERT INTO chaos_signal_run (run_id, task_id, node, attempt, got, found, started)
		VALUES ($1, $2, $3, $4, $5, $6, clock_timestamp())`, run, string(rc.TaskID()), r.node, rc.Attempt(), got, ok); err != nil {
		return 0, api.Retryable("record", "record start: %v", err)
	}
	for got < p.K {
		if !ok {
			if _, err := r.pool.Exec(ctx, `UPDATE chaos_signal_run SET waited = clock_timestamp() WHERE run_id = $1`, run); err != nil {
				return 0, api.Retryable("record", "record wait: %v", err)
			}
			return 0, spi.WaitForSignal(topic, maxWait)
		}
		var m message
		if err := json.Unmarshal(sg.Payload, &m); err != nil {
			return 0, fmt.Errorf("decode message %d: %w", sg.Seq, err)
		}
		if err := work(ctx, 30); err != nil {
			return 0, err
		}
		err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO chaos_signal_ledger (task_id, seq, i, run_id, at) VALUES ($1, $2, $3, $4, now())`,
				string(rc.TaskID()), sg.Seq, m.I, run); err != nil {
				return err
			}
			if err := work(ctx, 20); err != nil {
				return err
			}
			if err := rc.CheckpointTx(ctx, tx, got+1); err != nil {
				return err
			}
			return work(ctx, 20)
		})
		if err != nil {
			return 0, api.Retryable("ledger", "write message %d: %v", sg.Seq, err)
		}
		got++
		if sg, ok, err = receive(); err != nil {
			return 0, err
		}
	}
	if _, err := r.pool.Exec(ctx, `UPDATE chaos_signal_run SET ended = clock_timestamp() WHERE run_id = $1`, run); err != nil {
		return 0, api.Retryable("record", "record end: %v", err)
	}
	return got, nil
}

// work takes up to maxMS milliseconds, or until ctx ends.
func work(ctx context.Context, maxMS int) error {
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(time.Duration(mrand.IntN(maxMS+1)) * time.Millisecond):
		return nil
	}
}

// faults are the times, by the database's clock, at which a node was
// killed or stopped. Safe for concurrent use.
type faults struct {
	mu sync.Mutex
	at []time.Time
}

func (f *faults) add(at time.Time) {
	f.mu.Lock()
	f.at = append(f.at, at)
	f.mu.Unlock()
}

// sender signals a task its messages 0..k-1 in order, each under its
// own idempotency key, each once acknowledged before the next, at random
// gaps (a quarter of them none, so that messages also come while the
// task runs); some it sends twice, right away or after the next, always
// before the last (whose consumption may end the task, which then
// refuses any signal). It returns how many it sent twice.
func sender(c *chaos.Cluster, id api.TaskID, k int, rng *mrand.Rand) int {
	send := func(i int) {
		for {
			err := c.Client.Signal(c.Ctx, id, topic, message{I: i}, api.SignalKey(fmt.Sprint("m-", i)))
			if err == nil {
				return
			}
			require.False(c.T, errors.Is(err, api.ErrConflict) || errors.Is(err, api.ErrNotFound) || errors.Is(err, api.ErrInvalid),
				"signal %d to %s: %v", i, id, err)
			require.NoError(c.T, c.Ctx.Err(), "gave up signalling %d to %s: %v", i, id, err)
			time.Sleep(50 * time.Millisecond) // backoff between retries of a failed signal, which its key makes safe
		}
	}
	twice := 0
	for i := range k {
		if rng.IntN(4) > 0 {
			time.Sleep(time.Duration(rng.IntN(900)) * time.Millisecond) // the workload's pace
		}
		send(i)
		if i >= k-2 {
			continue
		}
		switch rng.IntN(5) {
		case 0:
			send(i)
			twice++
		case 1:
			if i > 0 {
				send(i - 1)
				twice++
			}
		}
	}
	return twice
}

// Tasks receive signals while nodes are killed and stopped: three node
// processes run N tasks of chaos.signals, each waiting for K messages,
// while a sender signals each task its messages (some twice), each of the
// first two nodes is killed with SIGKILL and started again every 2 s, a
// second apart, and the third is stopped with SIGSTOP every 2 s,
// alternately within its lease and past it. The ledger shows every
// message consumed exactly once, in the order sent, by a run that
// committed (its row was written in the transaction that consumed it),
// none left unconsumed, every task succeeded within a bound of the last
// signal (no wait never woken), and no run woken with nothing to
// receive.
func TestSignalsUnderFaults(t *testing.T) {
	tasks, k := 40, 10
	if *chaos.Long {
		tasks, k = 200, 20
	}
	c := chaos.NewCluster(t)
	_, err := c.Pool.Exec(c.Ctx, `
		CREATE TABLE chaos_signal_run (run_id text PRIMARY KEY, task_id text NOT NULL, node text NOT NULL, attempt int NOT NULL,
			got int NOT NULL, found bool NOT NULL, started timestamptz NOT NULL, waited timestamptz, ended timestamptz);
		CREATE TABLE chaos_signal_ledger (id bigserial PRIMARY KEY, task_id text NOT NULL, seq bigint NOT NULL, i int NOT NULL,
			run_id text NOT NULL, at timestamptz NOT NULL)`)
	require.NoError(t, err)
	c.StartAll()
	reqs := make([]api.SubmitRequest, tasks)
	for n := range reqs {
		reqs[n] = api.SubmitRequest{Behavior: receiverKind.ID, Params: fmt.Appendf(nil, `{"n":%d,"k":%d}`, n, k)}
	}
	subs, err := c.Client.SubmitMany(c.Ctx, reqs)
	require.NoError(t, err)
	ids := make([]string, len(subs))
	for i, s := range subs {
		ids[i] = string(s.ID)
	}

	stop := make(chan struct{})
	var (
		hits   faults
		faulty sync.WaitGroup
	)
	for i, n := range c.Nodes[:2] {
		// A killer a node, so that one node's restart does not hold up
		// the other's kill.
		faulty.Go(func() {
			chaos.Every(stop, time.Duration(i+1)*time.Second, 2*time.Second, func() {
				hits.add(c.Clock())
				c.Sigkill(n)
				c.Start(n)
			})
		})
	}
	faulty.Go(func() {
		n, long := c.Nodes[2], false
		chaos.Every(stop, 300*time.Millisecond, 2*time.Second, func() {
			hits.add(c.Clock())
			require.NoError(t, n.Cmd.Process.Signal(syscall.SIGSTOP))
			d := chaos.Lease / 3
			if long = !long; long {
				d = chaos.Lease + chaos.Lease/2
			}
			time.Sleep(d) // the fault: frozen within the lease, or past it
			require.NoError(t, n.Cmd.Process.Signal(syscall.SIGCONT))
		})
	})
	var (
		senders sync.WaitGroup
		twice   int
		mu      sync.Mutex
	)
	for n, s := range subs {
		senders.Go(func() {
			d := sender(c, s.ID, k, mrand.New(mrand.NewPCG(uint64(n), 47)))
			mu.Lock()
			twice += d
			mu.Unlock()
		})
	}
	senders.Wait()
	sent := time.Now()
	close(stop)
	faulty.Wait()

	// Every task ends within a bound of the last signal: a wait that no
	// signal woke would sleep for maxWait.
	count := func(q string, args ...any) int {
		var n int
		require.NoError(t, c.Pool.QueryRow(c.Ctx, q, args...).Scan(&n))
		return n
	}
	bound := 30*chaos.Lease + 15*time.Second
	done := 0
	for done < tasks && time.Since(sent) < bound {
		time.Sleep(100 * time.Millisecond) // polling the database for the end, bounded by the deadline
		done = count(`SELECT count(*) FROM stint_task WHERE id = ANY($1) AND status = 'success' AND result = to_jsonb($2::int)`, ids, k)
	}
	ended := time.Since(sent)
	require.Equal(t, tasks, done, "tasks succeeded, with K messages, within %s of the last signal", bound)

	// Every message stored once (a second signal of a key stored nothing)
	// and consumed.
	require.Equal(t, tasks*k, count(`SELECT count(*) FROM stint_signal WHERE task_id = ANY($1)`, ids), "messages stored")
	require.Zero(t, count(`SELECT count(*) FROM (SELECT task_id FROM stint_signal WHERE task_id = ANY($1)
		GROUP BY task_id HAVING count(*) <> $2) x`, ids, k), "tasks without exactly K messages")
	require.Zero(t, count(`SELECT count(*) FROM stint_signal WHERE task_id = ANY($1) AND consumed_at IS NULL`, ids),
		"messages left unconsumed")
	// Each consumed exactly once, by a run that committed: its ledger row
	// was written in the transaction that consumed it (the same now()).
	require.Equal(t, tasks*k, count(`SELECT count(*) FROM chaos_signal_ledger`), "ledger rows")
	require.Zero(t, count(`SELECT count(*) FROM (SELECT 1 FROM chaos_signal_ledger GROUP BY task_id, seq HAVING count(*) > 1) x`),
		"messages written twice")
	require.Zero(t, count(`SELECT count(*) FROM (SELECT 1 FROM chaos_signal_ledger GROUP BY task_id, i HAVING count(*) > 1) x`),
		"payloads written twice")
	require.Equal(t, tasks*k, count(`SELECT count(*) FROM chaos_signal_ledger l
		JOIN stint_signal s ON s.task_id = l.task_id AND s.seq = l.seq
		WHERE (s.payload->>'i')::int = l.i AND s.consumed_at = l.at`), "ledger rows committed with their message's consumption")
	require.Zero(t, count(`SELECT count(*) FROM chaos_signal_ledger l
		WHERE NOT EXISTS (SELECT 1 FROM chaos_signal_run r WHERE r.run_id = l.run_id)`), "ledger rows of no recorded run")
	// In the order sent: the i-th row of a task is its message i, and the
	// messages' seq grow with i.
	require.Zero(t, count(`SELECT count(*) FROM (
		SELECT i, row_number() OVER w - 1 AS pos, seq, lag(seq) OVER w AS prev FROM chaos_signal_ledger
		WINDOW w AS (PARTITION BY task_id ORDER BY id)) x WHERE i <> pos OR seq <= prev`), "messages out of order")

	waits, woken, empty := wakes(t, c)

	// How long messages waited, from their store to their consumption, in
	// milliseconds.
	var lat struct{ P50, P99, Max int }
	require.NoError(t, c.Pool.QueryRow(c.Ctx, `SELECT
		percentile_disc(0.5) WITHIN GROUP (ORDER BY ms), percentile_disc(0.99) WITHIN GROUP (ORDER BY ms), max(ms)
		FROM (SELECT (extract(epoch FROM consumed_at - at) * 1000)::int AS ms FROM stint_signal WHERE task_id = ANY($1)) x`,
		ids).Scan(&lat.P50, &lat.P99, &lat.Max))
	rows, err := c.Pool.Query(c.Ctx, `SELECT coalesce(error->>'code', '') || ': ' || left(coalesce(error->>'message', ''), 60), count(*)
		FROM stint_attempt WHERE task_id = ANY($1) GROUP BY 1 ORDER BY 2 DESC`, ids)
	require.NoError(t, err)
	failed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var what string
		var n int
		err := r.Scan(&what, &n)
		return fmt.Sprintf("%d %s", n, what), err
	})
	require.NoError(t, err)
	hits.mu.Lock()
	at := hits.at
	hits.mu.Unlock()
	inFlight := count(`SELECT count(*) FROM stint_signal s WHERE task_id = ANY($1)
		AND EXISTS (SELECT 1 FROM unnest($2::timestamptz[]) f WHERE f > s.at AND f < s.consumed_at)`, ids, at)
	t.Logf("%d tasks x %d messages (%d sent twice), %d faults, %d messages stored and not yet consumed at a fault; "+
		"%d runs, %d cut or failed; %d waits recorded (%d cut before their end was recorded), %d woken, %d of them with nothing to receive; "+
		"store to consumption p50 %d ms p99 %d ms max %d ms; all ended %s after the last signal",
		tasks, k, twice, len(at), inFlight,
		count(`SELECT count(*) FROM chaos_signal_run`), count(`SELECT coalesce(sum(attempt - 1), 0) FROM stint_task WHERE id = ANY($1)`, ids),
		waits, waits-woken, woken, empty, lat.P50, lat.P99, lat.Max,
		ended.Round(time.Millisecond))
	if len(failed) > 0 {
		t.Logf("failed runs: %v", failed)
	}
	require.Positive(t, inFlight, "the faults should have struck between messages' store and their consumption")
	// A wake is made by a message stored in the same transaction, which
	// nothing but the woken run can consume, and the waits are too long
	// to end by themselves: a wake that finds nothing was woken twice.
	require.Zero(t, empty, "wakes with nothing to receive")
}

// wakes counts the waits chaos.signals' runs recorded, those that were
// woken and those woken with nothing to receive, which it logs. A run
// that recorded its wait and whose wait committed is followed by a run
// of the same attempt (a wait gives its attempt back; a run cut before
// its end was recorded is followed by the next attempt): the wake.
func wakes(t *testing.T, c *chaos.Cluster) (waits, woken, empty int) {
	type wake struct {
		Task, Node string
		Waited     time.Time
		Found      *bool
	}
	rows, err := c.Pool.Query(c.Ctx, `SELECT p.task_id, p.node, p.waited,
		(SELECT r.found FROM chaos_signal_run r WHERE r.task_id = p.task_id AND r.attempt = p.attempt AND r.started > p.started
		 ORDER BY r.started LIMIT 1)
		FROM chaos_signal_run p WHERE p.waited IS NOT NULL ORDER BY p.waited`)
	require.NoError(t, err)
	ws, err := pgx.CollectRows(rows, pgx.RowToStructByPos[wake])
	require.NoError(t, err)
	for _, w := range ws {
		if w.Found == nil {
			continue
		}
		woken++
		if !*w.Found {
			empty++
			t.Logf("woken with nothing to receive: task %s, asleep from %s (run on %s)", w.Task, w.Waited.Format("15:04:05.000"), w.Node)
		}
	}
	return len(ws), woken, empty
}
