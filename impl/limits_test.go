package impl_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// FlowParams are the params of the flow-control test behaviors.
type FlowParams struct {
	ID       string `json:"id"`
	Customer string `json:"customer,omitempty"`
	// Limit names the rate limit the task uses (none when empty), with
	// Units of it for its customer.
	Limit   string `json:"limit,omitempty"`
	Units   int64  `json:"units,omitempty"`
	SleepMS int    `json:"sleep_ms,omitempty"`
	// Gate makes the run wait until test_effect holds a row of this
	// task id.
	Gate string `json:"gate,omitempty"`
}

var (
	// ratedKind's tasks use the rate limit their params name; it declares
	// the default of "test.declared".
	ratedKind = api.Kind[FlowParams, struct{}]{ID: "test.rated"}
	// cappedKind caps its tasks at 3 across nodes and 1 per customer.
	cappedKind = api.Kind[FlowParams, struct{}]{ID: "test.capped"}
	// fairKind serves its customers in turn.
	fairKind = api.Kind[FlowParams, struct{}]{ID: "test.fair"}
	// plainKind has no flow control of its own: only what is set at
	// runtime.
	plainKind = api.Kind[FlowParams, struct{}]{ID: "test.plain"}
)

// declaredLimit is the default ratedKind declares.
var declaredLimit = api.RateLimit{Name: "test.declared", Limit: 5, Period: time.Second}

// flow is a flow-control test behavior: each run records its span in
// test_span (task, customer, node, start and end by the database clock).
type flow struct {
	pool   *pgxpool.Pool
	node   string
	kind   api.Kind[FlowParams, struct{}]
	policy spi.Policy
}

func (f *flow) Kind() api.Kind[FlowParams, struct{}]        { return f.kind }
func (f *flow) TaskID(ids spi.IDs, p FlowParams) api.TaskID { return ids.Deterministic(p.ID) }
func (f *flow) Policy() spi.Policy                          { return f.policy }
func (f *flow) GroupKey(p FlowParams) string                { return p.Customer }
func (f *flow) Run(ctx context.Context, rc spi.RunContext, p FlowParams) (struct{}, error) {
	start := time.Now()
	for p.Gate != "" {
		var n int
		if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM test_effect WHERE task_id = $1`, p.Gate).Scan(&n); err != nil {
			return struct{}{}, err
		}
		if n > 0 {
			break
		}
		select {
		case <-ctx.Done():
			return struct{}{}, context.Cause(ctx)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if p.SleepMS > 0 {
		select {
		case <-ctx.Done():
			return struct{}{}, context.Cause(ctx)
		case <-time.After(time.Duration(p.SleepMS) * time.Millisecond):
		}
	}
	_, err := f.pool.Exec(ctx, `INSERT INTO test_span (task_id, key, node, started, ended) VALUES ($1, $2, $3, $4, clock_timestamp())`,
		string(rc.TaskID()), p.Customer, f.node, start)
	return struct{}{}, err
}

// rated adds RateUses to flow.
type rated struct{ flow }

func (r *rated) RateUses(p FlowParams) []spi.RateUse {
	if p.Limit == "" {
		return nil
	}
	return []spi.RateUse{{Limit: p.Limit, Key: p.Customer, Units: p.Units}}
}

func registerFlowBehaviors(reg *spi.Registry, pool *pgxpool.Pool, node string) {
	lease := spi.Policy{Lease: 30 * time.Second, MaxAttempts: 3}
	r := lease
	r.RateLimits = []api.RateLimit{declaredLimit}
	spi.MustRegister[FlowParams, struct{}](reg, &rated{flow{pool: pool, node: node, kind: ratedKind, policy: r}})
	c := lease
	c.ClusterConcurrency, c.GroupConcurrency = 3, 1
	spi.MustRegister[FlowParams, struct{}](reg, &flow{pool: pool, node: node, kind: cappedKind, policy: c})
	f := lease
	f.FairShare = true
	spi.MustRegister[FlowParams, struct{}](reg, &flow{pool: pool, node: node, kind: fairKind, policy: f})
	spi.MustRegister[FlowParams, struct{}](reg, &flow{pool: pool, node: node, kind: plainKind, policy: lease})
}

func flowReq(kind api.Kind[FlowParams, struct{}], p FlowParams) api.SubmitRequest {
	raw, err := json.Marshal(p)
	if err != nil {
		panic(err)
	}
	return api.SubmitRequest{Behavior: kind.ID, Params: raw}
}

// TestLimitsRefuseBadInput sets limits with each kind of bad value and
// checks that each is refused as invalid and that nothing was stored.
func TestLimitsRefuseBadInput(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	rates := []api.RateLimit{
		{Name: "", Limit: 1, Period: time.Second},
		{Name: "x\x00y", Limit: 1, Period: time.Second},
		{Name: fmt.Sprintf("%0129d", 0), Limit: 1, Period: time.Second},
		{Name: "zero", Limit: 0, Period: time.Second},
		{Name: "negative", Limit: -5, Period: time.Second},
		{Name: "no-period", Limit: 1},
		{Name: "negative-period", Limit: 1, Period: -time.Second},
		{Name: "short-period", Limit: 1, Period: time.Microsecond},
		{Name: "odd-period", Limit: 1, Period: time.Second + time.Nanosecond},
		{Name: "long-period", Limit: 1, Period: 400 * 24 * time.Hour},
	}
	for _, l := range rates {
		require.ErrorIs(t, c.SetRateLimit(e.ctx, l), api.ErrInvalid, "%+v", l)
	}
	caps := []api.ConcurrencyLimit{
		{Behavior: "x", Max: 1},
		{Behavior: cappedKind.ID, Max: 0},
		{Behavior: cappedKind.ID, Max: -1},
		{Behavior: cappedKind.ID, Max: 2, Weight: 2},
		{Behavior: cappedKind.ID, Key: "k", Max: -1},
		{Behavior: cappedKind.ID, Key: "k", Max: 1, Weight: -1},
		{Behavior: cappedKind.ID, Key: "k"},
		{Behavior: cappedKind.ID, Key: fmt.Sprintf("%0257d", 0), Max: 1},
		{Behavior: cappedKind.ID, Key: "bad\nkey", Max: 1},
	}
	for _, l := range caps {
		require.ErrorIs(t, c.SetConcurrencyLimit(e.ctx, l), api.ErrInvalid, "%+v", l)
	}
	rl, err := c.RateLimits(e.ctx)
	require.NoError(t, err)
	require.Empty(t, rl)
	cl, err := c.ConcurrencyLimits(e.ctx)
	require.NoError(t, err)
	require.Empty(t, cl)
	require.ErrorIs(t, c.RemoveRateLimit(e.ctx, "none"), api.ErrNotFound)
	require.ErrorIs(t, c.RemoveRateLimit(e.ctx, ""), api.ErrInvalid)
	require.ErrorIs(t, c.RemoveConcurrencyLimit(e.ctx, cappedKind.ID, ""), api.ErrNotFound)
	require.ErrorIs(t, c.RemoveConcurrencyLimit(e.ctx, "x", ""), api.ErrInvalid)
}

// TestLimitsSetListRemove stores, changes, lists and removes limits of
// both kinds from a client-only process.
func TestLimitsSetListRemove(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	require.NoError(t, c.SetRateLimit(e.ctx, api.RateLimit{Name: "api", Limit: 10, Period: time.Minute}))
	require.NoError(t, c.SetRateLimit(e.ctx, api.RateLimit{Name: "api", Limit: 20, Period: time.Second}))
	require.NoError(t, c.SetRateLimit(e.ctx, api.RateLimit{Name: "bytes", Limit: 1 << 20, Period: time.Hour}))
	rl, err := c.RateLimits(e.ctx)
	require.NoError(t, err)
	require.Equal(t, []api.RateLimitInfo{
		{RateLimit: api.RateLimit{Name: "api", Limit: 20, Period: time.Second}},
		{RateLimit: api.RateLimit{Name: "bytes", Limit: 1 << 20, Period: time.Hour}},
	}, rl)
	require.NoError(t, c.RemoveRateLimit(e.ctx, "api"))
	rl, err = c.RateLimits(e.ctx)
	require.NoError(t, err)
	require.Len(t, rl, 1)

	require.NoError(t, c.SetConcurrencyLimit(e.ctx, api.ConcurrencyLimit{Behavior: cappedKind.ID, Max: 40}))
	require.NoError(t, c.SetConcurrencyLimit(e.ctx, api.ConcurrencyLimit{Behavior: cappedKind.ID, Key: "big", Max: 20, Weight: 3}))
	require.NoError(t, c.SetConcurrencyLimit(e.ctx, api.ConcurrencyLimit{Behavior: cappedKind.ID, Key: "light", Weight: 2}))
	cl, err := c.ConcurrencyLimits(e.ctx)
	require.NoError(t, err)
	require.Equal(t, []api.ConcurrencyInfo{
		{ConcurrencyLimit: api.ConcurrencyLimit{Behavior: cappedKind.ID, Max: 40, Weight: 1}},
		{ConcurrencyLimit: api.ConcurrencyLimit{Behavior: cappedKind.ID, Key: "big", Max: 20, Weight: 3}},
		{ConcurrencyLimit: api.ConcurrencyLimit{Behavior: cappedKind.ID, Key: "light", Weight: 2}},
	}, cl)
	require.NoError(t, c.RemoveConcurrencyLimit(e.ctx, cappedKind.ID, "big"))
	require.ErrorIs(t, c.RemoveConcurrencyLimit(e.ctx, cappedKind.ID, "big"), api.ErrNotFound)
	cl, err = c.ConcurrencyLimits(e.ctx)
	require.NoError(t, err)
	require.Len(t, cl, 2)
}

// TestSubmitChecksRateUses submits tasks naming limits: an undeclared
// limit that is not stored, and units over a limit, are refused and store
// nothing; a declared limit is stored with its default by the first
// submit that names it.
func TestSubmitChecksRateUses(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	_, err := c.Submit(e.ctx, flowReq(ratedKind, FlowParams{ID: "unknown", Limit: "nowhere"}))
	require.ErrorIs(t, err, api.ErrInvalid)
	require.ErrorContains(t, err, `"nowhere" does not exist`)
	_, err = c.SubmitMany(e.ctx, []api.SubmitRequest{
		flowReq(ratedKind, FlowParams{ID: "fine"}),
		flowReq(ratedKind, FlowParams{ID: "over", Limit: declaredLimit.Name, Units: 6}),
	})
	require.ErrorIs(t, err, api.ErrInvalid)
	require.ErrorContains(t, err, "over the limit")
	_, err = c.Submit(e.ctx, flowReq(ratedKind, FlowParams{ID: "negative", Limit: declaredLimit.Name, Units: -1}))
	require.ErrorIs(t, err, api.ErrInvalid)
	_, err = c.Submit(e.ctx, flowReq(ratedKind, FlowParams{ID: "long-key", Limit: declaredLimit.Name, Customer: fmt.Sprintf("%0257d", 0)}))
	require.ErrorIs(t, err, api.ErrInvalid)
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task`), "refused submits stored nothing")
	rl, err := c.RateLimits(e.ctx)
	require.NoError(t, err)
	require.Empty(t, rl, "refused submits stored no declared limit either")

	_, err = c.Submit(e.ctx, flowReq(ratedKind, FlowParams{ID: "declared", Limit: declaredLimit.Name, Customer: "a", Units: 5}))
	require.NoError(t, err)
	rl, err = c.RateLimits(e.ctx)
	require.NoError(t, err)
	require.Len(t, rl, 1)
	require.Equal(t, declaredLimit, rl[0].RateLimit)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_task WHERE rate_uses = '[{"l":"test.declared","k":"a","u":5}]'`))

	require.NoError(t, c.SetRateLimit(e.ctx, api.RateLimit{Name: "stored", Limit: 1, Period: time.Second}))
	_, err = c.Submit(e.ctx, flowReq(ratedKind, FlowParams{ID: "stored", Limit: "stored"}))
	require.NoError(t, err, "a stored limit needs no declaration")
}

// TestConcurrentSubmitsStoreADeclaredLimit submits, from several clients at
// once, tasks naming a declared limit that is not stored yet: whichever
// stores it, every submit finds it (a submit whose insert waited for
// another's found the limit missing from its older snapshot).
func TestConcurrentSubmitsStoreADeclaredLimit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for round := range 5 {
		name := fmt.Sprintf("race.%d", round)
		clients := make([]api.Tasks, 8)
		for i := range clients {
			clients[i] = e.client()
		}
		start := make(chan struct{})
		errs := make(chan error, len(clients))
		for i, c := range clients {
			go func() {
				<-start
				_, err := c.Submit(e.ctx, flowReq(ratedKind, FlowParams{ID: fmt.Sprintf("%s-%d", name, i), Limit: declaredLimit.Name}))
				errs <- err
			}()
		}
		if round > 0 {
			require.NoError(t, e.st.RemoveRateLimit(e.ctx, declaredLimit.Name), "round %d", round)
		}
		close(start)
		for range clients {
			require.NoError(t, <-errs, "round %d", round)
		}
	}
}
