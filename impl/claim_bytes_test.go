package impl_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// bulkyParams are the params of test.bulky: a blob, and a gate its run
// waits at.
type bulkyParams struct {
	Blob string `json:"blob"`
	Gate string `json:"gate"`
}

var bulkyKind = api.Kind[bulkyParams, struct{}]{ID: "test.bulky"}

// bulky is test.bulky: tasks of a megabyte whose runs wait at a gate.
type bulky struct{}

func (bulky) Kind() api.Kind[bulkyParams, struct{}]        { return bulkyKind }
func (bulky) TaskID(ids spi.IDs, _ bulkyParams) api.TaskID { return ids.Unique() }
func (bulky) Policy() spi.Policy                           { return spi.Policy{MaxParamsBytes: 2 << 20} }
func (bulky) Run(ctx context.Context, _ spi.RunContext, p bulkyParams) (struct{}, error) {
	return struct{}{}, passGate(ctx, p.Gate)
}

// TestAClaimReadsABoundedNumberOfBytes: a claim of tasks of a megabyte
// takes no more than about 16 MiB of them, where one claim took as many
// as there were free slots: the first claims of a node by the largest
// params their behavior accepts (2 MiB here), the next ones by the size
// of the tasks the last one read.
func TestAClaimReadsABoundedNumberOfBytes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	register := func(reg *spi.Registry) { spi.MustRegister[bulkyParams, struct{}](reg, bulky{}) }
	reg := testRegistry(e.pool, "client", time.Second)
	register(reg)
	c, err := impl.NewClient(e.st, impl.ClientConfig{Registry: reg})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	g := newGate(t)
	t.Cleanup(func() { openGate(g) })
	blob := strings.Repeat("x", 1<<20)
	submit := func(n int) {
		reqs := make([]api.SubmitRequest, n)
		for i := range reqs {
			reqs[i] = api.SubmitRequest{Behavior: bulkyKind.ID, Params: mustJSON(bulkyParams{Blob: blob, Gate: g})}
		}
		_, err := c.SubmitMany(e.ctx, reqs)
		require.NoError(t, err)
	}
	running := func(n int) func() bool {
		return func() bool {
			return e.count(`SELECT count(*) FROM stint_task WHERE behavior = 'test.bulky' AND status = 'running'`) == n
		}
	}
	biggest := func() int { return e.count(`SELECT max(task_count) FROM stint_lease WHERE behavior = 'test.bulky'`) }
	submit(40)
	e.server("n1", 30*time.Second, func(cfg *impl.ServerConfig) { register(cfg.Registry); cfg.MaxWorkers = 100 })
	waitFor(t, time.Minute, "the first ones run", running(40))
	require.LessOrEqual(t, e.count(`SELECT count(*) FROM stint_task WHERE behavior = 'test.bulky'
		AND executed_at = (SELECT min(executed_at) FROM stint_task WHERE behavior = 'test.bulky')`), 8,
		"the first claim took no more than 8 tasks of up to 2 MiB")
	require.LessOrEqual(t, biggest(), 16, "no claim took more than 16 tasks of a megabyte")
	submit(40)
	waitFor(t, time.Minute, "all of them run", running(80))
	require.LessOrEqual(t, biggest(), 16, "no claim took more than 16 tasks of a megabyte")
}
