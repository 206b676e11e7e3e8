package replication

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

func validParams() Params {
	return Params{
		Source:       Endpoint{DSN: "postgres://app:secret@db1:5432/shop", Table: "public.items"},
		Target:       Endpoint{DSN: "host=db2 user=app password=other dbname=copy", Table: "items"},
		ChangeColumn: "chg",
	}
}

func TestParamsAreCheckedAtSubmit(t *testing.T) {
	t.Parallel()
	reg := spi.NewRegistry()
	require.NoError(t, Register(reg, Config{}))
	r, ok := reg.Lookup(ContinuousBehavior)
	require.True(t, ok)
	good, err := json.Marshal(validParams())
	require.NoError(t, err)
	_, err = r.Decode(good)
	require.NoError(t, err)

	for _, tc := range []struct {
		name   string
		change func(*Params)
		field  string
	}{
		{"no source dsn", func(p *Params) { p.Source.DSN = "" }, "params.source.dsn"},
		{"bad target dsn", func(p *Params) { p.Target.DSN = "postgres://%zz" }, "params.target.dsn"},
		{"no table", func(p *Params) { p.Target.Table = "" }, "params.target.table"},
		{"three-part table", func(p *Params) { p.Source.Table = "a.b.c" }, "params.source.table"},
		{"no change column", func(p *Params) { p.ChangeColumn = "" }, "params.change_column"},
		{"key twice", func(p *Params) { p.KeyColumns = []string{"id", "id"} }, "params.key_columns[1]"},
		{"change column in the key", func(p *Params) { p.KeyColumns = []string{"chg"} }, "params.key_columns"},
		{"filter without column", func(p *Params) { p.Filter = &Filter{Value: "x"} }, "params.filter.column"},
		{"long tombstone", func(p *Params) { p.TombstoneColumn = string(make([]byte, 64)) }, "params.tombstone_column"},
		{"batch size", func(p *Params) { p.BatchSize = MaxBatchSize + 1 }, "params.batch_size"},
	} {
		p := validParams()
		tc.change(&p)
		require.ErrorIs(t, p.Validate(), api.ErrInvalid, tc.name)
		var ie *api.InvalidError
		require.ErrorAs(t, p.Validate(), &ie, tc.name)
		require.Equal(t, tc.field, ie.Field, tc.name)
		raw, err := json.Marshal(p)
		require.NoError(t, err)
		_, err = r.Decode(raw)
		require.ErrorIs(t, err, api.ErrInvalid, tc.name)
		require.Contains(t, err.Error(), tc.field, tc.name)
		require.NotContains(t, err.Error(), "secret", "no password in errors")
	}
	_, err = r.Decode([]byte(`{"source":{"dsn":"postgres://x@y/z","table":"t"},"target":{"dsn":"postgres://x@y/w","table":"t"},"change_column":"c","extra":1}`))
	require.ErrorIs(t, err, api.ErrInvalid, "unknown fields are refused")
}

func TestIDs(t *testing.T) {
	t.Parallel()
	p := validParams()
	id := TaskID(p, false)
	require.NoError(t, spi.CheckTaskID("id", id))
	require.Equal(t, id, TaskID(p, false), "deterministic")
	require.NotEqual(t, id, TaskID(p, true), "one-shot and continuous are different tasks")

	q := p
	q.Source.DSN = "postgres://app:changed@db1:5432/shop?connect_timeout=5"
	q.BatchSize = 10
	require.Equal(t, id, TaskID(q, false), "the password, connection options and batch size are not part of the job id")
	keys := []string{"id"}
	require.Equal(t, ReplicationID(p, keys, false), ReplicationID(q, keys, false))

	for _, change := range []func(*Params){
		func(p *Params) { p.Owner = "bob" },
		func(p *Params) { p.Filter = &Filter{Column: "region", Value: "eu"} },
		func(p *Params) { p.Target.Table = "other" },
		func(p *Params) { p.Source.DSN = "postgres://app@db3:5432/shop" },
	} {
		q := p
		change(&q)
		require.NotEqual(t, id, TaskID(q, false))
	}
	owner := p
	owner.Owner = "bob"
	require.Equal(t, ReplicationID(p, keys, false), ReplicationID(owner, keys, false), "the owner does not change the result")
	for _, change := range []func(*Params){
		func(p *Params) { p.TombstoneColumn = "deleted" },
		func(p *Params) { p.ChangeColumn = "version" },
		func(p *Params) { p.Filter = &Filter{Column: "region", Value: "us"} },
	} {
		q := p
		change(&q)
		require.NotEqual(t, ReplicationID(p, keys, false), ReplicationID(q, keys, false))
	}
	require.NotEqual(t, ReplicationID(p, keys, false), ReplicationID(p, []string{"id", "region"}, false))
	require.NotEqual(t, ReplicationID(p, keys, false), ReplicationID(p, keys, true))

	require.Equal(t, "postgres://app:xxxxx@db1:5432/shop", spi.RedactDSN(p.Source.DSN))
	require.Equal(t, "host=db2 user=app password=xxxxx dbname=copy", spi.RedactDSN(p.Target.DSN))
}

func TestCombineKeepsPersistentParams(t *testing.T) {
	t.Parallel()
	b := &Behavior{shared: &shared{cfg: Config{}.withDefaults()}}
	persistent := validParams()
	persistent.Definition = "nightly"
	transient := validParams()
	transient.BatchSize = 5
	require.Equal(t, persistent, b.Combine(persistent, transient), "a transient submit does not take over a persistent task")
	newer := persistent
	newer.BatchSize = 9
	require.Equal(t, newer, b.Combine(persistent, newer))
	require.Equal(t, transient, b.Combine(validParams(), transient))
}

func TestStateOf(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, tc := range []struct {
		task api.Task
		want State
	}{
		{api.Task{Status: api.StatusScheduled, ScheduleNotBefore: &now}, StatePending},
		{api.Task{Status: api.StatusHeld}, StatePending},
		{api.Task{Status: api.StatusRunning, ScheduleNotBefore: &now}, StateRunning},
		{api.Task{Status: api.StatusFailure, ScheduleNotBefore: &now}, StateCrashing},
		{api.Task{Status: api.StatusFailure}, StateFailed},
		{api.Task{Status: api.StatusSuccess}, StateCompleted},
		{api.Task{Status: api.StatusSuccess, ScheduleNotBefore: &now}, StatePending},
		{api.Task{Status: api.StatusSuccess, Resubmit: true}, StatePending},
	} {
		require.Equal(t, tc.want, StateOf(tc.task), "%+v", tc.task)
	}
}

// Readers see both endpoints' DSNs without their passwords, quoted ones
// too, by the DSN field's tag alone.
func TestReadersSeeNoPassword(t *testing.T) {
	t.Parallel()
	reg := spi.NewRegistry()
	require.NoError(t, Register(reg, Config{}))
	raw := `{"source":{"dsn":"host=h user=u password='part one Secret' dbname=d","table":"t"},` +
		`"target":{"dsn":"postgres://u:url-Secret@h/d?password=query-Secret","table":"t"},"change_column":"v"}`
	for _, b := range []api.BehaviorID{OneShotBehavior, ContinuousBehavior} {
		got := string(reg.RedactParams(b, json.RawMessage(raw)))
		require.JSONEq(t, `{"source":{"dsn":"host=h user=u password=xxxxx dbname=d","table":"t"},`+
			`"target":{"dsn":"postgres://u:xxxxx@h/d?password=xxxxx","table":"t"},"change_column":"v"}`, got)
	}
}
