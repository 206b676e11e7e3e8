package web_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/web"
)

// recorder is an http.Handler that keeps the path, query and body of the
// answers to the GET requests of the API it serves.
type recorder struct {
	next    http.Handler
	mu      sync.Mutex
	answers []recorded
}

type recorded struct {
	path, query string
	body        []byte
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet || !strings.HasPrefix(r.URL.Path, "/api/v1/") || r.URL.Path == "/api/v1/events" {
		rec.next.ServeHTTP(w, r)
		return
	}
	cw := &copyWriter{ResponseWriter: w}
	rec.next.ServeHTTP(cw, r)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.answers = append(rec.answers, recorded{path: r.URL.Path, query: r.URL.RawQuery, body: cw.body.Bytes()})
}

// of returns the answers to requests of path.
func (rec *recorder) of(path string) []recorded {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var out []recorded
	for _, a := range rec.answers {
		if a.path == path {
			out = append(out, a)
		}
	}
	return out
}

// copyWriter is a ResponseWriter that keeps a copy of the body.
type copyWriter struct {
	http.ResponseWriter
	body bytes.Buffer
}

func (w *copyWriter) Write(b []byte) (int, error) {
	w.body.Write(b)
	return w.ResponseWriter.Write(b)
}

// TestDashboardListsShipNoPayloads: the dashboard's lists of tasks and of
// workflows neither read nor ship params, results or progress: the
// requests the page makes for them carry none (and the store's list of
// workflows reads none), while the task's own page reads and shows its
// params and result.
func TestDashboardListsShipNoPayloads(t *testing.T) {
	t.Parallel()
	chromiumPath(t) // installs Chromium, or skips, before the test's deadlines start
	e := newEnv(t)
	const marker = "payload-marker-f00d"
	id := e.submit(web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"` + marker + `"}`), ID: "lists-echo"})
	_, err := e.srv.Await(e.ctx, id)
	require.NoError(t, err)
	later := web.SubmitBody{Behavior: demo.Echo.ID, Params: json.RawMessage(`{"text":"` + marker + `"}`), Delay: "1h"}
	e.json(http.MethodPost, "/api/v1/workflows", submitToken,
		web.WorkflowBody{ID: "lists-wf", Nodes: []web.WorkflowNodeBody{{Name: "later", Task: later}}}, http.StatusCreated, nil)

	wfs, err := e.st.ListWorkflows(e.ctx, api.WorkflowFilter{})
	require.NoError(t, err)
	require.Len(t, wfs.Tasks, 1)
	require.Nil(t, wfs.Tasks[0].Params, "the store's list of workflows reads no params")

	h, err := web.New(e.cfg)
	require.NoError(t, err)
	rec := &recorder{next: h}
	ts := httptest.NewServer(rec)
	t.Cleanup(ts.Close)
	p := openPage(t, e)
	p.run("open the dashboard", chromedp.Navigate(ts.URL+"/"))
	p.run("sign in", signIn(readToken)...)
	p.run("open the task list", goHash("#/tasks"), chromedp.WaitVisible(css(`tr[data-task-id="lists-echo"]`)))
	p.run("open the workflow list", goHash("#/workflows"), chromedp.WaitVisible(css(`tr[data-workflow-id="lists-wf"]`)))
	p.run("open the task's page", goHash("#/tasks/lists-echo"), chromedp.WaitVisible(css(`#task-params`)))
	require.Contains(t, p.text("#task-params"), marker, "the task's own page shows its params")
	require.Empty(t, p.jsErrors())

	for _, path := range []string{"/api/v1/tasks", "/api/v1/workflows"} {
		lists := rec.of(path)
		require.NotEmpty(t, lists, "the dashboard asked for %s", path)
		for _, a := range lists {
			require.NotContains(t, string(a.body), marker, "GET %s?%s shipped payloads", a.path, a.query)
			require.NotContains(t, a.query, "fields=payloads")
		}
	}
	own := rec.of("/api/v1/tasks/lists-echo")
	require.NotEmpty(t, own, "the task's page read the task")
	require.Contains(t, string(own[0].body), marker, "the task's own read has its params")
}
