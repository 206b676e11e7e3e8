package postgres_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// A claim commits without waiting for its WAL flush and plans without
// sorts, and only the claim: the connection it ran on commits the next
// statements durably and plans them as configured, in every
// query mode the store supports (behind PgBouncer the batch is sent as one
// simple query or unprepared statements), that the claimed rows are read
// alike in each, and that a finish's array parameters encode in each.
func TestClaimAsyncCommitStaysInItsTransaction(t *testing.T) {
	t.Parallel()
	inEachQueryMode(t, func(t *testing.T, ctx context.Context, st *postgres.Store, mode string) {
		id := api.TaskID("async-task-" + mode)
		_, err := st.Submit(ctx, []store.NewTask{{ID: id, Behavior: semBehavior, Priority: 7,
			Params: []byte(`{"a": [1, "x"]}`), GroupKey: "g-" + mode, Trace: "00-trace-" + mode}})
		require.NoError(t, err)
		// The test cluster runs with synchronous_commit off: the
		// pool's one connection turns it on for its session.
		_, err = st.Pool().Exec(ctx, `SET synchronous_commit = on`)
		require.NoError(t, err)
		cl, err := st.Claim(ctx, store.ClaimRequest{Node: "n1", Behaviors: semLease, Limit: 10})
		require.NoError(t, err)
		require.Len(t, cl, 1)
		// Every column of the claimed row is read, in every mode.
		c := cl[0]
		require.JSONEq(t, `{"a": [1, "x"]}`, string(c.Params))
		require.Nil(t, c.Progress)
		require.Equal(t, store.Claimed{LeaseRef: store.LeaseRef{ID: id, Lease: c.Lease}, LeaseDuration: time.Minute,
			Behavior: semBehavior, Params: c.Params, Attempt: 1, Priority: 7, GroupKey: "g-" + mode, Trace: "00-trace-" + mode}, c)
		var commit, sort string
		require.NoError(t, st.Pool().QueryRow(ctx, `SELECT current_setting('synchronous_commit'), current_setting('enable_sort')`).Scan(&commit, &sort))
		require.Equal(t, [2]string{"on", "on"}, [2]string{commit, sort}, "the claim's settings leaked into the connection")
		// The batch statements' array parameters encode in every mode.
		held, err := st.Finish(ctx, []store.Completion{{LeaseRef: cl[0].LeaseRef, Status: api.StatusSuccess, Result: []byte(`{"n":1}`)}})
		require.NoError(t, err)
		require.Equal(t, []bool{true}, held)
	})
}

// inEachQueryMode runs fn on a store of one connection in each query mode
// the store supports (pgx's default, and the exec and simple protocol
// modes used behind PgBouncer), on one fresh database.
func inEachQueryMode(t *testing.T, fn func(t *testing.T, ctx context.Context, st *postgres.Store, mode string)) {
	t.Helper()
	dsn := pgtest.New(t)
	for _, mode := range []string{"", "exec", "simple_protocol"} {
		t.Run("mode="+mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			d := dsn
			if mode != "" {
				d += sep(dsn) + "default_query_exec_mode=" + mode
			}
			st, err := postgres.Open(ctx, d, postgres.MaxConns(1), postgres.PollOnly())
			require.NoError(t, err)
			defer st.Close()
			fn(t, ctx, st, mode)
		})
	}
}

func sep(dsn string) string {
	for _, c := range dsn {
		if c == '?' {
			return "&"
		}
	}
	return "?"
}

// A claim waits for the claims of its behaviors in flight on other
// connections to commit, in every query mode, and not for the claims of
// other behaviors: claims side by side would each step past the hints the
// others hold locked. A transaction holding the advisory lock a claim of
// semBehavior takes stands for a claim in flight.
func TestClaimWaitsForClaimsOfItsBehaviors(t *testing.T) {
	t.Parallel()
	other := []store.BehaviorLease{{Behavior: "sem.other", Lease: time.Minute}}
	inEachQueryMode(t, func(t *testing.T, ctx context.Context, st *postgres.Store, mode string) {
		_, err := st.Submit(ctx, []store.NewTask{{ID: api.TaskID("turn-" + mode), Behavior: semBehavior},
			{ID: api.TaskID("turn-other-" + mode), Behavior: "sem.other"}})
		require.NoError(t, err)
		holder, err := pgx.Connect(ctx, st.Pool().Config().ConnConfig.ConnString())
		require.NoError(t, err)
		defer holder.Close(ctx)
		tx, err := holder.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('stint.claim:' || $1::text, 0))`, semBehavior)
		require.NoError(t, err)

		type result struct {
			claimed []store.Claimed
			err     error
		}
		done := make(chan result, 1)
		go func() {
			cl, err := st.Claim(ctx, store.ClaimRequest{Node: "n1", Behaviors: semLease, Limit: 10})
			done <- result{cl, err}
		}()
		for deadline := time.Now().Add(time.Minute); ; {
			select {
			case r := <-done:
				t.Fatalf("the claim returned while a claim of its behavior was in flight: %v, %v", r.claimed, r.err)
			default:
			}
			var waiting bool
			require.NoError(t, holder.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)`).Scan(&waiting))
			if waiting {
				break
			}
			require.True(t, time.Now().Before(deadline), "the claim did not wait for the claim in flight")
			time.Sleep(10 * time.Millisecond)
		}
		// A claim of another behavior does not wait (on another store:
		// this one's connection is the waiting claim's).
		st2, err := postgres.Open(ctx, st.Pool().Config().ConnString(), postgres.MaxConns(1), postgres.PollOnly())
		require.NoError(t, err)
		defer st2.Close()
		cl, err := st2.Claim(ctx, store.ClaimRequest{Node: "n2", Behaviors: other, Limit: 10})
		require.NoError(t, err)
		require.Len(t, cl, 1)

		require.NoError(t, tx.Commit(ctx))
		r := <-done
		require.NoError(t, r.err)
		require.Len(t, r.claimed, 1)
		require.Equal(t, api.TaskID("turn-"+mode), r.claimed[0].ID)
	})
}

// TestReleaseClaimGivesBackAndSpendsItsLeases: a claim whose node drew its
// leases can be released: its tasks are due again at once, their attempt
// not counted, and a claim that carries a released lease claims nothing,
// whether it commits before the release or would after it.
func TestReleaseClaimGivesBackAndSpendsItsLeases(t *testing.T) {
	t.Parallel()
	inEachQueryMode(t, func(t *testing.T, ctx context.Context, st *postgres.Store, mode string) {
		behavior := api.BehaviorID("sem.release." + mode)
		bl := []store.BehaviorLease{{Behavior: behavior, Lease: time.Minute}}
		var ids []api.TaskID
		for i := range 3 {
			id := api.TaskID(fmt.Sprintf("release-%d-%s", i, mode))
			_, err := st.Submit(ctx, []store.NewTask{{ID: id, Behavior: behavior, Params: []byte(`{}`)}})
			require.NoError(t, err)
			ids = append(ids, id)
		}
		req := func() store.ClaimRequest {
			var l [16]byte
			_, err := rand.Read(l[:])
			require.NoError(t, err)
			return store.ClaimRequest{Node: "n1", Behaviors: bl, Limit: 10, Leases: [][16]byte{l}}
		}
		states := func() (running, attempts int) {
			for _, id := range ids {
				task, err := st.Get(ctx, id)
				require.NoError(t, err)
				if task.Status == api.StatusRunning {
					running++
				}
				attempts += task.Attempt
			}
			return running, attempts
		}

		first := req()
		cl, err := st.Claim(ctx, first)
		require.NoError(t, err)
		require.Len(t, cl, 3)
		for _, c := range cl {
			require.Equal(t, first.Leases[0], c.Lease, "the claim issues the lease its node drew")
		}
		require.NoError(t, st.ReleaseClaim(ctx, first))
		running, attempts := states()
		require.Equal(t, [2]int{0, 0}, [2]int{running, attempts}, "released: due again, the attempt not counted")

		spent := req()
		require.NoError(t, st.ReleaseClaim(ctx, spent), "a claim that never ran")
		_, err = st.Claim(ctx, spent)
		require.Error(t, err, "a claim with a spent lease")
		running, _ = states()
		require.Zero(t, running, "a claim with a spent lease claims nothing")

		again := req()
		cl, err = st.Claim(ctx, again)
		require.NoError(t, err)
		require.Len(t, cl, 3, "the released tasks are due at once")
		for _, c := range cl {
			require.Equal(t, 1, c.Attempt)
		}
		_, err = st.Claim(ctx, store.ClaimRequest{Node: "n1", Behaviors: bl, Limit: 10, Leases: [][16]byte{{1}, {2}}})
		require.ErrorIs(t, err, api.ErrInvalid, "two leases for one behavior")
	})
}
