package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/web"
)

// awaitTask sends GET /api/v1/tasks/{id}?wait=wait to base and returns the
// task and the Stint-Wait header; it fails the test unless the answer is
// 200.
func awaitTask(t *testing.T, ctx context.Context, base string, id api.TaskID, wait string) (api.Task, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/tasks/"+string(id)+"?wait="+wait, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+readToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var task api.Task
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&task))
	return task, resp.Header.Get(web.WaitHeader)
}

// A GET with wait answers when the task finishes for good, whichever way,
// saying so in Stint-Wait; a task already finished answers at once.
func TestAwaitAnswersWhenTheTaskFinishes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)

	// A task due in an hour is awaited, then submitted again to be due
	// now: it runs and succeeds while the request waits.
	body := web.SubmitBody{Behavior: demo.Echo.ID, ID: "await-echo", Params: json.RawMessage(`{"text":"hi"}`), Delay: "1h"}
	e.submit(body)
	done := make(chan api.Task, 1)
	outcome := make(chan string, 1)
	go func() {
		task, wait := awaitTask(t, e.ctx, e.ts.URL, "await-echo", "50s")
		done <- task
		outcome <- wait
	}()
	e.waitFor("the wait to mark the task awaited", func() bool { return e.task("await-echo").Notify })
	require.Empty(t, done, "the task has not run yet")
	body.Delay = ""
	e.json(http.MethodPost, "/api/v1/tasks", submitToken, body, http.StatusOK, nil)
	task := <-done
	require.Equal(t, web.WaitFinished, <-outcome)
	require.Equal(t, api.StatusSuccess, task.Status)
	require.JSONEq(t, `{"text":"hi","attempt":1}`, string(task.Result))

	// A task that nothing runs, failed by hand while it is awaited.
	idle := e.submit(web.SubmitBody{Behavior: idleKind.ID})
	go func() {
		task, wait := awaitTask(t, e.ctx, e.ts.URL, idle, "50s")
		done <- task
		outcome <- wait
	}()
	e.waitFor("the wait to mark the task awaited", func() bool { return e.task(idle).Notify })
	e.json(http.MethodPost, "/api/v1/tasks/"+string(idle)+"/fail", adminToken, web.FailBody{Reason: "test"}, http.StatusOK, nil)
	task = <-done
	require.Equal(t, web.WaitFinished, <-outcome)
	require.Equal(t, api.StatusFailure, task.Status)
	require.Equal(t, api.FailedByHand, task.Error.Code)

	// Finished already: the answer comes at once, whatever the wait.
	task, wait := awaitTask(t, e.ctx, e.ts.URL, idle, "1m")
	require.Equal(t, web.WaitFinished, wait)
	require.Equal(t, api.StatusFailure, task.Status)

	// Without wait, no header.
	r := e.do(http.MethodGet, "/api/v1/tasks/"+string(idle), readToken, nil)
	require.Equal(t, http.StatusOK, r.status)
	require.Empty(t, r.header.Get(web.WaitHeader))
}

// A GET with wait on a task that does not finish answers when the wait
// runs out, with the task as it is then and Stint-Wait: timeout.
func TestAwaitTimesOut(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.submit(web.SubmitBody{Behavior: idleKind.ID})
	start := time.Now()
	task, wait := awaitTask(t, e.ctx, e.ts.URL, id, "1s")
	require.GreaterOrEqual(t, time.Since(start), time.Second, "it waited")
	require.Equal(t, web.WaitTimeout, wait)
	require.Equal(t, id, task.ID)
	require.Equal(t, api.StatusScheduled, task.Status)
	require.NotNil(t, task.Waiting, "no node runs test.idle, and the answer says so")
	require.Equal(t, api.WaitNoNode, task.Waiting.Reason)
}

// A wait longer than the server's read and write timeouts is answered:
// the handler lifts them for the wait.
func TestAwaitOutlivesServerTimeouts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	base := e.serveWithTimeouts(300 * time.Millisecond)
	id := e.submit(web.SubmitBody{Behavior: idleKind.ID})
	task, wait := awaitTask(t, e.ctx, base, id, "1500ms")
	require.Equal(t, web.WaitTimeout, wait)
	require.Equal(t, api.StatusScheduled, task.Status)
}

// A client that goes away ends the wait: the handler returns long before
// the wait would run out, and with it the await (which holds nothing once
// it returned).
func TestAwaitEndsWhenTheClientGoesAway(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	h, err := web.New(e.cfg)
	require.NoError(t, err)
	var inFlight atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inFlight.Add(1)
		defer inFlight.Add(-1)
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)

	id := e.submit(web.SubmitBody{Behavior: idleKind.ID})
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+"/api/v1/tasks/"+string(id)+"?wait=1m", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+readToken)
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("answered %s", resp.Status)
		}
		errc <- err
	}()
	e.waitFor("the wait to mark the task awaited", func() bool { return e.task(id).Notify })
	require.Equal(t, int64(1), inFlight.Load(), "the request waits")
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	deadline := time.Now().Add(20 * time.Second) // far less than the minute asked
	for inFlight.Load() != 0 {
		require.True(t, time.Now().Before(deadline), "the handler still waits after its client went away")
		time.Sleep(10 * time.Millisecond)
	}
}

// Bad waits are a 400 naming wait, before anything is read; a bad or
// unknown id is refused as without a wait.
func TestAwaitBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := string(e.submit(web.SubmitBody{Behavior: idleKind.ID}))
	for _, wait := range []string{"", "30", "soon", "0s", "-1s", "61s", "1h", "30s&wait=30s"} {
		t.Run(wait, func(t *testing.T) {
			e.requireError(http.MethodGet, "/api/v1/tasks/"+id+"?wait="+wait, readToken, nil, http.StatusBadRequest, web.CodeInvalid, "wait")
		})
	}
	e.requireError(http.MethodGet, "/api/v1/tasks/"+id+"?bogus=1", readToken, nil, http.StatusBadRequest, web.CodeInvalid, "bogus")
	e.requireError(http.MethodGet, "/api/v1/tasks/no-such-task?wait=1m", readToken, nil, http.StatusNotFound, web.CodeNotFound, "")
	e.requireError(http.MethodGet, "/api/v1/tasks/a%20b?wait=1m", readToken, nil, http.StatusBadRequest, web.CodeInvalid, "id")
	e.requireError(http.MethodGet, "/api/v1/tasks/"+id+"?wait=1m", "", nil, http.StatusUnauthorized, web.CodeUnauthorized, "")
	require.False(t, e.task(api.TaskID(id)).Notify, "no wait began")
}

// A batch submit answers each element with its submission or its own
// error: the bad elements are not stored, the good ones are.
func TestBatchSubmit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	batch := `[
		{"behavior": "demo.echo", "id": "batch-1", "params": {"text": "one"}},
		{"behavior": "demo.echo", "id": "batch-2", "params": {}},
		5,
		{"behavior": "no.such", "id": "batch-3"},
		{"behavior": "test.idle", "id": "batch-4", "delay": "soon"},
		{"behavior": "test.idle", "id": "batch-5", "bogus": 1},
		{"behavior": "test.idle", "id": "batch-6", "group_key": "g"},
		{"behavior": "test.idle", "id": "batch-6"}
	]`
	var answers []web.SubmitAnswer
	e.json(http.MethodPost, "/api/v1/tasks", submitToken, batch, http.StatusOK, &answers)
	require.Len(t, answers, 8)
	stored := func(i int, id api.TaskID) {
		t.Helper()
		require.Nil(t, answers[i].Error, "element %d", i)
		require.NotNil(t, answers[i].Submission, "element %d", i)
		require.Equal(t, id, answers[i].ID, "element %d", i)
		require.Equal(t, id, e.task(id).ID)
	}
	refused := func(i int, field string) {
		t.Helper()
		require.Nil(t, answers[i].Submission, "element %d", i)
		require.NotNil(t, answers[i].Error, "element %d", i)
		require.Equal(t, web.CodeInvalid, answers[i].Error.Code, "element %d", i)
		require.Equal(t, field, answers[i].Error.Field, "element %d: %s", i, answers[i].Error.Message)
		require.NotEmpty(t, answers[i].Error.Message)
	}
	stored(0, "batch-1")
	refused(1, "params.text")
	refused(2, "body")
	refused(3, "behavior")
	refused(4, "delay")
	refused(5, "bogus")
	stored(6, "batch-6")
	stored(7, "batch-6")
	require.True(t, answers[6].Created != answers[7].Created, "one of two elements of one id created the task, the other merged into it")
	for _, id := range []string{"batch-2", "batch-3", "batch-4", "batch-5"} {
		e.requireError(http.MethodGet, "/api/v1/tasks/"+id, readToken, nil, http.StatusNotFound, web.CodeNotFound, "")
	}

	// The answers as JSON: a stored element has no error, a refused one
	// only its error.
	r := e.do(http.MethodPost, "/api/v1/tasks", submitToken, `[{"behavior":"test.idle","id":"batch-7"},{"behavior":"no.such"}]`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var raw []map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(r.body, &raw))
	require.Len(t, raw, 2)
	require.Equal(t, `"batch-7"`, string(raw[0]["id"]))
	require.NotContains(t, raw[0], "error")
	require.Contains(t, raw[1], "error")
	require.NotContains(t, raw[1], "id")
}

// A batch that is empty, too long or not JSON is refused whole and stores
// nothing.
func TestBatchSubmitRefusedWhole(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	elems := make([]string, web.MaxBatchSubmit+1)
	for i := range elems {
		elems[i] = fmt.Sprintf(`{"behavior":"test.idle","id":"too-many-%d"}`, i)
	}
	for name, body := range map[string]string{
		"empty":     `[]`,
		"too long":  "[" + strings.Join(elems, ",") + "]",
		"truncated": `[{"behavior":"test.idle"}`,
		"trailing":  `[{"behavior":"test.idle"}] {}`,
	} {
		t.Run(name, func(t *testing.T) {
			e.requireError(http.MethodPost, "/api/v1/tasks", submitToken, body, http.StatusBadRequest, web.CodeInvalid, "body")
		})
	}
	var page api.Page
	e.json(http.MethodGet, "/api/v1/tasks", readToken, nil, http.StatusOK, &page)
	require.Empty(t, page.Tasks)

	// The largest batch allowed goes through.
	var answers []web.SubmitAnswer
	e.json(http.MethodPost, "/api/v1/tasks", submitToken, "["+strings.Join(elems[:web.MaxBatchSubmit], ",")+"]", http.StatusOK, &answers)
	require.Len(t, answers, web.MaxBatchSubmit)
	for i, a := range answers {
		require.Nil(t, a.Error, "element %d", i)
		require.True(t, a.Created, "element %d", i)
	}
}
