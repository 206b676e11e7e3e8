package api_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
)

// Every duration of the package is a Go duration string in JSON, and is
// read back from that string or from a number of nanoseconds (the form
// of earlier releases); the types' other fields are as their tags say.
func TestDurationsInJSON(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	cases := []struct {
		name string
		v    any    // a value with its durations set
		want string // its JSON
		old  string // its JSON with durations in nanoseconds
	}{
		{"Task", api.Task{ID: "t-1", Behavior: "demo.echo", Status: api.StatusSuccess, Params: json.RawMessage(`{}`),
			CreatedAt: at, UpdatedAt: at, Retention: 24 * time.Hour},
			`{"id":"t-1","behavior":"demo.echo","status":"success","priority":0,"params":{},"attempt":0,"errors":0,` +
				`"created_at":"2026-11-27T10:00:00Z","updated_at":"2026-11-27T10:00:00Z","retention":"24h0m0s"}`,
			`{"id":"t-1","behavior":"demo.echo","status":"success","priority":0,"params":{},"attempt":0,"errors":0,` +
				`"created_at":"2026-11-27T10:00:00Z","updated_at":"2026-11-27T10:00:00Z","retention":86400000000000}`},
		{"SubmitRequest", api.SubmitRequest{Behavior: "demo.echo", Delay: 90 * time.Second, Retention: time.Hour},
			`{"behavior":"demo.echo","delay":"1m30s","retention":"1h0m0s"}`,
			`{"behavior":"demo.echo","delay":90000000000,"retention":3600000000000}`},
		{"SubmitRequest debounced", api.SubmitRequest{Behavior: "demo.echo", Debounce: &api.Debounce{Window: 5 * time.Second, MaxWait: time.Minute}},
			`{"behavior":"demo.echo","debounce":{"window":"5s","max_wait":"1m0s"}}`,
			`{"behavior":"demo.echo","debounce":{"window":5000000000,"max_wait":60000000000}}`},
		{"RateLimit", api.RateLimit{Name: "api", Limit: 100, Period: time.Minute},
			`{"name":"api","limit":100,"period":"1m0s"}`,
			`{"name":"api","limit":100,"period":60000000000}`},
		{"RateLimitInfo", api.RateLimitInfo{RateLimit: api.RateLimit{Name: "api", Limit: 100, Period: 250 * time.Millisecond},
			Keys: []api.RateKeyInfo{{Key: "k", Used: 3, Waiting: 1}}, Waiting: 1},
			`{"name":"api","limit":100,"period":"250ms","keys":[{"key":"k","used":3,"waiting":1}],"waiting":1}`,
			`{"name":"api","limit":100,"period":250000000,"keys":[{"key":"k","used":3,"waiting":1}],"waiting":1}`},
		{"History", api.History{Now: at, From: at, Bucket: api.HistoryBucket, Points: []api.HistoryPoint{
			{Behavior: "demo.echo", At: at, Sampled: true, Due: 2, QueueLag: 1500 * time.Millisecond}}},
			`{"now":"2026-11-27T10:00:00Z","from":"2026-11-27T10:00:00Z","points":[{"behavior":"demo.echo","at":"2026-11-27T10:00:00Z",` +
				`"succeeded":0,"failed":0,"retried":0,"sampled":true,"due":2,"queue_lag":"1.5s"}],"bucket":"1m0s"}`,
			`{"now":"2026-11-27T10:00:00Z","from":"2026-11-27T10:00:00Z","points":[{"behavior":"demo.echo","at":"2026-11-27T10:00:00Z",` +
				`"succeeded":0,"failed":0,"retried":0,"sampled":true,"due":2,"queue_lag":1500000000}],"bucket":60000000000}`},
		{"BehaviorSettings", api.BehaviorSettings{Behavior: "demo.echo", Paused: true, Lease: 45 * time.Second},
			`{"behavior":"demo.echo","paused":true,"lease":"45s"}`,
			`{"behavior":"demo.echo","paused":true,"lease":45000000000}`},
		{"DueCount", api.DueCount{Behavior: "demo.echo", Count: 4, OldestAge: 2 * time.Second},
			`{"behavior":"demo.echo","count":4,"oldest_age":"2s"}`,
			`{"behavior":"demo.echo","count":4,"oldest_age":2000000000}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			raw, err := json.Marshal(c.v)
			require.NoError(t, err)
			require.JSONEq(t, c.want, string(raw))
			for _, in := range []string{c.want, c.old} {
				back := reflect.New(reflect.TypeOf(c.v))
				require.NoError(t, json.Unmarshal([]byte(in), back.Interface()), "%s", in)
				require.Equal(t, c.v, back.Elem().Interface(), "%s", in)
			}
		})
	}
	// A zero duration with omitempty is left out, as before.
	raw, err := json.Marshal(api.SubmitRequest{Behavior: "demo.echo"})
	require.NoError(t, err)
	require.JSONEq(t, `{"behavior":"demo.echo"}`, string(raw))
	// A duration that is neither is an error.
	var l api.RateLimit
	require.ErrorContains(t, json.Unmarshal([]byte(`{"period":"soon"}`), &l), `"soon" is not a duration`)
	require.ErrorContains(t, json.Unmarshal([]byte(`{"period":1.5}`), &l), "neither a duration")
}

// A wait on a behavior names it in the field behavior, beside limit, which
// clients of earlier releases read; a wait on a rate limit or on
// dependencies names none.
func TestWaitNamesItsBehavior(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		wait api.Wait
		want string
	}{
		{api.Wait{Reason: api.WaitPaused, Limit: "demo.echo"}, `{"reason":"paused","limit":"demo.echo","behavior":"demo.echo"}`},
		{api.Wait{Reason: api.WaitConcurrency, Limit: "demo.echo", Key: "g"}, `{"reason":"concurrency","limit":"demo.echo","key":"g","behavior":"demo.echo"}`},
		{api.Wait{Reason: api.WaitNoNode, Limit: "demo.echo", Detail: "no node is live"}, `{"reason":"no_node","limit":"demo.echo","detail":"no node is live","behavior":"demo.echo"}`},
		{api.Wait{Reason: api.WaitNodesFull, Limit: "demo.echo"}, `{"reason":"nodes_full","limit":"demo.echo","behavior":"demo.echo"}`},
		{api.Wait{Reason: api.WaitRateLimit, Limit: "api", Key: "k"}, `{"reason":"rate_limit","limit":"api","key":"k"}`},
		{api.Wait{Reason: api.WaitDependencies, Dependencies: []string{"a"}}, `{"reason":"dependencies","limit":"","dependencies":["a"]}`},
	} {
		raw, err := json.Marshal(c.wait)
		require.NoError(t, err)
		require.JSONEq(t, c.want, string(raw))
		var back api.Wait
		require.NoError(t, json.Unmarshal(raw, &back))
		require.Equal(t, c.wait, back)
	}
	// A wait that names its behavior in behavior alone reads as one.
	var w api.Wait
	require.NoError(t, json.Unmarshal([]byte(`{"reason":"paused","behavior":"demo.echo"}`), &w))
	require.Equal(t, api.BehaviorID("demo.echo"), w.Behavior())
}
