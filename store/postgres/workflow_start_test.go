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

// fanOutT stores the workflow wf of a root node and dependents names of
// it (of semBehavior, priority 5), claims the root and returns its claim.
func fanOutT(t *testing.T, ctx context.Context, st *postgres.Store, wf api.TaskID, groupKey string, names ...string) store.Claimed {
	t.Helper()
	w := store.NewWorkflow{Task: store.NewTask{ID: wf, Behavior: api.WorkflowBehavior, Params: []byte(`{}`), Priority: 5}}
	node := func(name string) store.NewTask {
		return store.NewTask{ID: wf + "/" + api.TaskID(name), Behavior: semBehavior, Params: []byte(`{"n":"` + name + `"}`),
			Priority: 5, ParentID: wf, GroupKey: groupKey}
	}
	w.Nodes, w.Names, w.Rules, w.DependsOn = []store.NewTask{node("root")}, []string{"root"}, []api.Rule{api.RuleAllSucceeded}, [][]int{nil}
	for _, n := range names {
		w.Nodes = append(w.Nodes, node(n))
		w.Names, w.Rules, w.DependsOn = append(w.Names, n), append(w.Rules, api.RuleAllSucceeded), append(w.DependsOn, []int{0})
	}
	created, err := st.SubmitWorkflow(ctx, nil, w)
	require.NoError(t, err)
	require.True(t, created)
	cl := claimT(t, ctx, st, 1, 0)
	require.Len(t, cl, 1)
	require.Equal(t, wf+"/root", cl[0].ID)
	return cl[0]
}

// A finish that makes workflow nodes ready starts those a claim of the
// finishing node could take now, in its own transaction, when the node has
// room for all the dependents it touched, and leaves the others due for
// the claimers.
func TestFinishStartsTheNodesItWakes(t *testing.T) {
	t.Parallel()
	offer := func(limit int) store.LocalStart {
		return store.LocalStart{Node: "n2", Behaviors: semLease, Reserve: func() int { return limit }}
	}
	for _, tc := range []struct {
		name    string
		prepare func(t *testing.T, ctx context.Context, st *postgres.Store)
		key     string
		start   store.LocalStart
		stale   bool // the root's finish is fenced out
		started int
		left    int // the tasks a claim takes next
	}{
		{name: "none when the dependents outnumber the room", start: offer(2), left: 3},
		{name: "all when room", start: offer(3), started: 3},
		{name: "none offered", start: store.LocalStart{}, left: 3},
		{name: "behavior not offered", start: store.LocalStart{Node: "n2", Behaviors: []store.BehaviorLease{{Behavior: "other", Lease: time.Minute}}, Reserve: func() int { return 5 }}, left: 3},
		{name: "stale lease wakes nothing", start: offer(5), stale: true},
		{name: "behavior paused", start: offer(5), prepare: func(t *testing.T, ctx context.Context, st *postgres.Store) {
			require.NoError(t, st.SetBehavior(ctx, store.BehaviorSettings{Behavior: semBehavior, Paused: true}))
		}},
		{name: "behavior paused, its row locked by a change", start: offer(5), prepare: func(t *testing.T, ctx context.Context, st *postgres.Store) {
			require.NoError(t, st.SetBehavior(ctx, store.BehaviorSettings{Behavior: semBehavior, Paused: true}))
			// A change of the paused behavior's settings holds its row
			// while the finish runs: the finish must still see it
			// paused.
			tx, err := st.Pool().Begin(ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			_, err = tx.Exec(ctx, `UPDATE stint_behavior SET lease_ms = 60000 WHERE behavior = $1`, semBehavior)
			require.NoError(t, err)
		}},
		{name: "group key held", start: offer(5), key: "k", prepare: func(t *testing.T, ctx context.Context, st *postgres.Store) {
			require.NoError(t, st.HoldGroup(ctx, "k"))
		}},
		{name: "a due task waits first", start: offer(5), left: 4, prepare: func(t *testing.T, ctx context.Context, st *postgres.Store) {
			_, err := st.Submit(ctx, []store.NewTask{{ID: "first", Behavior: semBehavior, Params: []byte(`{}`), Priority: 5}})
			require.NoError(t, err)
		}},
		{name: "a due task of a later priority does not", start: offer(5), started: 3, left: 1, prepare: func(t *testing.T, ctx context.Context, st *postgres.Store) {
			_, err := st.Submit(ctx, []store.NewTask{{ID: "later", Behavior: semBehavior, Params: []byte(`{}`), Priority: 9}})
			require.NoError(t, err)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, st := openT(t)
			root := fanOutT(t, ctx, st, "wf1", tc.key, "a", "b", "c")
			// A node's checkpoint, kept from a run before a retry,
			// comes with its start.
			_, err := st.Pool().Exec(ctx, `UPDATE stint_task SET progress = '{"at": 1}' WHERE id = 'wf1/a'`)
			require.NoError(t, err)
			if tc.prepare != nil {
				tc.prepare(t, ctx, st)
			}
			c := success(root)
			if tc.stale {
				c.Lease[0] ^= 1
				// A finish that wakes nothing reserves nothing.
				tc.start.Reserve = func() int { panic("a stale finish asked for slots") }
			}
			held, started, err := st.FinishStart(ctx, []store.Completion{c}, tc.start)
			require.NoError(t, err)
			require.Equal(t, []bool{!tc.stale}, held)
			require.Len(t, started, tc.started)

			running := 0
			for _, n := range []api.TaskID{"wf1/a", "wf1/b", "wf1/c"} {
				task, err := st.Get(ctx, n)
				require.NoError(t, err)
				switch {
				case tc.stale:
					require.Equal(t, api.StatusWaiting, task.Status, n)
				case task.Status == api.StatusRunning:
					running++
					require.Equal(t, "n2", task.Node)
					require.Equal(t, 1, task.Attempt)
				default:
					require.Contains(t, []api.Status{api.StatusScheduled}, task.Status, n)
				}
			}
			require.Equal(t, tc.started, running, "the tasks returned started are those running")
			for _, s := range started {
				require.Equal(t, api.BehaviorID(semBehavior), s.Behavior)
				require.Equal(t, api.TaskID("wf1"), s.ParentID)
				require.Equal(t, 1, s.Attempt)
				require.Equal(t, time.Minute, s.LeaseDuration)
				require.JSONEq(t, `{"n":"`+string(s.ID[len("wf1/"):])+`"}`, string(s.Params))
				if s.ID == "wf1/a" {
					require.JSONEq(t, `{"at": 1}`, string(s.Progress))
				} else {
					require.Nil(t, s.Progress)
				}
				// The lease is real: it renews, and it fences the node's
				// finish.
				kept, err := st.Renew(ctx, []store.Renewal{{LeaseRef: s.LeaseRef, Duration: time.Minute}})
				require.NoError(t, err)
				require.True(t, kept[s.ID])
			}
			// The nodes not started are left to the claimers.
			require.Len(t, claimT(t, ctx, st, 10, 0), tc.left)
			if len(started) > 0 {
				// The end of a node without dependents asks for no
				// slots.
				ok, _, err := st.FinishStart(ctx, []store.Completion{success(started[0])}, store.LocalStart{Node: "n2", Behaviors: semLease,
					Reserve: func() int { panic("a node without dependents asked for slots") }})
				require.NoError(t, err)
				require.Equal(t, []bool{true}, ok)
			}
		})
	}
}

// A dependent whose row another transaction changes while a finish waits
// for it is decided on the row as that transaction left it: the finish
// that ends its last dependency sees every other dependency's count.
func TestAFinishWaitingForADependentCountsOnItsNewestRow(t *testing.T) {
	t.Parallel()
	ctx, st := openT(t)
	w := store.NewWorkflow{Task: store.NewTask{ID: "wf3", Behavior: api.WorkflowBehavior, Params: []byte(`{}`), Priority: 5}}
	for _, n := range []string{"a", "b", "c"} {
		w.Nodes = append(w.Nodes, store.NewTask{ID: "wf3/" + api.TaskID(n), Behavior: semBehavior, Params: []byte(`{}`), Priority: 5, ParentID: "wf3"})
		w.Names, w.Rules = append(w.Names, n), append(w.Rules, api.RuleAllSucceeded)
	}
	w.DependsOn = [][]int{nil, nil, {0, 1}}
	_, err := st.SubmitWorkflow(ctx, nil, w)
	require.NoError(t, err)
	claimed := claimT(t, ctx, st, 2, 0)
	require.Len(t, claimed, 2)

	// Another transaction counts a's end off c, and holds c's row while
	// b's finish starts.
	tx, err := st.Pool().Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	_, err = tx.Exec(ctx, `UPDATE stint_task SET deps_pending = deps_pending - 1, deps_succeeded = deps_succeeded + 1 WHERE id = 'wf3/c'`)
	require.NoError(t, err)
	b := claimed[0]
	if b.ID != "wf3/b" {
		b = claimed[1]
	}
	done := make(chan error, 1)
	go func() {
		_, _, err := st.FinishStart(ctx, []store.Completion{success(b)}, store.LocalStart{})
		done <- err
	}()
	require.Eventually(t, func() bool {
		var waiting int
		err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		return err == nil && waiting > 0
	}, 10*time.Second, 5*time.Millisecond, "b's finish waits for c's row")
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-done)

	c, err := st.Get(ctx, "wf3/c")
	require.NoError(t, err)
	require.Equal(t, api.StatusScheduled, c.Status, "c's last dependency ended")
}
