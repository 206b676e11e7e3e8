package web_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/web"
)

// POST /api/v1/tasks takes a debounce: a second submit of the id moves
// the task's due time and its params win; bad durations and bounds are
// refused naming the field, and store nothing.
func TestSubmitDebounced(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	body := func(text string) string {
		return `{"behavior": "demo.echo", "id": "deb-1", "params": {"text": "` + text + `"},
			"debounce": {"window": "1h", "max_wait": "2h"}}`
	}
	var sub api.Submission
	e.json(http.MethodPost, "/api/v1/tasks", submitToken, body("first"), http.StatusCreated, &sub)
	require.Equal(t, api.Submission{ID: "deb-1", Created: true, Status: api.StatusScheduled}, sub)
	e.json(http.MethodPost, "/api/v1/tasks", submitToken, body("last"), http.StatusOK, &sub)
	require.Equal(t, api.Submission{ID: "deb-1", Status: api.StatusScheduled}, sub)
	var task api.Task
	e.json(http.MethodGet, "/api/v1/tasks/deb-1", readToken, nil, http.StatusOK, &task)
	require.JSONEq(t, `{"text":"last"}`, string(task.Params))
	require.WithinDuration(t, time.Now().Add(time.Hour), *task.ScheduleNotBefore, time.Minute)

	for _, tc := range []struct {
		name, field string
		debounce    *web.DebounceBody
		id          api.TaskID
	}{
		{"a window that is no duration", "debounce.window", &web.DebounceBody{Window: "soon", MaxWait: "1m"}, "deb-2"},
		{"no maximum wait", "debounce.max_wait", &web.DebounceBody{Window: "5s"}, "deb-2"},
		{"a maximum wait under the window", "debounce.max_wait", &web.DebounceBody{Window: "5s", MaxWait: "1s"}, "deb-2"},
		{"no id that repeats", "debounce", &web.DebounceBody{Window: "5s", MaxWait: "1m"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.requireError(http.MethodPost, "/api/v1/tasks", submitToken, web.SubmitBody{Behavior: "demo.echo", ID: tc.id,
				Params: []byte(`{"text":"x"}`), Debounce: tc.debounce}, http.StatusBadRequest, web.CodeInvalid, tc.field)
		})
	}
	var page api.Page
	e.json(http.MethodGet, "/api/v1/tasks?behavior=demo.echo", readToken, nil, http.StatusOK, &page)
	require.Len(t, page.Tasks, 1)
}
