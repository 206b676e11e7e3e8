package web_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/web"
)

// limitedKind is test.limited: its tasks succeed at once, each after taking
// one unit of the rate limit testRateLimit under the key of its note.
var limitedKind = api.Kind[noteParams, struct{}]{ID: "test.limited"}

// testRateLimit is the rate limit test.limited's tasks use.
const testRateLimit = "test-api"

// limitedBehavior is test.limited.
type limitedBehavior struct{}

func (limitedBehavior) Kind() api.Kind[noteParams, struct{}] { return limitedKind }

func (limitedBehavior) TaskID(ids spi.IDs, _ noteParams) api.TaskID { return ids.Unique() }

func (limitedBehavior) Run(context.Context, spi.RunContext, noteParams) (struct{}, error) {
	return struct{}{}, nil
}

func (limitedBehavior) RateUses(p noteParams) []spi.RateUse {
	return []spi.RateUse{{Limit: testRateLimit, Key: p.Note}}
}

// limitedNode starts a second server node on e's database that runs
// test.limited.
func (e *testEnv) limitedNode() {
	e.t.Helper()
	srv, err := impl.NewServer(e.st, impl.ServerConfig{
		Node:         "limited-" + strings.ReplaceAll(e.t.Name(), "/", "-"),
		Registry:     e.cfg.Registry,
		Behaviors:    []api.BehaviorID{limitedKind.ID},
		PollInterval: 50 * time.Millisecond,
		Logger:       slog.New(slog.NewTextHandler(e.t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	require.NoError(e.t, err)
	require.NoError(e.t, srv.Start(e.ctx))
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(e.t, srv.Stop(ctx))
	})
}

// waitFor polls cond until it holds, failing the test after a generous
// deadline.
func (e *testEnv) waitFor(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// limits reads GET /api/v1/limits.
func (e *testEnv) limits() web.LimitsResponse {
	e.t.Helper()
	var out web.LimitsResponse
	e.json(http.MethodGet, "/api/v1/limits", readToken, nil, http.StatusOK, &out)
	return out
}

// task reads GET /api/v1/tasks/{id}.
func (e *testEnv) task(id api.TaskID) api.Task {
	e.t.Helper()
	var out api.Task
	e.json(http.MethodGet, "/api/v1/tasks/"+string(id), readToken, nil, http.StatusOK, &out)
	return out
}

// caps returns the concurrency caps of l without their use, and without
// the weight of a behavior's cap as a whole, which has none to speak of.
func caps(l web.LimitsResponse) []api.ConcurrencyLimit {
	var out []api.ConcurrencyLimit
	for _, c := range l.Concurrency {
		if c.Key == "" {
			c.Weight = 0
		}
		out = append(out, c.ConcurrencyLimit)
	}
	return out
}

func TestLimitsSetListRemove(t *testing.T) {
	t.Parallel()
	e := newEnv(t)

	got := e.limits()
	require.Empty(t, got.Rate)
	require.Empty(t, got.Concurrency)
	r := e.do(http.MethodGet, "/api/v1/limits", readToken, nil)
	require.JSONEq(t, `{"rate": [], "concurrency": []}`, string(r.body), "empty lists, not null")

	// Changes need the admin role.
	for _, token := range []string{readToken, submitToken} {
		e.requireError(http.MethodPut, "/api/v1/limits/rate/x", token, map[string]any{"limit": 1, "period": "1s"}, http.StatusForbidden, web.CodeForbidden, "")
		e.requireError(http.MethodDelete, "/api/v1/limits/rate/x", token, nil, http.StatusForbidden, web.CodeForbidden, "")
		e.requireError(http.MethodPut, "/api/v1/limits/concurrency/demo.echo", token, map[string]any{"max": 1}, http.StatusForbidden, web.CodeForbidden, "")
		e.requireError(http.MethodDelete, "/api/v1/limits/concurrency/demo.echo", token, nil, http.StatusForbidden, web.CodeForbidden, "")
	}
	e.requireError(http.MethodGet, "/api/v1/limits", "", nil, http.StatusUnauthorized, web.CodeUnauthorized, "")

	// The period as a duration string, or in nanoseconds.
	var stored api.RateLimit
	e.json(http.MethodPut, "/api/v1/limits/rate/partner-api", adminToken, map[string]any{"limit": 100, "period": "1m"}, http.StatusOK, &stored)
	require.Equal(t, api.RateLimit{Name: "partner-api", Limit: 100, Period: time.Minute}, stored)
	e.json(http.MethodPut, "/api/v1/limits/rate/mail", adminToken, map[string]any{"limit": 5, "period": int64(time.Second)}, http.StatusOK, &stored)
	require.Equal(t, api.RateLimit{Name: "mail", Limit: 5, Period: time.Second}, stored)
	// A change replaces the limit of that name.
	e.json(http.MethodPut, "/api/v1/limits/rate/mail", adminToken, map[string]any{"limit": 10, "period": "2s"}, http.StatusOK, &stored)

	var conc api.ConcurrencyLimit
	e.json(http.MethodPut, "/api/v1/limits/concurrency/demo.echo", adminToken, map[string]any{"max": 4}, http.StatusOK, &conc)
	require.Equal(t, api.ConcurrencyLimit{Behavior: demo.Echo.ID, Max: 4}, conc)
	e.json(http.MethodPut, "/api/v1/limits/concurrency/demo.echo", adminToken, map[string]any{"key": "acme", "max": 2, "weight": 3}, http.StatusOK, &conc)
	require.Equal(t, api.ConcurrencyLimit{Behavior: demo.Echo.ID, Key: "acme", Max: 2, Weight: 3}, conc)

	want := func() {
		t.Helper()
		got := e.limits()
		require.Len(t, got.Rate, 2)
		require.Equal(t, api.RateLimit{Name: "mail", Limit: 10, Period: 2 * time.Second}, got.Rate[0].RateLimit)
		require.Equal(t, api.RateLimit{Name: "partner-api", Limit: 100, Period: time.Minute}, got.Rate[1].RateLimit)
		require.Len(t, got.Concurrency, 2)
		for _, c := range got.Concurrency {
			require.Zero(t, c.Running)
			require.Zero(t, c.Waiting)
		}
		require.ElementsMatch(t, []api.ConcurrencyLimit{{Behavior: demo.Echo.ID, Max: 4}, {Behavior: demo.Echo.ID, Key: "acme", Max: 2, Weight: 3}}, caps(got))
	}
	want()

	// Bad input: a clear error naming the field, and nothing stored.
	for _, bad := range []struct {
		path  string
		body  any
		field string
	}{
		{"/api/v1/limits/rate/mail", map[string]any{"limit": 0, "period": "1s"}, "limit"},
		{"/api/v1/limits/rate/mail", map[string]any{"limit": -3, "period": "1s"}, "limit"},
		{"/api/v1/limits/rate/mail", map[string]any{"period": "1s"}, "limit"},
		{"/api/v1/limits/rate/mail", map[string]any{"limit": 1, "period": "0s"}, "period"},
		{"/api/v1/limits/rate/mail", map[string]any{"limit": 1, "period": "-1m"}, "period"},
		{"/api/v1/limits/rate/mail", map[string]any{"limit": 1, "period": 0}, "period"},
		{"/api/v1/limits/rate/mail", map[string]any{"limit": 1, "period": "soon"}, "period"},
		{"/api/v1/limits/rate/mail", map[string]any{"limit": 1, "period": 1.5}, "period"},
		{"/api/v1/limits/rate/mail", map[string]any{"limit": 1, "period": true}, "period"},
		{"/api/v1/limits/rate/mail", map[string]any{"limit": 1}, "period"},
		{"/api/v1/limits/rate/mail", map[string]any{"limit": "ten", "period": "1s"}, "limit"},
		{"/api/v1/limits/rate/mail", map[string]any{"limit": 1, "period": "1s", "burst": 2}, "burst"},
		{"/api/v1/limits/rate/mail", `{"limit": 1, "period": "1s"`, "body"},
		{"/api/v1/limits/rate/" + strings.Repeat("n", 129), map[string]any{"limit": 1, "period": "1s"}, "name"},
		{"/api/v1/limits/concurrency/demo.echo", map[string]any{"max": 0}, "max"},
		{"/api/v1/limits/concurrency/demo.echo", map[string]any{"max": -1}, "max"},
		{"/api/v1/limits/concurrency/demo.echo", map[string]any{"key": "acme", "max": -1}, "max"},
		{"/api/v1/limits/concurrency/demo.echo", map[string]any{"key": "acme", "max": 1, "weight": -2}, "weight"},
		{"/api/v1/limits/concurrency/demo.echo", map[string]any{"max": 1, "weight": 2}, "weight"},
		{"/api/v1/limits/concurrency/demo.echo", map[string]any{"key": strings.Repeat("k", 257), "max": 1}, "key"},
		{"/api/v1/limits/concurrency/Not%20A%20Behavior", map[string]any{"max": 1}, "behavior"},
		{"/api/v1/limits/concurrency/nope.kind", map[string]any{"max": 1}, "behavior"},
		{"/api/v1/limits/concurrency/nope.kind", map[string]any{"max": 1, "force": false}, "behavior"},
		{"/api/v1/limits/concurrency/nope.kind", map[string]any{"max": 1, "force": "yes"}, "force"},
	} {
		e.requireError(http.MethodPut, bad.path, adminToken, bad.body, http.StatusBadRequest, web.CodeInvalid, bad.field)
	}
	// A body over the limit, or not JSON.
	e.requireError(http.MethodPut, "/api/v1/limits/rate/mail", adminToken, `{"limit": 1, "period": "`+strings.Repeat("9", 2<<20)+`"}`,
		http.StatusRequestEntityTooLarge, web.CodeInvalid, "body")
	req, err := http.NewRequestWithContext(e.ctx, http.MethodPut, e.ts.URL+"/api/v1/limits/rate/mail", strings.NewReader("limit=1"))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := e.ts.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnsupportedMediaType, resp.StatusCode)
	e.requireError(http.MethodPut, "/api/v1/limits/rate/mail?dry=1", adminToken, map[string]any{"limit": 1, "period": "1s"}, http.StatusBadRequest, web.CodeInvalid, "dry")
	e.requireError(http.MethodDelete, "/api/v1/limits/concurrency/demo.echo?keys=acme", adminToken, nil, http.StatusBadRequest, web.CodeInvalid, "keys")
	want()

	// Removing: unknown limits are a 404.
	e.requireError(http.MethodDelete, "/api/v1/limits/rate/no-such", adminToken, nil, http.StatusNotFound, web.CodeNotFound, "")
	e.requireError(http.MethodDelete, "/api/v1/limits/concurrency/demo.echo?key=nobody", adminToken, nil, http.StatusNotFound, web.CodeNotFound, "")
	e.requireError(http.MethodDelete, "/api/v1/limits/concurrency/test.fail", adminToken, nil, http.StatusNotFound, web.CodeNotFound, "")
	require.Equal(t, http.StatusNoContent, e.do(http.MethodDelete, "/api/v1/limits/rate/mail", adminToken, nil).status)
	require.Equal(t, http.StatusNoContent, e.do(http.MethodDelete, "/api/v1/limits/concurrency/demo.echo?key=acme", adminToken, nil).status)
	got = e.limits()
	require.Len(t, got.Rate, 1)
	require.Equal(t, "partner-api", got.Rate[0].Name)
	require.Len(t, got.Concurrency, 1)
	require.Equal(t, []api.ConcurrencyLimit{{Behavior: demo.Echo.ID, Max: 4}}, caps(got))
	require.Equal(t, http.StatusNoContent, e.do(http.MethodDelete, "/api/v1/limits/concurrency/demo.echo", adminToken, nil).status)
	e.requireError(http.MethodDelete, "/api/v1/limits/concurrency/demo.echo", adminToken, nil, http.StatusNotFound, web.CodeNotFound, "")
	require.Empty(t, e.limits().Concurrency)

	// A behavior neither registered nor run by a live node needs force:
	// the 400 says which nodes run what, and how to force it.
	ae := e.requireError(http.MethodPut, "/api/v1/limits/concurrency/nope.kind", adminToken, map[string]any{"max": 2},
		http.StatusBadRequest, web.CodeInvalid, "behavior")
	require.Contains(t, ae.Error.Message, `"nope.kind" is not registered here and no live node runs it (node-`)
	require.Contains(t, ae.Error.Message, `send "force": true`)
	var forced api.ConcurrencyLimit
	e.json(http.MethodPut, "/api/v1/limits/concurrency/nope.kind", adminToken, map[string]any{"max": 2, "force": true}, http.StatusOK, &forced)
	require.Equal(t, api.ConcurrencyLimit{Behavior: "nope.kind", Max: 2}, forced)
	require.Equal(t, []api.ConcurrencyLimit{{Behavior: "nope.kind", Max: 2}}, caps(e.limits()))
}

// A task a rate limit holds back says what it waits on and until when, and
// the limit shows its use per key; a task a concurrency cap holds back says
// so too.
func TestLimitsShowUseAndWaits(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.limitedNode()

	e.json(http.MethodPut, "/api/v1/limits/rate/"+testRateLimit, adminToken, map[string]any{"limit": 2, "period": "1h"}, http.StatusOK, nil)
	var ids []api.TaskID
	for range 3 {
		ids = append(ids, e.submit(web.SubmitBody{Behavior: limitedKind.ID, Params: json.RawMessage(`{"note":"acme"}`)}))
	}
	other := e.submit(web.SubmitBody{Behavior: limitedKind.ID, Params: json.RawMessage(`{"note":"globex"}`)})
	for _, id := range []api.TaskID{other} {
		_, err := e.srv.Await(e.ctx, id)
		require.NoError(t, err, "another key has its own budget")
	}
	// Two of acme's three start; the third waits for the budget.
	var waiting api.Task
	e.waitFor("two tasks done and one waiting", func() bool {
		done, wait := 0, 0
		for _, id := range ids {
			task := e.task(id)
			switch {
			case task.Status == api.StatusSuccess:
				done++
			case task.Waiting != nil:
				wait++
				waiting = task
			}
		}
		return done == 2 && wait == 1
	})
	require.Equal(t, api.StatusScheduled, waiting.Status, "a waiting task is due, not failed")
	require.Equal(t, api.WaitRateLimit, waiting.Waiting.Reason)
	require.Equal(t, testRateLimit, waiting.Waiting.Limit)
	require.Equal(t, "acme", waiting.Waiting.Key)
	require.NotNil(t, waiting.Waiting.Until)
	require.WithinDuration(t, time.Now().Add(30*time.Minute), *waiting.Waiting.Until, 5*time.Minute, "a unit of 2 per hour frees in half an hour")
	require.Zero(t, waiting.Attempt, "waiting counts no attempt")

	var acme api.RateKeyInfo
	e.waitFor("the limit's use", func() bool {
		got := e.limits()
		if len(got.Rate) != 1 || got.Rate[0].Waiting != 1 {
			return false
		}
		for _, k := range got.Rate[0].Keys {
			if k.Key == "acme" {
				acme = k
			}
		}
		return acme.Key != ""
	})
	require.EqualValues(t, 2, acme.Used)
	require.Equal(t, 1, acme.Waiting)
	require.NotNil(t, acme.NextFree)
	require.True(t, acme.NextFree.After(time.Now()), "the next unit frees later: %v", acme.NextFree)

	require.Equal(t, http.StatusNoContent, e.do(http.MethodDelete, "/api/v1/limits/rate/"+testRateLimit, adminToken, nil).status)
	require.Empty(t, e.limits().Rate)

	// A cap of one running demo.echo: a second waits on it.
	e.json(http.MethodPut, "/api/v1/limits/concurrency/demo.echo", adminToken, map[string]any{"max": 1}, http.StatusOK, nil)
	blocker := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"hold the slot","delay_ms":60000}`)})
	e.waitFor("the blocker to run", func() bool { return e.task(blocker).Status == api.StatusRunning })
	second := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"wait"}`)})
	e.waitFor("the second to wait on the cap", func() bool { return e.task(second).Waiting != nil })
	w := e.task(second).Waiting
	require.Equal(t, api.Wait{Reason: api.WaitConcurrency, Limit: string(demo.Echo.ID)}, *w)
	e.waitFor("the cap's use", func() bool {
		got := e.limits()
		return len(got.Concurrency) == 1 && got.Concurrency[0].Running == 1 && got.Concurrency[0].Waiting == 1
	})
	require.Equal(t, http.StatusNoContent, e.do(http.MethodDelete, "/api/v1/limits/concurrency/demo.echo", adminToken, nil).status)
	_, err := e.srv.Await(e.ctx, second)
	require.NoError(t, err)
	require.NoError(t, e.srv.Remove(e.ctx, blocker), "halt the blocker rather than wait for it at the server's stop")
}
