package impl_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

// TestABriefListReadsNoPayloads: a List with Brief leaves the tasks'
// params, result and progress out; without it, and in Get, they are there.
func TestABriefListReadsNoPayloads(t *testing.T) {
	t.Parallel()
	e := setup(t)
	c := e.client()
	sub, err := c.Submit(e.ctx, workReq(workKind, WorkParams{Key: "brief"}))
	require.NoError(t, err)
	page, err := c.List(e.ctx, api.Filter{Behavior: workKind.ID, Brief: true})
	require.NoError(t, err)
	require.Len(t, page.Tasks, 1)
	require.Nil(t, page.Tasks[0].Params)
	require.Equal(t, sub.ID, page.Tasks[0].ID)
	require.Equal(t, api.StatusScheduled, page.Tasks[0].Status)
	page, err = c.List(e.ctx, api.Filter{Behavior: workKind.ID})
	require.NoError(t, err)
	require.JSONEq(t, `{"key":"brief"}`, string(page.Tasks[0].Params))
}
