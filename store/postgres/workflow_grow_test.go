package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// rootsT stores the workflow wf of root nodes names (of semBehavior),
// claims them all and returns their claims by name.
func rootsT(t *testing.T, ctx context.Context, st *postgres.Store, wf api.TaskID, names ...string) map[string]store.Claimed {
	t.Helper()
	w := store.NewWorkflow{Task: store.NewTask{ID: wf, Behavior: api.WorkflowBehavior, Params: []byte(`{}`), Priority: 5}}
	for _, n := range names {
		w.Nodes = append(w.Nodes, store.NewTask{ID: wf + "/" + api.TaskID(n), Behavior: semBehavior, Params: []byte(`{}`), Priority: 5, ParentID: wf})
		w.Names, w.Rules, w.DependsOn = append(w.Names, n), append(w.Rules, api.RuleAllSucceeded), append(w.DependsOn, nil)
	}
	created, err := st.SubmitWorkflow(ctx, nil, w)
	require.NoError(t, err)
	require.True(t, created)
	out := map[string]store.Claimed{}
	for _, c := range claimT(t, ctx, st, len(names), 0) {
		out[string(c.ID[len(wf)+1:])] = c
	}
	require.Len(t, out, len(names))
	return out
}

// newNodes adds nodes names of semBehavior to wf, each depending on deps.
func newNodes(wf api.TaskID, deps []string, names ...string) store.NewNodes {
	var add store.NewNodes
	for _, n := range names {
		add.Nodes = append(add.Nodes, store.NewTask{ID: wf + "/" + api.TaskID(n), Behavior: semBehavior, Params: []byte(`{}`), Priority: 5, ParentID: wf})
		add.Names, add.Rules, add.DependsOn = append(add.Names, n), append(add.Rules, api.RuleAllSucceeded), append(add.DependsOn, deps)
	}
	return add
}

// statusT returns the status of task id.
func statusT(t *testing.T, ctx context.Context, st *postgres.Store, id api.TaskID) api.Status {
	t.Helper()
	task, err := st.Get(ctx, id)
	require.NoError(t, err)
	return task.Status
}

// A growth is fenced by the grower's lease: a stale holder adds nothing.
func TestGrowthIsFencedByTheLease(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	cl := rootsT(t, ctx, st, "wf1", "grower")
	stale := cl["grower"].LeaseRef
	stale.Lease[0] ^= 1
	err := st.GrowWorkflow(ctx, nil, stale, "wf1", newNodes("wf1", []string{"grower"}, "x"))
	require.ErrorIs(t, err, api.ErrHalt)
	_, err = st.Get(ctx, "wf1/x")
	require.ErrorIs(t, err, api.ErrNotFound)

	require.NoError(t, st.GrowWorkflow(ctx, nil, cl["grower"].LeaseRef, "wf1", newNodes("wf1", []string{"grower"}, "x")))
	require.Equal(t, api.StatusWaiting, statusT(t, ctx, st, "wf1/x"))
	ok, err := st.Finish(ctx, []store.Completion{success(cl["grower"])})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, ok)
	require.Equal(t, api.StatusScheduled, statusT(t, ctx, st, "wf1/x"), "the grower's finish wakes its new dependent")
}

// A dependency that finishes while a growth that adds a dependent of it
// is under way wakes that dependent: its finish statement, which ran
// before the growth committed, saw no dependents, but the wake after the
// workflow's row was locked does.
func TestADependencyEndingDuringAGrowthWakesTheNewNode(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	cl := rootsT(t, ctx, st, "wf1", "grower", "a")
	tx, err := st.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, st.GrowWorkflow(ctx, tx, cl["grower"].LeaseRef, "wf1", newNodes("wf1", []string{"a"}, "x")))

	finished := make(chan error, 1)
	go func() {
		_, err := st.Finish(ctx, []store.Completion{success(cl["a"])})
		finished <- err
	}()
	// The finish waits on the workflow's row, which the growth holds.
	require.Eventually(t, func() bool {
		var n int
		err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&n)
		return err == nil && n > 0
	}, time.Minute, 10*time.Millisecond)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-finished)
	require.Equal(t, api.StatusSuccess, statusT(t, ctx, st, "wf1/a"))
	require.Equal(t, api.StatusScheduled, statusT(t, ctx, st, "wf1/x"), "a's end was counted for the new node")
}
