package impl_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// delayedParams are the params of test.delayed.
type delayedParams struct {
	Key    string `json:"key"`
	DelayS int    `json:"delay_s"`
}

// delayed is test.delayed: its tasks' first run waits DelayS seconds.
type delayed struct{}

var delayedKind = api.Kind[delayedParams, struct{}]{ID: "test.delayed"}

func (delayed) Kind() api.Kind[delayedParams, struct{}] { return delayedKind }
func (delayed) TaskID(ids spi.IDs, p delayedParams) api.TaskID {
	return ids.Deterministic(p.Key)
}
func (delayed) Run(context.Context, spi.RunContext, delayedParams) (struct{}, error) {
	return struct{}{}, nil
}
func (delayed) InitialDelay(p delayedParams) time.Duration {
	return time.Duration(p.DelayS) * time.Second
}

// TestInitialDelayFromParams checks the precedence of due times: a Delay
// given at submit, else the behavior's initial delay from the params
// (never before now), else at once; through Submit and SubmitMany alike.
func TestInitialDelayFromParams(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reg := spi.NewRegistry()
	spi.MustRegister[delayedParams, struct{}](reg, delayed{})
	c, err := impl.NewClient(e.st, impl.ClientConfig{Registry: reg})
	require.NoError(t, err)
	t.Cleanup(c.Close)

	cases := []struct {
		key    string
		delayS int
		delay  time.Duration
		want   time.Duration // due this long after the submit
	}{
		{"behavior", 3600, 0, time.Hour},
		{"request-wins", 3600, 2 * time.Hour, 2 * time.Hour},
		{"request-wins-shorter", 3600, time.Minute, time.Minute},
		{"negative-is-none", -600, 0, 0},
		{"none", 0, 0, 0},
	}
	for i, tc := range cases {
		p := delayedParams{Key: tc.key, DelayS: tc.delayS}
		var id api.TaskID
		if i%2 == 0 {
			f, err := api.Submit(e.ctx, c, delayedKind, p, api.WithDelay(tc.delay))
			require.NoError(t, err)
			id = f.ID()
		} else {
			raw := []byte(`{"key":"` + tc.key + `","delay_s":` + strconv.Itoa(tc.delayS) + `}`)
			subs, err := c.SubmitMany(e.ctx, []api.SubmitRequest{{Behavior: delayedKind.ID, Params: raw, Delay: tc.delay}})
			require.NoError(t, err)
			id = subs[0].ID
		}
		// The due time against the database's clock, with a margin for a
		// slow machine between the submit and this query.
		var micros int64
		require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT (extract(epoch FROM schedule_not_before - now()) * 1e6)::bigint
			FROM stint_task WHERE id = $1`, string(id)).Scan(&micros))
		dueIn := time.Duration(micros) * time.Microsecond
		require.LessOrEqual(t, dueIn, tc.want, tc.key)
		require.Greater(t, dueIn, tc.want-time.Minute, tc.key)
	}
}
