package impl_test

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// asRole creates a login role that is a member of role and returns the
// DSN of the test database as that login.
func (e *env) asRole(role string) string {
	e.t.Helper()
	login := fmt.Sprintf("%s_%d", role, time.Now().UnixNano())
	_, err := e.pool.Exec(e.ctx, fmt.Sprintf(`CREATE ROLE %s LOGIN IN ROLE %s`, login, role))
	require.NoError(e.t, err)
	e.t.Cleanup(func() {
		_, _ = e.pool.Exec(e.ctx, fmt.Sprintf(`DROP OWNED BY %s; DROP ROLE %s`, login, login))
	})
	u, err := url.Parse(e.dsn)
	require.NoError(e.t, err)
	u.User = url.User(login)
	return u.String()
}

// clientAs returns the store and client of a client-only process
// connected as a login of role.
func (e *env) clientAs(role string) (*postgres.Store, *impl.Client) {
	e.t.Helper()
	st, err := postgres.Open(e.ctx, e.asRole(role))
	require.NoError(e.t, err)
	e.t.Cleanup(st.Close)
	c, err := impl.NewClient(st, impl.ClientConfig{Registry: testRegistry(e.pool, "c", time.Second), PollInterval: 50 * time.Millisecond})
	require.NoError(e.t, err)
	e.t.Cleanup(c.Close)
	return st, c
}

func TestClientRoleSubmitsButCannotClaimOrFinish(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, err := e.pool.Exec(e.ctx, `GRANT SELECT, INSERT, UPDATE ON test_run TO stint_node`)
	require.NoError(t, err)

	clientStore, client := e.clientAs("stint_client")

	f, err := api.Submit(e.ctx, client, workKind, WorkParams{Key: "least"})
	require.NoError(t, err)
	_, err = client.Get(e.ctx, f.ID())
	require.NoError(t, err)

	_, err = clientStore.Claim(e.ctx, store.ClaimRequest{Node: "rogue", Limit: 1,
		Behaviors: []store.BehaviorLease{{Behavior: workKind.ID, Lease: time.Minute}}})
	require.ErrorContains(t, err, "permission denied")
	_, err = clientStore.Pool().Exec(e.ctx, `UPDATE stint_task SET lease = gen_random_uuid(), node = 'rogue'`)
	require.ErrorContains(t, err, "permission denied")

	// A node role runs it; the client's finish of the running task is
	// refused too.
	nodeStore, err := postgres.Open(e.ctx, e.asRole("stint_node"))
	require.NoError(t, err)
	t.Cleanup(nodeStore.Close)
	claimed, err := nodeStore.Claim(e.ctx, store.ClaimRequest{Node: "node", Limit: 1,
		Behaviors: []store.BehaviorLease{{Behavior: workKind.ID, Lease: time.Minute}}})
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	_, err = clientStore.Finish(e.ctx, []store.Completion{{LeaseRef: claimed[0].LeaseRef, Status: api.StatusSuccess, Result: []byte(`{}`)}})
	require.ErrorContains(t, err, "permission denied")
	ok, err := nodeStore.Finish(e.ctx, []store.Completion{{LeaseRef: claimed[0].LeaseRef, Status: api.StatusSuccess, Result: []byte(`{"key":"least"}`)}})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, ok)
	res, err := f.Await(e.ctx)
	require.NoError(t, err)
	require.Equal(t, "least", res.Key)
}

// TestClientRoleDoesEveryVerbAndForgesNothing runs every verb of the
// operator's contract as a login in stint_client, then tries to forge an
// outcome with hand-written SQL on the same login: each try is refused and
// changes nothing.
func TestClientRoleDoesEveryVerbAndForgesNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.server("node", 5*time.Second)
	clientStore, err := postgres.Open(e.ctx, e.asRole("stint_client"))
	require.NoError(t, err)
	t.Cleanup(clientStore.Close)
	c, err := impl.NewClient(clientStore, impl.ClientConfig{Registry: testRegistry(e.pool, "c", time.Second), PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	ctx := e.ctx

	// Submit, await, and submit the finished task again: it is scheduled
	// again and keeps its last result until its next run ends.
	f, res := e.run(c, WorkParams{Key: "done"})
	require.Equal(t, "done", res.Key)
	_, err = c.SubmitMany(ctx, []api.SubmitRequest{workReq(workKind, WorkParams{Key: "done"}), workReq(workKind, WorkParams{Key: "many"})})
	require.NoError(t, err)
	_, err = f.Await(ctx)
	require.NoError(t, err)

	// Hold and release, a delayed task's progress, remove.
	later, err := c.Submit(ctx, api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":"later"}`), Delay: time.Hour})
	require.NoError(t, err)
	require.NoError(t, c.Hold(ctx, later.ID))
	require.NoError(t, c.SetProgress(ctx, later.ID, nil, []byte(`{"note":"by hand"}`), api.StatusHeld))
	require.NoError(t, c.Release(ctx, later.ID))
	require.NoError(t, c.Remove(ctx, later.ID))
	_, err = c.Get(ctx, later.ID)
	require.ErrorIs(t, err, api.ErrNotFound)

	// A debounced submit, and another that moves its due time.
	for range 2 {
		_, err = c.Submit(ctx, api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":"debounced"}`),
			Debounce: &api.Debounce{Window: time.Hour, MaxWait: 2 * time.Hour}})
		require.NoError(t, err)
	}

	// Retry of a task that failed for good.
	failed, err := api.Submit(ctx, c, workKind, WorkParams{Key: "failed", FailUntil: 1, Permanent: true})
	require.NoError(t, err)
	_, err = failed.Await(ctx)
	require.Error(t, err)
	require.NoError(t, c.Retry(ctx, failed.ID()))
	_, err = failed.Await(ctx)
	require.Error(t, err, "the retried task fails again, at its fresh first attempt")
	require.Equal(t, 2, e.count(`SELECT count(*) FROM test_run WHERE task_id = $1`, string(failed.ID())), "the retry ran it again")

	// Rewind and fork of a task with steps.
	kept, err := api.Submit(ctx, c, keptKind, KeptParams{Key: "kept", Steps: 2})
	require.NoError(t, err)
	_, err = kept.Await(ctx)
	require.NoError(t, err)
	require.NoError(t, c.Rewind(ctx, kept.ID(), 1))
	_, err = kept.Await(ctx)
	require.NoError(t, err)
	_, err = c.Fork(ctx, kept.ID(), 2, "kept-fork")
	require.NoError(t, err)
	_, err = c.Await(ctx, "kept-fork")
	require.NoError(t, err)
	require.NoError(t, c.Remove(ctx, "kept-fork"))

	// Groups, behaviors, the feed, schedules.
	require.NoError(t, c.HoldGroup(ctx, "g"))
	held, err := c.HeldGroups(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"g"}, held)
	require.NoError(t, c.ReleaseGroup(ctx, "g"))
	require.NoError(t, c.Pause(ctx, workKind.ID))
	require.NoError(t, c.SetLease(ctx, workKind.ID, 10*time.Second))
	require.NoError(t, c.Resume(ctx, workKind.ID))
	events, _, err := c.Changes(ctx, 0, 100)
	require.NoError(t, err)
	require.NotEmpty(t, events)
	require.NoError(t, c.AddSchedule(ctx, api.Schedule{Name: "nightly", Behavior: workKind.ID, Spec: "@daily", Params: []byte(`{"key":"n"}`)}))
	require.NoError(t, c.RemoveSchedule(ctx, "nightly"))

	// Forgeries: "done" ran and succeeded, and was submitted again, so it
	// is scheduled with a result that would satisfy every constraint of a
	// success. The client can make it neither succeeded nor failed for
	// good, nor write a result, an error or a lease, nor insert a task in
	// another state than scheduled.
	sub, err := c.Submit(ctx, workReq(workKind, WorkParams{Key: "forge-me", BlockFirst: true}))
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `UPDATE stint_task SET status = 'held', schedule_not_before = NULL, result = '{"key":"old"}' WHERE id = $1`, string(sub.ID))
	require.NoError(t, err, "set up as the owner: a held task with a result from an earlier run")
	before, err := c.Get(ctx, sub.ID)
	require.NoError(t, err)
	for _, forge := range []string{
		`UPDATE stint_task SET status = 'success', schedule_not_before = NULL, executed_at = now(), finished_at = now() WHERE id = $1`,
		`UPDATE stint_task SET status = 'failure', schedule_not_before = NULL WHERE id = $1`,
		`UPDATE stint_task SET result = '{"key":"forged"}' WHERE id = $1`,
		`UPDATE stint_task SET error = '{"code":"forged"}' WHERE id = $1`,
		`UPDATE stint_task SET lease = gen_random_uuid(), node = 'rogue' WHERE id = $1`,
		`INSERT INTO stint_task (id, behavior, params, status, result, schedule_not_before) VALUES ($1 || '-2', 'test.work', '{}', 'success', '{}', NULL)`,
	} {
		_, err := clientStore.Pool().Exec(ctx, forge, string(sub.ID))
		require.Error(t, err, forge)
		require.Regexp(t, `permission denied|row-level security`, err.Error(), forge)
	}
	// Failing by hand writes an outcome: a node's role may, the client's
	// may not.
	err = c.Fail(ctx, sub.ID, "by the client")
	require.Error(t, err)
	require.Regexp(t, `permission denied|row-level security`, err.Error())
	after, err := c.Get(ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, before, after, "the refused forgeries changed nothing")
}

// TestClientRoleMarksAFinishedTaskAwaitedWithoutWriting: the awaited flag
// of a task that finished is not written, so that the client role, which
// may not write a finished row, reads it instead of failing: an await
// whose task finished between its read and its mark failed with a
// row-level security error.
func TestClientRoleMarksAFinishedTaskAwaitedWithoutWriting(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("node", 5*time.Second)
	f, err := api.Submit(e.ctx, srv, workKind, WorkParams{Key: "ended"})
	require.NoError(t, err)
	_, err = f.Await(e.ctx)
	require.NoError(t, err)

	clientStore, err := postgres.Open(e.ctx, e.asRole("stint_client"))
	require.NoError(t, err)
	t.Cleanup(clientStore.Close)
	got, err := clientStore.MarkAwaited(e.ctx, f.ID())
	require.NoError(t, err)
	require.Equal(t, api.StatusSuccess, got.Status)
	require.True(t, got.Finished())

	sub, err := srv.Submit(e.ctx, api.SubmitRequest{Behavior: workKind.ID, Params: []byte(`{"key":"later"}`), Delay: time.Hour})
	require.NoError(t, err)
	got, err = clientStore.MarkAwaited(e.ctx, sub.ID)
	require.NoError(t, err)
	require.True(t, got.Notify, "a task not finished is marked")
}
