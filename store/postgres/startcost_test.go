package postgres

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store"
)

// roundTrips counts the statements and batches sent on a connection, each
// one round trip.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (r *roundTrips) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// tracedStore returns a store of the database dsn on one connection (its
// prepared statements are all of the store's), and the count of its round
// trips.
func tracedStore(t *testing.T, ctx context.Context, dsn string) (*Store, *roundTrips) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	trips := &roundTrips{}
	cfg.ConnConfig.Tracer = trips
	cfg.MaxConns = 1
	cfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
		registerArrayCodecs(conn.TypeMap())
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &Store{pool: pool}, trips
}

// TestAWorkflowNodesFinishIsTwoRoundTrips: the finish of a workflow node
// that succeeded, with its parent's count and its dependent's wake and
// local start, is one transaction of two round trips; one that failed
// takes a round trip per round of the skips it causes, and the commit's.
func TestAWorkflowNodesFinishIsTwoRoundTrips(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, trips := tracedStore(t, ctx, pgtest.New(t))
	leases := []store.BehaviorLease{{Behavior: "cost.node", Lease: time.Minute}}
	chain := func(wf api.TaskID) store.Claimed {
		t.Helper()
		w := store.NewWorkflow{Task: store.NewTask{ID: wf, Behavior: api.WorkflowBehavior, Params: []byte(`{}`)}}
		for i, name := range []string{"a", "b", "c"} {
			w.Nodes = append(w.Nodes, store.NewTask{ID: wf + "/" + api.TaskID(name), Behavior: "cost.node", Params: []byte(`{}`), ParentID: wf})
			w.Names, w.Rules, w.DependsOn = append(w.Names, name), append(w.Rules, api.RuleAllSucceeded), append(w.DependsOn, nil)
			if i > 0 {
				w.DependsOn[i] = []int{i - 1}
			}
		}
		_, err := st.SubmitWorkflow(ctx, nil, w)
		require.NoError(t, err)
		claimed, err := st.Claim(ctx, store.ClaimRequest{Node: "node", Behaviors: leases, Limit: 1})
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		return claimed[0]
	}
	finish := func(c store.Claimed, status api.Status) ([]store.Claimed, int64) {
		t.Helper()
		cp := store.Completion{LeaseRef: c.LeaseRef, Status: status, Result: []byte(`{}`), HasParent: true}
		if status == api.StatusFailure {
			cp.Result, cp.Error = nil, &api.TaskError{Message: "no"}
		}
		before := trips.n.Load()
		held, started, err := st.FinishStart(ctx, []store.Completion{cp}, store.LocalStart{Node: "node", Behaviors: leases, Reserve: func() int { return 5 }})
		require.NoError(t, err)
		require.Equal(t, []bool{true}, held)
		return started, trips.n.Load() - before
	}
	// Each statement's first call prepares it.
	started, _ := finish(chain("warm"), api.StatusSuccess)
	require.Len(t, started, 1)

	started, trips1 := finish(chain("wf1"), api.StatusSuccess)
	require.Len(t, started, 1, "the dependent started here")
	require.Equal(t, api.TaskID("wf1/b"), started[0].ID)
	require.Equal(t, int64(2), trips1, "round trips of a node's finish")
	_, trips2 := finish(started[0], api.StatusSuccess)
	require.Equal(t, int64(2), trips2, "round trips of the finish of the node it started")

	started, trips3 := finish(chain("wf2"), api.StatusFailure)
	require.Empty(t, started)
	for _, id := range []api.TaskID{"wf2/b", "wf2/c"} {
		task, err := st.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, api.StatusFailure, task.Status, "%s is skipped", id)
		require.Equal(t, api.CodeSkipped, task.Error.Code)
	}
	require.Equal(t, int64(1+3+1), trips3, "round trips of a failed node's finish: the finish, a round per node it ends (a, b skipped, c skipped) and the commit")
}

// TestAStartingSubmitCostsWhatAPlainOneDoes: a submit that starts its
// task on the submitting node (a server's own, SubmitStart) makes as many
// round trips as a plain one (a client's, Submit): one; its statement is
// planned once per connection as the plain one's is, not anew for every
// submit; and it waits for no lock: with its behavior's cap lock and
// settings row held by other transactions it returns at once, leaving its
// task to the claimers.
func TestAStartingSubmitCostsWhatAPlainOneDoes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := pgtest.New(t)
	st, trips := tracedStore(t, ctx, dsn)
	pool := st.pool

	const client, server = "cost.client", "cost.server"
	submitOne := func(id string, start bool) []store.Claimed {
		t.Helper()
		task := store.NewTask{ID: api.TaskID(id), Behavior: client, Params: []byte("{}")}
		if !start {
			_, err := st.Submit(ctx, []store.NewTask{task})
			require.NoError(t, err)
			return nil
		}
		task.Behavior, task.StartLease = server, time.Minute
		_, started, err := st.SubmitStart(ctx, "node", []store.NewTask{task})
		require.NoError(t, err)
		return started
	}
	// Each statement's first call prepares it.
	submitOne("warm-plain", false)
	submitOne("warm-start", true)
	const n = 20
	sent := map[bool]int64{}
	for i := range n {
		for _, start := range []bool{false, true} {
			before := trips.n.Load()
			started := submitOne(fmt.Sprint("t", i, start), start)
			sent[start] += trips.n.Load() - before
			if start {
				require.Len(t, started, 1, "the server's submit started its task")
			}
		}
	}
	require.Equal(t, int64(n), sent[false], "round trips of %d plain submits", n)
	require.Equal(t, sent[false], sent[true], "round trips of %d starting submits", n)

	plans := map[string]int64{}
	rows, err := pool.Query(ctx, `SELECT statement, custom_plans FROM pg_prepared_statements`)
	require.NoError(t, err)
	for rows.Next() {
		var stmt string
		var custom int64
		require.NoError(t, rows.Scan(&stmt, &custom))
		plans[stmt] = custom
	}
	require.NoError(t, rows.Err())
	plain, ok := plans[submitSQL]
	require.True(t, ok, "the plain submit statement is prepared")
	starting, ok := plans[submitStartSQL]
	require.True(t, ok, "the starting submit statement is prepared")
	require.LessOrEqual(t, starting, plain, "custom plans of %d starting submits, against %d of as many plain ones", n+1, plain)

	// Another transaction holds the cap lock of the server's behavior (as
	// SetConcurrencyLimit does) and its settings row (as a pause does).
	_, err = pool.Exec(ctx, `INSERT INTO stint_behavior (behavior) VALUES ($1)`, server)
	require.NoError(t, err)
	other, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer other.Close(context.WithoutCancel(ctx))
	tx, err := other.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('stint.cap:' || $1, 0))`, server)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM stint_behavior WHERE behavior = $1 FOR UPDATE`, server)
	require.NoError(t, err)
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	task := store.NewTask{ID: "held", Behavior: server, Params: []byte("{}"), StartLease: time.Minute}
	subs, started, err := st.SubmitStart(wctx, "node", []store.NewTask{task})
	require.NoError(t, err, "the starting submit waited for a lock")
	require.Empty(t, started)
	require.Equal(t, api.StatusScheduled, subs[0].Status)
}

// TestAClaimUnderCapsPerKeyIsThreeRoundTrips: a claim under caps per
// group key opens its transaction in the batch that takes its behavior's
// turn and counts its running tasks, reads the keys' rooms, and commits
// in the batch that claims.
func TestAClaimUnderCapsPerKeyIsThreeRoundTrips(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, trips := tracedStore(t, ctx, pgtest.New(t))
	req := store.ClaimRequest{Node: "node", Behaviors: []store.BehaviorLease{{Behavior: "cost.keyed", Lease: time.Minute}},
		Limit: 100, PerGroup: 2, Flow: true}
	claim := func(prefix string) int64 {
		t.Helper()
		var tasks []store.NewTask
		for i := range 6 {
			tasks = append(tasks, store.NewTask{ID: api.TaskID(fmt.Sprintf("%s-%d", prefix, i)), Behavior: "cost.keyed",
				Params: []byte(`{}`), GroupKey: fmt.Sprintf("%s-k%d", prefix, i%3)})
		}
		_, err := st.Submit(ctx, tasks)
		require.NoError(t, err)
		before := trips.n.Load()
		claimed, _, err := st.ClaimFlow(ctx, req)
		require.NoError(t, err)
		require.Len(t, claimed, 6)
		return trips.n.Load() - before
	}
	claim("warm") // each statement's first call prepares it
	require.Equal(t, int64(3), claim("measured"), "round trips of a claim under caps per key")
}
