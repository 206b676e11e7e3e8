package replication

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/cleanup"
	"github.com/stinthq/stint/spi"
)

// state returns the replication state of a task.
func state(t *testing.T, e *env, tasks api.Tasks, id api.TaskID) State {
	t.Helper()
	task, err := tasks.Get(e.ctx, id)
	require.NoError(t, err)
	return StateOf(task)
}

func waitState(t *testing.T, e *env, tasks api.Tasks, id api.TaskID, want State) api.Task {
	t.Helper()
	waitFor(t, 30*time.Second, string(id)+" to be "+string(want), func() bool { return state(t, e, tasks, id) == want })
	task, err := tasks.Get(e.ctx, id)
	require.NoError(t, err)
	return task
}

// TestCollisions runs replications with one replication id: a transient
// one that finds another transient one running reschedules itself
// (crashing) until that one is gone; a replication that finds a
// persistent one running fails for good, naming it (the CouchDB
// replicator's rules). A lock left by an older run of the same task is
// taken from it.
func TestCollisions(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.makeTables("items", 500)
	srv := e.server("node", testConfig(e.st.Pool()))
	base := e.params("items")
	owned := func(owner string) Params { p := base; p.Owner = owner; return p }
	alice, bob := owned("alice"), owned("bob")
	keys := []string{"id"}
	require.Equal(t, ReplicationID(alice, keys, true), ReplicationID(bob, keys, true), "the owner is not part of the replication id")
	require.NotEqual(t, TaskID(alice, true), TaskID(bob, true), "the owner is part of the job id")

	// A connection left by an older run of alice's task holds the lock:
	// alice's run ends it and takes the lock.
	stale, err := pgx.Connect(e.ctx, e.dstDSN+"&application_name="+strings.ReplaceAll(appName(TaskID(alice, true), false), " ", "%20"))
	require.NoError(t, err)
	defer stale.Close(e.ctx)
	_, err = stale.Exec(e.ctx, `SELECT pg_advisory_lock($1)`, lockKey(ReplicationID(alice, keys, true)))
	require.NoError(t, err)
	a := submit(t, e.ctx, srv, alice, true)
	waitState(t, e, srv, a.ID(), StateRunning)
	waitFor(t, 10*time.Second, "alice to replicate", func() bool { return e.equal("items", "", "items") })
	require.Error(t, stale.Ping(e.ctx), "the older run's connection was ended")

	// Bob's transient replication collides with alice's: crashing.
	b := submit(t, e.ctx, srv, bob, true)
	task := waitState(t, e, srv, b.ID(), StateCrashing)
	require.Equal(t, codeCollision, task.Error.Code)
	require.Contains(t, task.Error.Message, string(a.ID()))
	require.True(t, task.Error.Retryable)
	// Once alice's is gone, bob's runs.
	require.NoError(t, srv.Remove(e.ctx, a.ID()))
	waitState(t, e, srv, b.ID(), StateRunning)
	require.NoError(t, srv.Remove(e.ctx, b.ID()))
	waitFor(t, 10*time.Second, "the runs to end", func() bool { return srv.Running() == 0 })

	// A persistent replication runs: a transient one colliding with it
	// fails for good, and so does another persistent one.
	carol, err := Define(e.ctx, e.st.Pool(), srv, Definition{Name: "carol", Continuous: true, Params: owned("carol")})
	require.NoError(t, err)
	waitState(t, e, srv, carol, StateRunning)
	// Running is the claim; the collision lock is taken a moment later.
	// Until carol holds it, dave's run could take it first.
	waitFor(t, 30*time.Second, "carol to hold the replication lock", func() bool {
		var held bool
		err := e.dst.QueryRow(e.ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid)
			WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = $1)`, appName(carol, true)).Scan(&held)
		return err == nil && held
	})
	d := submit(t, e.ctx, srv, owned("dave"), true)
	task = waitState(t, e, srv, d.ID(), StateFailed)
	require.Equal(t, codeCollision, task.Error.Code)
	require.Contains(t, task.Error.Message, "persistent")
	require.Contains(t, task.Error.Message, string(carol))
	erin, err := Define(e.ctx, e.st.Pool(), srv, Definition{Name: "erin", Continuous: true, Params: owned("erin")})
	require.NoError(t, err)
	waitState(t, e, srv, erin, StateFailed)
	def, err := GetDefinition(e.ctx, e.st.Pool(), "erin")
	require.NoError(t, err)
	require.Equal(t, StateFailed, def.State, "the definition records the failure")
	require.Contains(t, string(def.StateDetail), "collision")
	require.Equal(t, StateRunning, state(t, e, srv, carol), "the first persistent replication keeps running")
	require.NoError(t, Undefine(e.ctx, e.st.Pool(), srv, "carol"))
	require.NoError(t, Undefine(e.ctx, e.st.Pool(), srv, "erin"))
	_, err = srv.Get(e.ctx, carol)
	require.ErrorIs(t, err, api.ErrNotFound)
}

// TestDefinitions writes, updates and removes persistent replications.
func TestDefinitions(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.makeTables("items", 1000, "items", "items_eu")
	srv := e.server("node", testConfig(e.st.Pool()))
	db := e.st.Pool()

	// Invalid definitions are refused and write nothing.
	bad := []Definition{
		{Name: "", Params: e.params("items")},
		{Name: "x", Params: Params{Source: Endpoint{DSN: "postgres://%zz", Table: "items"}, Target: e.params("items").Target, ChangeColumn: "chg"}},
		{Name: "x", Params: func() Params { p := e.params("items"); p.Source.Table = "nope"; return p }()},
		{Name: "x", Params: func() Params { p := e.params("items"); p.ChangeColumn = "qty"; return p }()},
		{Name: "x", Params: func() Params { p := e.params("items"); p.TombstoneColumn = "gone"; return p }()},
		{Name: "x", Params: func() Params { p := e.params("items"); p.KeyColumns = []string{"name"}; return p }()},
		{Name: "x", Params: func() Params { p := e.params("items"); p.Filter = &Filter{Column: "qty", Value: "many"}; return p }()},
	}
	for i, d := range bad {
		_, err := Define(e.ctx, db, srv, d)
		require.ErrorIs(t, err, api.ErrInvalid, "definition %d: %v", i, err)
		t.Logf("refused: %v", err)
	}
	defs, err := Definitions(e.ctx, db)
	require.NoError(t, err)
	require.Empty(t, defs)
	page, err := srv.List(e.ctx, api.Filter{})
	require.NoError(t, err)
	require.Empty(t, page.Tasks)

	// A one-shot definition runs once and records its result.
	once, err := Define(e.ctx, db, srv, Definition{Name: "once", Params: e.params("items")})
	require.NoError(t, err)
	res, err := api.NewFuture(srv, OneShot, once).Await(e.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1000, res.RowsWritten)
	waitFor(t, 10*time.Second, "the definition's state", func() bool {
		d, err := GetDefinition(e.ctx, db, "once")
		require.NoError(t, err)
		return d.State == StateCompleted
	})

	// A continuous definition; an update that keeps the task restarts it
	// with the new definition.
	p := e.params("items")
	p.Target.Table = "items_eu"
	live, err := Define(e.ctx, db, srv, Definition{Name: "live", Continuous: true, Params: p})
	require.NoError(t, err)
	waitState(t, e, srv, live, StateRunning)
	p.BatchSize = 77
	again, err := Define(e.ctx, db, srv, Definition{Name: "live", Continuous: true, Params: p})
	require.NoError(t, err)
	require.Equal(t, live, again)
	waitFor(t, 10*time.Second, "the running task to take the update", func() bool {
		task, prog := progress(t, e.ctx, srv, live)
		return prog.Version == 2 && StateOf(task) == StateRunning
	})
	// Two names for one replication are refused.
	_, err = Define(e.ctx, db, srv, Definition{Name: "live2", Continuous: true, Params: p})
	require.ErrorIs(t, err, api.ErrInvalid)
	require.Contains(t, err.Error(), `"live"`)
	// An update that changes the task id (a filter) moves the definition
	// to a new task.
	p.Filter = &Filter{Column: "region", Value: "eu"}
	moved, err := Define(e.ctx, db, srv, Definition{Name: "live", Continuous: true, Params: p})
	require.NoError(t, err)
	require.NotEqual(t, live, moved)
	_, err = srv.Get(e.ctx, live)
	require.ErrorIs(t, err, api.ErrNotFound, "the old task was removed")
	waitState(t, e, srv, moved, StateRunning)

	// Reconcile repairs a task removed behind the definition's back and
	// removes a persistent replication's task without a definition.
	require.NoError(t, srv.Remove(e.ctx, moved))
	orphan := e.params("items")
	orphan.Owner, orphan.Definition = "nobody", "ghost"
	raw, err := json.Marshal(orphan)
	require.NoError(t, err)
	sub, err := srv.Submit(e.ctx, api.SubmitRequest{Behavior: OneShotBehavior, Params: raw, Delay: time.Hour})
	require.NoError(t, err)
	rr, err := Reconcile(e.ctx, db, srv)
	require.NoError(t, err)
	require.Equal(t, []api.TaskID{moved}, rr.Submitted, "only the active definition without a task; the completed one-shot stays done")
	require.Equal(t, []api.TaskID{sub.ID}, rr.Removed)
	waitState(t, e, srv, moved, StateRunning)

	require.NoError(t, Undefine(e.ctx, db, srv, "live"))
	_, err = srv.Get(e.ctx, moved)
	require.ErrorIs(t, err, api.ErrNotFound)
	require.ErrorIs(t, Undefine(e.ctx, db, srv, "live"), ErrNoDefinition)
	defs, err = Definitions(e.ctx, db)
	require.NoError(t, err)
	require.Len(t, defs, 1)
	require.Equal(t, "once", defs[0].Name)
}

// TestTransientReplicationsAreDeletedAfterRetention runs the cleanup
// behavior over ended replications: the tasks go once the retention
// passed; a persistent one's definition keeps its state.
func TestTransientReplicationsAreDeletedAfterRetention(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.makeTables("items", 100, "items", "items2")
	cfg := testConfig(e.st.Pool())
	cfg.Retention = time.Millisecond
	srv := e.server("node", cfg)
	f := submit(t, e.ctx, srv, e.params("items"), false)
	_, err := f.Await(e.ctx)
	require.NoError(t, err)
	p := e.params("items")
	p.Target.Table = "items2"
	id, err := Define(e.ctx, e.st.Pool(), srv, Definition{Name: "kept", Params: p})
	require.NoError(t, err)
	_, err = api.NewFuture(srv, OneShot, id).Await(e.ctx)
	require.NoError(t, err)

	reg := spi.NewRegistry()
	require.NoError(t, Register(reg, cfg))
	res, err := cleanup.New(e.st, reg, cleanup.Config{}).Run(e.ctx, nil, cleanup.Params{})
	require.NoError(t, err)
	require.Equal(t, 2, res.Deleted["replication/success"])
	_, err = srv.Get(e.ctx, f.ID())
	require.True(t, errors.Is(err, api.ErrNotFound), "the transient replication's task is gone")
	d, err := GetDefinition(e.ctx, e.st.Pool(), "kept")
	require.NoError(t, err)
	require.Equal(t, StateCompleted, d.State, "the persistent one's definition keeps its end")
	rr, err := Reconcile(e.ctx, e.st.Pool(), srv)
	require.NoError(t, err)
	require.Empty(t, rr.Submitted, "a completed definition is not run again by reconciling")

	// Monitoring still shows the persistent one, from its definition.
	list, err := List(e.ctx, srv, e.st.Pool())
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "kept", list[0].Definition)
	require.Equal(t, StateCompleted, list[0].State)
	require.EqualValues(t, 100, list[0].Result.RowsWritten)
	info, def, err := Lookup(e.ctx, srv, e.st.Pool(), "kept")
	require.NoError(t, err)
	require.Equal(t, id, info.TaskID)
	require.Equal(t, StateCompleted, info.State)
	require.NotNil(t, def)
	_, _, err = Lookup(e.ctx, srv, e.st.Pool(), string(f.ID()))
	require.ErrorIs(t, err, api.ErrNotFound)
}
