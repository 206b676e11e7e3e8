package impl_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// sizedParams are the params of test.sized: a list the database's jsonb
// respaces, and padding to a chosen size.
type sizedParams struct {
	Items []string `json:"items"`
	Pad   string   `json:"pad"`
}

var sizedKind = api.Kind[sizedParams, struct{}]{ID: "test.sized"}

// sized is test.sized: params of at most sizedLimit bytes.
type sized struct{}

const sizedLimit = 96

func (sized) Kind() api.Kind[sizedParams, struct{}]        { return sizedKind }
func (sized) TaskID(ids spi.IDs, _ sizedParams) api.TaskID { return ids.Unique() }
func (sized) Policy() spi.Policy                           { return spi.Policy{MaxParamsBytes: sizedLimit} }
func (sized) Run(context.Context, spi.RunContext, sizedParams) (struct{}, error) {
	return struct{}{}, nil
}

// paramsOf returns params of test.sized that encode to exactly n bytes.
func paramsOf(t *testing.T, n int) json.RawMessage {
	p := sizedParams{Items: strings.Split("a b c d e f g h", " ")}
	raw, err := json.Marshal(p)
	require.NoError(t, err)
	p.Pad = strings.Repeat("x", n-len(raw))
	raw, err = json.Marshal(p)
	require.NoError(t, err)
	require.Len(t, raw, n)
	return raw
}

// TestWhatASubmitAcceptsARunAccepts: params of exactly the behavior's
// limit are accepted at submit and run, though the database stores them
// respaced, longer; one byte more is refused at submit.
func TestWhatASubmitAcceptsARunAccepts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := e.server("n1", 5*time.Second, func(cfg *impl.ServerConfig) { spi.MustRegister[sizedParams, struct{}](cfg.Registry, sized{}) })
	sub, err := srv.Submit(e.ctx, api.SubmitRequest{Behavior: sizedKind.ID, Params: paramsOf(t, sizedLimit)})
	require.NoError(t, err)
	require.Greater(t, e.count(`SELECT length(params::text) FROM stint_task WHERE id = $1`, string(sub.ID)), sizedLimit,
		"the stored form is longer")
	task, err := srv.Await(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, api.StatusSuccess, task.Status, "%+v", task.Error)

	_, err = srv.Submit(e.ctx, api.SubmitRequest{Behavior: sizedKind.ID, Params: paramsOf(t, sizedLimit+1)})
	require.ErrorIs(t, err, api.ErrInvalid)
}

// TestARetentionUnderAMicrosecondIsTheShortest: a positive retention
// shorter than the database keeps is its shortest, not none (which would
// be the behavior's).
func TestARetentionUnderAMicrosecondIsTheShortest(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	sub, err := c.Submit(e.ctx, api.SubmitRequest{Behavior: "demo.echo", Params: []byte(`{"text":"x"}`), Retention: time.Nanosecond})
	require.NoError(t, err)
	task, err := c.Get(e.ctx, sub.ID)
	require.NoError(t, err)
	require.Equal(t, time.Microsecond, task.Retention)
}
