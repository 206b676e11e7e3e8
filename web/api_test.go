package web_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/internal/buildinfo"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/web"
)

func TestAuthRolesAndRouting(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	echo := web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"auth"}`)}

	// No token, a malformed header, an unknown token: 401.
	e.requireError(http.MethodGet, "/api/v1/tasks", "", nil, http.StatusUnauthorized, web.CodeUnauthorized, "")
	r := e.do(http.MethodGet, "/api/v1/tasks", "", nil)
	require.Equal(t, `Bearer realm="stint"`, r.header.Get("WWW-Authenticate"))
	e.requireError(http.MethodGet, "/api/v1/tasks", "nope-nope-nope-nope-nope", nil, http.StatusUnauthorized, web.CodeUnauthorized, "")
	req, err := http.NewRequest(http.MethodGet, e.ts.URL+"/api/v1/tasks", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Basic "+readToken)
	resp, err := e.ts.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	// Even unknown paths say 401 first, telling nothing to strangers.
	e.requireError(http.MethodGet, "/api/v1/nope", "", nil, http.StatusUnauthorized, web.CodeUnauthorized, "")

	// The scheme is case-insensitive.
	req.Header.Set("Authorization", "bearer "+readToken)
	resp, err = e.ts.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// read < submit < admin.
	var who struct {
		Role      string           `json:"role"`
		Auth      bool             `json:"auth"`
		Behaviors []api.BehaviorID `json:"behaviors"`
	}
	for token, role := range map[string]string{readToken: "read", submitToken: "submit", adminToken: "admin"} {
		e.json(http.MethodGet, "/api/v1/whoami", token, nil, http.StatusOK, &who)
		require.Equal(t, role, who.Role)
		require.True(t, who.Auth)
		require.Equal(t, []api.BehaviorID{"demo.echo", "ingest.batch", "ingest.job", "replication", "replication.continuous", "test.fail", "test.idle", "test.limited"}, who.Behaviors)
	}
	e.requireError(http.MethodPost, "/api/v1/tasks", readToken, echo, http.StatusForbidden, web.CodeForbidden, "")
	id := e.submit(echo)
	_, err = e.srv.Await(e.ctx, id)
	require.NoError(t, err)
	var sub api.Submission
	e.json(http.MethodPost, "/api/v1/tasks", adminToken, echo, http.StatusCreated, &sub)
	for _, path := range []string{"/api/v1/tasks/" + string(id) + "/retry", "/api/v1/groups/g/hold", "/api/v1/behaviors/demo.echo/pause"} {
		e.requireError(http.MethodPost, path, submitToken, nil, http.StatusForbidden, web.CodeForbidden, "")
		e.requireError(http.MethodPost, path, readToken, nil, http.StatusForbidden, web.CodeForbidden, "")
	}
	e.requireError(http.MethodDelete, "/api/v1/tasks/"+string(id), submitToken, nil, http.StatusForbidden, web.CodeForbidden, "")
	e.json(http.MethodGet, "/api/v1/tasks/"+string(id), readToken, nil, http.StatusOK, nil)

	// Unknown paths are 404, known paths with another method 405.
	e.requireError(http.MethodGet, "/api/v1/nope", readToken, nil, http.StatusNotFound, web.CodeNotFound, "")
	require.Equal(t, http.StatusNotFound, e.do(http.MethodGet, "/api/v2/tasks", readToken, nil).status)
}

func TestStaticDashboard(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.do(http.MethodGet, "/", "", nil)
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, "text/html; charset=utf-8", r.header.Get("Content-Type"))
	require.Contains(t, r.header.Get("Content-Security-Policy"), "default-src 'none'")
	require.Equal(t, "nosniff", r.header.Get("X-Content-Type-Options"))
	require.Contains(t, string(r.body), `<script src="/assets/app.js" defer></script>`)
	etag := r.header.Get("ETag")
	require.NotEmpty(t, etag)

	req, err := http.NewRequest(http.MethodGet, e.ts.URL+"/", nil)
	require.NoError(t, err)
	req.Header.Set("If-None-Match", etag)
	resp, err := e.ts.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNotModified, resp.StatusCode)

	for file, ct := range map[string]string{"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"} {
		r := e.do(http.MethodGet, "/assets/"+file, "", nil)
		require.Equal(t, http.StatusOK, r.status, file)
		require.Equal(t, ct, r.header.Get("Content-Type"), file)
	}
	require.Equal(t, http.StatusNotFound, e.do(http.MethodGet, "/assets/nope.js", "", nil).status)
	require.Equal(t, http.StatusNotFound, e.do(http.MethodGet, "/assets/index.html", "", nil).status)
	require.Equal(t, http.StatusNotFound, e.do(http.MethodGet, "/index.html", "", nil).status)
}

func TestErrorStatusAndAllow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.do(http.MethodPut, "/api/v1/tasks", readToken, nil)
	require.Equal(t, http.StatusMethodNotAllowed, r.status, "%s", r.body)
	require.Equal(t, "GET, POST", r.header.Get("Allow"))
	require.Contains(t, string(r.body), `"code":"method_not_allowed"`)
	r = e.do(http.MethodPut, "/api/v1/tasks/abc/hold", readToken, nil)
	require.Equal(t, http.StatusMethodNotAllowed, r.status)
	require.Equal(t, "GET, POST, DELETE", r.header.Get("Allow"), "GET and DELETE of the task abc/hold")
	r = e.do(http.MethodPost, "/api/v1/tasks/abc", readToken, nil)
	require.Equal(t, http.StatusMethodNotAllowed, r.status)
	require.Equal(t, "GET, DELETE", r.header.Get("Allow"))
}

func TestSubmitGetAndList(t *testing.T) {
	t.Parallel()
	e := newEnv(t)

	var sub api.Submission
	r := e.do(http.MethodPost, "/api/v1/tasks", submitToken, web.SubmitBody{
		Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"hello","upper":true}`), ID: "echo-1", GroupKey: "g-1",
	})
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.Equal(t, "/api/v1/tasks/echo-1", r.header.Get("Location"))
	require.NoError(t, json.Unmarshal(r.body, &sub))
	// The server behind the API may start its own submit's task at once
	// (a local start), so the task is stored running or scheduled.
	require.Contains(t, []api.Status{api.StatusScheduled, api.StatusRunning}, sub.Status)
	require.Equal(t, api.Submission{ID: "echo-1", Created: true, Status: sub.Status}, sub)

	_, err := e.srv.Await(e.ctx, "echo-1")
	require.NoError(t, err)
	var task api.Task
	e.json(http.MethodGet, "/api/v1/tasks/echo-1", readToken, nil, http.StatusOK, &task)
	require.Equal(t, api.StatusSuccess, task.Status)
	require.JSONEq(t, `{"text":"HELLO","attempt":1}`, string(task.Result))
	require.JSONEq(t, `{"text":"hello","upper":true}`, string(task.Params))
	require.Equal(t, "g-1", task.GroupKey)
	require.Equal(t, e.srv.Node(), task.Node)
	require.Equal(t, 1, task.Attempt)

	// Submitting the id again merges: 200, not 201.
	e.json(http.MethodPost, "/api/v1/tasks", submitToken, web.SubmitBody{
		Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"again"}`), ID: "echo-1",
	}, http.StatusOK, &sub)
	require.False(t, sub.Created)

	// Priority and delay: a task a day away stays scheduled.
	prio := 7
	e.json(http.MethodPost, "/api/v1/tasks", submitToken, web.SubmitBody{
		Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"later"}`), ID: "echo-later", Priority: &prio, Delay: "24h",
	}, http.StatusCreated, &sub)
	e.json(http.MethodGet, "/api/v1/tasks/echo-later", readToken, nil, http.StatusOK, &task)
	require.Equal(t, api.StatusScheduled, task.Status)
	require.Equal(t, 7, task.Priority)
	require.NotNil(t, task.ScheduleNotBefore)
	require.WithinDuration(t, time.Now().Add(24*time.Hour), *task.ScheduleNotBefore, time.Hour)

	// Keyset paging through idle tasks, with filters.
	var want []api.TaskID
	for i := range 7 {
		id := api.TaskID(fmt.Sprintf("idle-%02d", i))
		group := "even"
		if i%2 == 1 {
			group = "odd"
		}
		e.json(http.MethodPost, "/api/v1/tasks", submitToken, web.SubmitBody{Behavior: idleKind.ID, ID: id, GroupKey: group}, http.StatusCreated, nil)
		want = append(want, id)
	}
	var got []api.TaskID
	after := ""
	pages := 0
	for {
		var page api.Page
		e.json(http.MethodGet, "/api/v1/tasks?behavior=test.idle&status=scheduled&limit=3&after="+after, readToken, nil, http.StatusOK, &page)
		pages++
		for _, t := range page.Tasks {
			got = append(got, t.ID)
		}
		if page.Next == "" {
			break
		}
		require.Len(t, page.Tasks, 3)
		after = string(page.Next)
	}
	require.Equal(t, want, got)
	require.Equal(t, 3, pages)

	var page api.Page
	e.json(http.MethodGet, "/api/v1/tasks?group=odd", readToken, nil, http.StatusOK, &page)
	require.Len(t, page.Tasks, 3)
	e.json(http.MethodGet, "/api/v1/tasks?behavior=demo.echo&status=scheduled", readToken, nil, http.StatusOK, &page)
	require.NotEmpty(t, page.Tasks)
	for _, task := range page.Tasks {
		require.Equal(t, demo.Echo.ID, task.Behavior)
		require.Equal(t, api.StatusScheduled, task.Status)
	}
	require.Equal(t, api.TaskID("echo-later"), page.Tasks[len(page.Tasks)-1].ID)
	e.json(http.MethodGet, "/api/v1/tasks?status=held", readToken, nil, http.StatusOK, &page)
	require.NotNil(t, page.Tasks, "an empty page is [], not null")
	require.Empty(t, page.Tasks)
	e.json(http.MethodGet, "/api/v1/tasks?parent=no-such-parent", readToken, nil, http.StatusOK, &page)
	require.Empty(t, page.Tasks)

	// A retention of its own.
	e.json(http.MethodPost, "/api/v1/tasks", submitToken, web.SubmitBody{Behavior: idleKind.ID, ID: "kept-a-day", Retention: "24h"}, http.StatusCreated, &sub)
	e.json(http.MethodGet, "/api/v1/tasks/kept-a-day", readToken, nil, http.StatusOK, &task)
	require.Equal(t, 24*time.Hour, task.Retention)

	// An id with a slash, escaped in the path.
	e.json(http.MethodPost, "/api/v1/tasks", submitToken, web.SubmitBody{Behavior: idleKind.ID, ID: "coll/item:1"}, http.StatusCreated, &sub)
	e.json(http.MethodGet, "/api/v1/tasks/"+url.PathEscape("coll/item:1"), readToken, nil, http.StatusOK, &task)
	require.Equal(t, api.TaskID("coll/item:1"), task.ID)
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	bad := func(method, path string, body any, status int, field string) {
		t.Helper()
		e.requireError(method, path, adminToken, body, status, web.CodeInvalid, field)
	}
	// List filters.
	bad(http.MethodGet, "/api/v1/tasks?status=bogus", nil, http.StatusBadRequest, "status")
	bad(http.MethodGet, "/api/v1/tasks?limit=0", nil, http.StatusBadRequest, "limit")
	bad(http.MethodGet, "/api/v1/tasks?limit=1001", nil, http.StatusBadRequest, "limit")
	bad(http.MethodGet, "/api/v1/tasks?limit=ten", nil, http.StatusBadRequest, "limit")
	bad(http.MethodGet, "/api/v1/tasks?behavior=Not+A+Behavior", nil, http.StatusBadRequest, "behavior")
	bad(http.MethodGet, "/api/v1/tasks?parent=x", nil, http.StatusBadRequest, "parent")
	bad(http.MethodGet, "/api/v1/tasks?after=a%20b", nil, http.StatusBadRequest, "after")
	bad(http.MethodGet, "/api/v1/tasks?group=", nil, http.StatusBadRequest, "group")
	bad(http.MethodGet, "/api/v1/tasks?group=a%00b", nil, http.StatusBadRequest, "group")
	bad(http.MethodGet, "/api/v1/tasks?stauts=success", nil, http.StatusBadRequest, "stauts")
	bad(http.MethodGet, "/api/v1/tasks?status=success&status=failure", nil, http.StatusBadRequest, "status")
	bad(http.MethodGet, "/api/v1/tasks?a=%zz", nil, http.StatusBadRequest, "query")
	bad(http.MethodGet, "/api/v1/stats?x=1", nil, http.StatusBadRequest, "x")

	// Ids in paths.
	bad(http.MethodGet, "/api/v1/tasks/ab", nil, http.StatusBadRequest, "id")
	bad(http.MethodPost, "/api/v1/tasks/a%20b/hold", nil, http.StatusBadRequest, "id")
	bad(http.MethodDelete, "/api/v1/tasks/"+strings.Repeat("x", 129), nil, http.StatusBadRequest, "id")
	bad(http.MethodPost, "/api/v1/behaviors/Bad!/pause", nil, http.StatusBadRequest, "behavior")
	bad(http.MethodPost, "/api/v1/groups/"+url.PathEscape(strings.Repeat("g", 257))+"/hold", nil, http.StatusBadRequest, "group_key")

	// Submit bodies.
	echo := func(params string) web.SubmitBody {
		return web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(params)}
	}
	bad(http.MethodPost, "/api/v1/tasks", web.SubmitBody{Behavior: "no.such"}, http.StatusBadRequest, "behavior")
	bad(http.MethodPost, "/api/v1/tasks", web.SubmitBody{}, http.StatusBadRequest, "behavior")
	bad(http.MethodPost, "/api/v1/tasks", web.SubmitBody{Behavior: idleKind.ID, Retention: "a week"}, http.StatusBadRequest, "retention")
	bad(http.MethodPost, "/api/v1/tasks", web.SubmitBody{Behavior: idleKind.ID, Retention: "-1h"}, http.StatusBadRequest, "retention")
	bad(http.MethodPost, "/api/v1/tasks", echo(`{}`), http.StatusBadRequest, "params.text")
	bad(http.MethodPost, "/api/v1/tasks", echo(`{"text":"x","bogus":1}`), http.StatusBadRequest, "params.bogus")
	bad(http.MethodPost, "/api/v1/tasks", echo(`{"text":5}`), http.StatusBadRequest, "params.text")
	bad(http.MethodPost, "/api/v1/tasks", web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"x"}`), ID: "a b"}, http.StatusBadRequest, "id")
	bad(http.MethodPost, "/api/v1/tasks", web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"x"}`), Delay: "soon"}, http.StatusBadRequest, "delay")
	bad(http.MethodPost, "/api/v1/tasks", web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"x"}`), Delay: "-1s"}, http.StatusBadRequest, "delay")
	neg := -1
	bad(http.MethodPost, "/api/v1/tasks", web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"x"}`), Priority: &neg}, http.StatusBadRequest, "priority")
	bad(http.MethodPost, "/api/v1/tasks", web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"x"}`), GroupKey: "a\tb"}, http.StatusBadRequest, "group_key")
	bad(http.MethodPost, "/api/v1/tasks", `{"behavior":"demo.echo","priority":"high"}`, http.StatusBadRequest, "priority")
	bad(http.MethodPost, "/api/v1/tasks", `{"behavior":"demo.echo","unknown":1}`, http.StatusBadRequest, "unknown")
	bad(http.MethodPost, "/api/v1/tasks", `{"behavior":`, http.StatusBadRequest, "body")
	bad(http.MethodPost, "/api/v1/tasks", `{"behavior":"demo.echo"} {}`, http.StatusBadRequest, "body")
	bad(http.MethodPost, "/api/v1/tasks", `[]`, http.StatusBadRequest, "body")
	bad(http.MethodPost, "/api/v1/tasks", ``, http.StatusBadRequest, "body")
	bad(http.MethodPost, "/api/v1/tasks", `{nope}`, http.StatusBadRequest, "body")

	// Over the body limit: 413, and nothing read past it.
	big := `{"behavior":"demo.echo","params":{"text":"` + strings.Repeat("x", 2<<20) + `"}}`
	bad(http.MethodPost, "/api/v1/tasks", big, http.StatusRequestEntityTooLarge, "body")

	// Not JSON.
	req, err := http.NewRequest(http.MethodPost, e.ts.URL+"/api/v1/tasks", strings.NewReader(`behavior=demo.echo`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+submitToken)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := e.ts.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnsupportedMediaType, resp.StatusCode)

	// Nothing of that was stored.
	var page api.Page
	e.json(http.MethodGet, "/api/v1/tasks", readToken, nil, http.StatusOK, &page)
	require.Empty(t, page.Tasks)
}

func TestNotFound(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/api/v1/tasks/no-such-task"},
		{http.MethodPost, "/api/v1/tasks/no-such-task/hold"},
		{http.MethodPost, "/api/v1/tasks/no-such-task/release"},
		{http.MethodPost, "/api/v1/tasks/no-such-task/retry"},
		{http.MethodDelete, "/api/v1/tasks/no-such-task"},
		{http.MethodPost, "/api/v1/behaviors/no.such/pause"},
		{http.MethodPost, "/api/v1/behaviors/no.such/resume"},
	} {
		ae := e.requireError(c.method, c.path, adminToken, nil, http.StatusNotFound, web.CodeNotFound, "")
		require.Contains(t, ae.Error.Message, "no", c.path)
	}
	r := e.do(http.MethodGet, "/api/v1/events?id=no-such-task", readToken, nil)
	require.Equal(t, http.StatusNotFound, r.status, "%s", r.body)
}

func TestAdminActions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.submit(web.SubmitBody{Behavior: idleKind.ID, GroupKey: "coll/a"})
	path := "/api/v1/tasks/" + string(id)

	var task api.Task
	e.json(http.MethodPost, path+"/hold", adminToken, nil, http.StatusOK, &task)
	require.Equal(t, api.StatusHeld, task.Status)
	ae := e.requireError(http.MethodPost, path+"/hold", adminToken, nil, http.StatusConflict, web.CodeConflict, "")
	require.Contains(t, ae.Error.Message, "it is held")
	e.json(http.MethodPost, path+"/release", adminToken, nil, http.StatusOK, &task)
	require.Equal(t, api.StatusScheduled, task.Status)
	e.requireError(http.MethodPost, path+"/release", adminToken, nil, http.StatusConflict, web.CodeConflict, "")
	e.requireError(http.MethodPost, path+"/retry", adminToken, nil, http.StatusConflict, web.CodeConflict, "")

	// Retry a task that failed for good.
	failed := e.submit(web.SubmitBody{Behavior: failKind.ID})
	done, err := e.srv.Await(e.ctx, failed)
	require.NoError(t, err)
	require.Equal(t, api.StatusFailure, done.Status)
	require.Equal(t, "boom", done.Error.Code)
	e.json(http.MethodPost, "/api/v1/tasks/"+string(failed)+"/retry", adminToken, nil, http.StatusOK, &task)
	require.Contains(t, []api.Status{api.StatusScheduled, api.StatusRunning, api.StatusFailure}, task.Status)
	done, err = e.srv.Await(e.ctx, failed)
	require.NoError(t, err)
	require.Equal(t, 1, done.Attempt, "a retry starts the attempts afresh")

	// Groups: hold and release, with a slash in the key.
	groupPath := "/api/v1/groups/" + url.PathEscape("coll/a")
	var held struct {
		GroupKey string `json:"group_key"`
		Held     bool   `json:"held"`
	}
	e.json(http.MethodPost, groupPath+"/hold", adminToken, nil, http.StatusOK, &held)
	require.Equal(t, "coll/a", held.GroupKey)
	require.True(t, held.Held)
	var stats web.StatsResponse
	e.json(http.MethodGet, "/api/v1/stats", readToken, nil, http.StatusOK, &stats)
	require.Equal(t, []string{"coll/a"}, stats.HeldGroups)
	require.Zero(t, queue(t, stats, idleKind.ID).DueNow, "a task of a held group is not due")
	e.json(http.MethodPost, groupPath+"/release", adminToken, nil, http.StatusOK, &held)
	require.False(t, held.Held)
	e.json(http.MethodGet, "/api/v1/stats", readToken, nil, http.StatusOK, &stats)
	require.Empty(t, stats.HeldGroups)
	require.EqualValues(t, 1, queue(t, stats, idleKind.ID).DueNow)

	// Behaviors: pause and resume.
	var paused struct {
		Behavior api.BehaviorID `json:"behavior"`
		Paused   bool           `json:"paused"`
	}
	e.json(http.MethodPost, "/api/v1/behaviors/demo.echo/pause", adminToken, nil, http.StatusOK, &paused)
	require.True(t, paused.Paused)
	e.json(http.MethodGet, "/api/v1/stats", readToken, nil, http.StatusOK, &stats)
	require.True(t, queue(t, stats, demo.Echo.ID).Paused)
	e.json(http.MethodPost, "/api/v1/behaviors/demo.echo/resume", adminToken, nil, http.StatusOK, &paused)
	require.False(t, paused.Paused)
	e.json(http.MethodGet, "/api/v1/stats", readToken, nil, http.StatusOK, &stats)
	require.False(t, queue(t, stats, demo.Echo.ID).Paused)

	// Remove: 204, then gone.
	r := e.do(http.MethodDelete, path, adminToken, nil)
	require.Equal(t, http.StatusNoContent, r.status, "%s", r.body)
	require.Empty(t, r.body)
	e.requireError(http.MethodGet, path, readToken, nil, http.StatusNotFound, web.CodeNotFound, "")
	e.requireError(http.MethodDelete, path, adminToken, nil, http.StatusNotFound, web.CodeNotFound, "")
}

// queue returns the statistics of behavior b.
func queue(t *testing.T, s web.StatsResponse, b api.BehaviorID) web.QueueStats {
	t.Helper()
	for _, q := range s.Behaviors {
		if q.Behavior == b {
			return q
		}
	}
	t.Fatalf("no statistics for %s in %+v", b, s.Behaviors)
	return web.QueueStats{}
}

func TestStatsAndNodes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for range 3 {
		e.submit(web.SubmitBody{Behavior: idleKind.ID})
	}
	id := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"s"}`)})
	_, err := e.srv.Await(e.ctx, id)
	require.NoError(t, err)
	// A task that runs until its context ends, to count it running.
	running := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"r","delay_ms":60000}`)})
	ch, err := e.srv.Subscribe(e.ctx, api.Filter{ID: running})
	require.NoError(t, err)
	for ev := range ch {
		if ev.Status == api.StatusRunning {
			break
		}
	}

	var stats web.StatsResponse
	e.json(http.MethodGet, "/api/v1/stats", readToken, nil, http.StatusOK, &stats)
	require.WithinDuration(t, time.Now(), stats.Now, time.Minute)
	idle := queue(t, stats, idleKind.ID)
	require.Equal(t, map[api.Status]int64{"waiting": 0, "scheduled": 3, "running": 0, "held": 0, "success": 0, "failure": 0}, idle.Counts,
		"every state, zeros included")
	require.EqualValues(t, 3, idle.Total)
	require.EqualValues(t, 3, idle.DueNow)
	require.GreaterOrEqual(t, idle.OldestDueAgeMS, int64(0))
	echo := queue(t, stats, demo.Echo.ID)
	require.EqualValues(t, 1, echo.Counts[api.StatusSuccess])
	require.EqualValues(t, 1, echo.Counts[api.StatusRunning])
	require.Zero(t, echo.DueNow)
	fail := queue(t, stats, failKind.ID)
	require.Zero(t, fail.Total, "registered behaviors show without tasks")
	require.EqualValues(t, 5, stats.Totals.Total)
	require.EqualValues(t, 3, stats.Totals.DueNow)
	require.Equal(t, []web.NodeRunning{{Node: e.srv.Node(), Running: 1}}, stats.Nodes)

	// A node that registered long ago and never beat again looks dead to
	// a handler that expects a heartbeat every nanosecond.
	require.NoError(t, e.st.RegisterNode(e.ctx, store.Node{ID: "ghost", Host: "nowhere", PID: 1, Version: "v0.0.1"}))
	var nodes web.NodesResponse
	e.json(http.MethodGet, "/api/v1/nodes", readToken, nil, http.StatusOK, &nodes)
	require.Len(t, nodes.Nodes, 2)
	byID := map[string]web.NodeStatus{}
	for _, n := range nodes.Nodes {
		byID[n.ID] = n
	}
	self := byID[e.srv.Node()]
	require.Equal(t, web.HealthOK, self.Health)
	require.EqualValues(t, 1, self.Running)
	require.Equal(t, []api.BehaviorID{demo.Echo.ID, failKind.ID, api.WorkflowBehavior, api.GateBehavior, api.SubworkflowBehavior}, self.Behaviors,
		"its own and those every server runs")
	require.GreaterOrEqual(t, self.HeartbeatAgeMS, int64(0))
	require.Less(t, self.HeartbeatAgeMS, int64(time.Minute/time.Millisecond))
	require.Equal(t, web.HealthOK, byID["ghost"].Health)
	require.Equal(t, buildinfo.Read().String(), self.Version, "a node registers its version")
	require.Equal(t, "v0.0.1", byID["ghost"].Version)

	cfg := e.cfg
	cfg.NodeHeartbeat = time.Nanosecond
	h, err := web.New(cfg)
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	req := httptest.NewRequestWithContext(e.ctx, http.MethodGet, "/api/v1/nodes", nil)
	req.Header.Set("Authorization", "Bearer "+readToken)
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &nodes))
	for _, n := range nodes.Nodes {
		if n.ID == "ghost" {
			require.Equal(t, web.HealthDead, n.Health)
		}
	}
	require.NoError(t, e.srv.Remove(e.ctx, running))
}

func TestSQLInjectionThroughFilters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for i := range 3 {
		e.submit(web.SubmitBody{Behavior: idleKind.ID, ID: api.TaskID(fmt.Sprintf("victim-%d", i)), GroupKey: "g"})
	}
	snapshot := func() []api.TaskID {
		var page api.Page
		e.json(http.MethodGet, "/api/v1/tasks", readToken, nil, http.StatusOK, &page)
		var ids []api.TaskID
		for _, t := range page.Tasks {
			ids = append(ids, t.ID)
		}
		return ids
	}
	before := snapshot()
	require.Len(t, before, 3)

	attacks := []string{
		`' OR '1'='1`,
		`g' OR 1=1 --`,
		`'; DROP TABLE stint_task; --`,
		`g'); DELETE FROM stint_task; --`,
		`" OR ""="`,
		`\' OR 1=1 /*`,
	}
	for _, a := range attacks {
		// Free-form filters are bound as parameters: they match nothing.
		var page api.Page
		e.json(http.MethodGet, "/api/v1/tasks?group="+url.QueryEscape(a), readToken, nil, http.StatusOK, &page)
		require.Empty(t, page.Tasks, "group=%s", a)
		// Filters with a format refuse the attempt outright.
		for _, param := range []string{"behavior", "status", "parent", "after"} {
			e.requireError(http.MethodGet, "/api/v1/tasks?"+param+"="+url.QueryEscape(a), readToken, nil, http.StatusBadRequest, web.CodeInvalid, param)
		}
		e.requireError(http.MethodGet, "/api/v1/tasks/"+url.PathEscape(a), readToken, nil, http.StatusBadRequest, web.CodeInvalid, "id")
		e.requireError(http.MethodDelete, "/api/v1/tasks/"+url.PathEscape(a), adminToken, nil, http.StatusBadRequest, web.CodeInvalid, "id")
		r := e.do(http.MethodGet, "/api/v1/events?behavior="+url.QueryEscape(a), readToken, nil)
		require.Equal(t, http.StatusBadRequest, r.status)
		// A group key may be anything printable: holding one with an
		// attack for a name holds just that (nonexistent) group.
		e.json(http.MethodPost, "/api/v1/groups/"+url.PathEscape(a)+"/hold", adminToken, nil, http.StatusOK, nil)
		e.json(http.MethodPost, "/api/v1/groups/"+url.PathEscape(a)+"/release", adminToken, nil, http.StatusOK, nil)
	}
	require.Equal(t, before, snapshot(), "the tasks are all there, unchanged")
	for _, id := range before {
		task, err := e.srv.Get(e.ctx, id)
		require.NoError(t, err)
		require.Equal(t, api.StatusScheduled, task.Status)
		require.Equal(t, "g", task.GroupKey)
	}
	groups, err := e.srv.HeldGroups(e.ctx)
	require.NoError(t, err)
	require.Empty(t, groups)
}

func TestEventsLive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s, _ := e.openEvents("behavior=demo.echo", nil)
	other := e.submit(web.SubmitBody{Behavior: idleKind.ID}) // filtered out
	id := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"live"}`)})
	require.Equal(t, []api.Status{api.StatusScheduled, api.StatusRunning, api.StatusSuccess}, s.statusesUntilFinal(id, nil))
	_ = other

	// One task's stream starts with its state and ends after it finishes.
	one, _ := e.openEvents("id="+string(id), nil)
	first := one.nextTask(id, nil)
	require.Equal(t, api.StatusSuccess, first.Status)
	require.True(t, first.Final)
	require.Equal(t, "end", one.next().Event)
}

func TestEventsResumeFromCursor(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// A stream from now tells its cursor; close it, run a task, then
	// resume from the cursor: the task's changes are all there.
	s, ready := e.openEvents("since=now&behavior=demo.echo", nil)
	var rd web.ReadyEvent
	require.NoError(t, json.Unmarshal([]byte(ready.Data), &rd))
	require.Positive(t, rd.Cursor)
	s.cancel()

	id := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"missed"}`)})
	_, err := e.srv.Await(e.ctx, id)
	require.NoError(t, err)

	resumed, _ := e.openEvents("", http.Header{"Last-Event-Id": {fmt.Sprint(rd.Cursor)}})
	var last int64
	statuses := resumed.statusesUntilFinal(id, func(ev sseEvent) {
		var c web.CursorEvent
		require.NoError(t, json.Unmarshal([]byte(ev.Data), &c))
		require.Equal(t, fmt.Sprint(c.Cursor), ev.ID)
		require.Greater(t, c.Cursor, last)
		last = c.Cursor
	})
	require.Equal(t, []api.Status{api.StatusScheduled, api.StatusRunning, api.StatusSuccess}, statuses)
	ev := resumed.next()
	require.Equal(t, "cursor", ev.Event, "a cursor follows the batch")

	// Live changes keep coming on the resumed stream.
	id2 := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"live"}`)})
	require.Equal(t, []api.Status{api.StatusScheduled, api.StatusRunning, api.StatusSuccess}, resumed.statusesUntilFinal(id2, nil))

	// Bad cursors are a 400 naming since.
	for _, since := range []string{"abc", "-1", "999999999"} {
		e.requireError(http.MethodGet, "/api/v1/events?since="+since, readToken, nil, http.StatusBadRequest, web.CodeInvalid, "since")
	}
	e.requireError(http.MethodGet, "/api/v1/events?status=bogus", readToken, nil, http.StatusBadRequest, web.CodeInvalid, "status")
	e.requireError(http.MethodGet, "/api/v1/events?group=g", readToken, nil, http.StatusBadRequest, web.CodeInvalid, "group")
	e.requireError(http.MethodGet, "/api/v1/events", "", nil, http.StatusUnauthorized, web.CodeUnauthorized, "")
}

func TestEventStreamLimitAndShutdown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *web.Config) { c.MaxStreams = 1; c.StreamKeepAlive = 20 * time.Millisecond })
	s, _ := e.openEvents("", nil)
	e.requireError(http.MethodGet, "/api/v1/events", readToken, nil, http.StatusServiceUnavailable, web.CodeUnavailable, "")
	s.cancel()

	// A server from NewServer ends its streams on Shutdown rather than
	// waiting for them.
	h, err := web.New(e.cfg)
	require.NoError(t, err)
	srv := web.NewServer(h, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	req, err := http.NewRequestWithContext(e.ctx, http.MethodGet, "http://"+ln.Addr().String()+"/api/v1/events?since=now", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+readToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	stream := &sseStream{t: t, resp: resp, r: bufio.NewReader(resp.Body)}
	require.Equal(t, "ready", stream.next().Event)

	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	require.NoError(t, srv.Shutdown(ctx))
	require.Less(t, time.Since(start), 5*time.Second)
	require.ErrorIs(t, <-served, http.ErrServerClosed)
}

func TestCrossOriginRequestsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *web.Config) { c.Tokens = nil; c.InsecureNoAuth = true })
	id := e.submit(web.SubmitBody{Behavior: idleKind.ID})
	req, err := http.NewRequest(http.MethodPost, e.ts.URL+"/api/v1/tasks/"+string(id)+"/hold", nil)
	require.NoError(t, err)
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err := e.ts.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	task, err := e.srv.Get(e.ctx, id)
	require.NoError(t, err)
	require.Equal(t, api.StatusScheduled, task.Status, "the cross-site request changed nothing")

	// Without auth every caller is admin, and whoami says auth is off.
	var who struct {
		Role string `json:"role"`
		Auth bool   `json:"auth"`
	}
	e.json(http.MethodGet, "/api/v1/whoami", "", nil, http.StatusOK, &who)
	require.Equal(t, "admin", who.Role)
	require.False(t, who.Auth)
	e.json(http.MethodPost, "/api/v1/tasks/"+string(id)+"/hold", "", nil, http.StatusOK, nil)
}

func TestNewRequiresAuthChoice(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := e.cfg
	cfg.Tokens = nil
	_, err := web.New(cfg)
	require.ErrorContains(t, err, "no tokens")
	cfg.Tokens = e.cfg.Tokens
	cfg.InsecureNoAuth = true
	_, err = web.New(cfg)
	require.ErrorContains(t, err, "exclude each other")
	cfg.InsecureNoAuth = false
	cfg.Routes = []web.Route{{Pattern: "GET /tasks", Role: web.RoleRead, Handle: func(http.ResponseWriter, *http.Request) error { return nil }}}
	_, err = web.New(cfg)
	require.ErrorContains(t, err, "conflicts")
}

func TestExtraRoutes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *web.Config) {
		c.Routes = []web.Route{{Pattern: "GET /batches/{id}", Role: web.RoleSubmit, Handle: func(w http.ResponseWriter, r *http.Request) error {
			if r.PathValue("id") == "missing" {
				return api.ErrNotFound
			}
			web.WriteJSON(w, http.StatusOK, map[string]string{"id": r.PathValue("id"), "role": web.RoleOf(r).String()})
			return nil
		}}}
	})
	var got map[string]string
	e.json(http.MethodGet, "/api/v1/batches/b1", adminToken, nil, http.StatusOK, &got)
	require.Equal(t, map[string]string{"id": "b1", "role": "admin"}, got)
	e.requireError(http.MethodGet, "/api/v1/batches/b1", readToken, nil, http.StatusForbidden, web.CodeForbidden, "")
	e.requireError(http.MethodGet, "/api/v1/batches/missing", submitToken, nil, http.StatusNotFound, web.CodeNotFound, "")
}

func TestEventStreamOutlivesServerTimeouts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *web.Config) { c.StreamKeepAlive = 50 * time.Millisecond })
	base := e.serveWithTimeouts(300 * time.Millisecond)
	req, err := http.NewRequestWithContext(e.ctx, http.MethodGet, base+"/api/v1/events?since=now&behavior=demo.echo", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+readToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	s := &sseStream{t: t, resp: resp, r: bufio.NewReader(resp.Body)}
	require.Equal(t, "ready", s.next().Event)
	// Cursor events come every keep-alive interval; read them for more
	// than three times the server's timeouts.
	for start := time.Now(); time.Since(start) < time.Second; {
		require.Equal(t, "cursor", s.next().Event)
	}
	id := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"late"}`)})
	require.Equal(t, []api.Status{api.StatusScheduled, api.StatusRunning, api.StatusSuccess}, s.statusesUntilFinal(id, nil))
}

func TestSchedulesList(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var resp web.SchedulesResponse
	e.json(http.MethodGet, "/api/v1/schedules", readToken, nil, http.StatusOK, &resp)
	require.NotNil(t, resp.Schedules, "an empty list is [], not null")
	require.Empty(t, resp.Schedules)

	require.NoError(t, e.srv.AddSchedule(e.ctx, api.Schedule{Name: "nightly-echo", Behavior: demo.Echo.ID, Spec: "30 2 * * *",
		TimeZone: "Asia/Tokyo", Params: json.RawMessage(`{"text":"night"}`)}))
	e.json(http.MethodGet, "/api/v1/schedules", readToken, nil, http.StatusOK, &resp)
	require.Len(t, resp.Schedules, 1)
	s := resp.Schedules[0]
	require.Equal(t, "nightly-echo", s.Name)
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	require.NoError(t, err)
	require.Equal(t, []int{2, 30}, []int{s.NextTick.In(tokyo).Hour(), s.NextTick.In(tokyo).Minute()})

	e.requireError(http.MethodGet, "/api/v1/schedules?x=1", readToken, nil, http.StatusBadRequest, web.CodeInvalid, "x")
	e.requireError(http.MethodGet, "/api/v1/schedules", "", nil, http.StatusUnauthorized, web.CodeUnauthorized, "")
}
