package web_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/behaviors/ingest"
	"github.com/stinthq/stint/behaviors/replication"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
	"github.com/stinthq/stint/web"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The test tokens, one per role.
const (
	readToken   = "read-token-0123456789abcdef"
	submitToken = "submit-token-0123456789abcdef"
	adminToken  = "admin-token-0123456789abcdef"
)

// Test behaviors besides demo.echo: the server runs test.fail, which fails
// for good, and never runs test.idle, whose tasks stay scheduled.
var (
	failKind = api.Kind[noteParams, struct{}]{ID: "test.fail"}
	idleKind = api.Kind[noteParams, struct{}]{ID: "test.idle"}
)

// noteParams are the params of the test behaviors.
type noteParams struct {
	Note string `json:"note,omitempty" validate:"max=100"`
}

// testBehavior is test.fail or test.idle: each submit is its own task, and
// a run fails permanently; with the note "retry" it fails and is retried,
// with the note "progress" it first checkpoints a progress holding a zero
// time (a time never set), and with the note "approve" it sleeps until a
// signal of the topic "approval" comes, and then succeeds.
type testBehavior struct {
	kind api.Kind[noteParams, struct{}]
}

func (b testBehavior) Kind() api.Kind[noteParams, struct{}] { return b.kind }

func (testBehavior) TaskID(ids spi.IDs, _ noteParams) api.TaskID { return ids.Unique() }

func (testBehavior) Run(ctx context.Context, rc spi.RunContext, p noteParams) (struct{}, error) {
	switch p.Note {
	case "retry":
		return struct{}{}, api.Retryable("flaky", "flaky on purpose")
	case "progress":
		progress := struct {
			Rows           int       `json:"rows"`
			CheckpointedAt time.Time `json:"checkpointed_at"`
		}{Rows: 3}
		if err := rc.Checkpoint(ctx, progress); err != nil {
			return struct{}{}, err
		}
	case "approve":
		_, ok, err := rc.Receive(ctx, "approval")
		switch {
		case err != nil:
			return struct{}{}, err
		case !ok:
			return struct{}{}, spi.WaitForSignal("approval", time.Hour)
		}
		return struct{}{}, nil
	}
	return struct{}{}, api.Permanent("boom", "failed on purpose")
}

// testEnv is a server node, its store and the API on a test database.
type testEnv struct {
	t   *testing.T
	ctx context.Context
	st  *postgres.Store
	srv *impl.Server
	ts  *httptest.Server
	cfg web.Config
}

// newEnv starts a server node running demo.echo and test.fail on a fresh
// database, and the API on an httptest server, with the batch endpoints
// (ingest and replication are registered for submits; no node runs them). configure adjusts
// the API's configuration.
func newEnv(t *testing.T, configure ...func(*web.Config)) *testEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	t.Cleanup(cancel)
	st, err := postgres.Open(ctx, pgtest.New(t))
	require.NoError(t, err)
	t.Cleanup(st.Close)
	reg := spi.NewRegistry()
	require.NoError(t, demo.Register(reg))
	require.NoError(t, spi.Register(reg, spi.Behavior[noteParams, struct{}](testBehavior{failKind})))
	require.NoError(t, spi.Register(reg, spi.Behavior[noteParams, struct{}](testBehavior{idleKind})))
	// test.limited is run by limitedNode, in the tests that need it.
	require.NoError(t, spi.Register(reg, spi.Behavior[noteParams, struct{}](limitedBehavior{})))
	require.NoError(t, ingest.RegisterForSubmit(reg))                   // submitted, never run here
	require.NoError(t, replication.Register(reg, replication.Config{})) // submitted, never run here
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv, err := impl.NewServer(st, impl.ServerConfig{
		Node:              "node-" + strings.ReplaceAll(t.Name(), "/", "-"),
		Registry:          reg,
		Behaviors:         []api.BehaviorID{demo.Echo.ID, failKind.ID},
		PollInterval:      50 * time.Millisecond,
		AwaitPollInterval: 50 * time.Millisecond,
		Logger:            log,
	})
	require.NoError(t, err)
	require.NoError(t, srv.Start(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, srv.Stop(stopCtx))
	})

	tokens := &web.Tokens{}
	require.NoError(t, tokens.AddText("test", "read:"+readToken+"\nsubmit:"+submitToken+"\nadmin:"+adminToken))
	cfg := web.Config{
		Client:   srv.Client,
		Registry: reg,
		Tokens:   tokens,
		Routes:   ingest.Routes(ingest.NewAdmin(srv.Client)),
		Features: []string{ingest.Feature},
		FeedPoll: 50 * time.Millisecond,
		Logger:   log,
	}
	for _, c := range configure {
		c(&cfg)
	}
	h, err := web.New(cfg)
	require.NoError(t, err)
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return &testEnv{t: t, ctx: ctx, st: st, srv: srv, ts: ts, cfg: cfg}
}

// response is an HTTP response with its body read.
type response struct {
	status int
	header http.Header
	body   []byte
}

// apiError is the body of an error response.
type apiError struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Field   string `json:"field"`
	} `json:"error"`
}

// do sends a request to the API with token (none when empty) and body
// (JSON-encoded unless it is a string or []byte).
func (e *testEnv) do(method, path, token string, body any) response {
	e.t.Helper()
	return e.doWith(method, path, token, nil, body)
}

// doWith is do with the headers of header besides, which replace those do
// sets.
func (e *testEnv) doWith(method, path, token string, header http.Header, body any) response {
	e.t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	case []byte:
		r = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		require.NoError(e.t, err)
		r = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(e.ctx, method, e.ts.URL+path, r)
	require.NoError(e.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := e.ts.Client().Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return response{status: resp.StatusCode, header: resp.Header, body: raw}
}

// json sends a request that must answer status, and decodes the body
// into out (unless nil).
func (e *testEnv) json(method, path, token string, body any, status int, out any) {
	e.t.Helper()
	r := e.do(method, path, token, body)
	require.Equal(e.t, status, r.status, "%s %s: %s", method, path, r.body)
	if out != nil {
		require.NoError(e.t, json.Unmarshal(r.body, out), "%s", r.body)
	}
}

// requireError checks that a request fails with status, code and field.
func (e *testEnv) requireError(method, path, token string, body any, status int, code, field string) apiError {
	e.t.Helper()
	r := e.do(method, path, token, body)
	require.Equal(e.t, status, r.status, "%s %s: %s", method, path, r.body)
	require.Equal(e.t, "application/json; charset=utf-8", r.header.Get("Content-Type"))
	var ae apiError
	require.NoError(e.t, json.Unmarshal(r.body, &ae), "%s", r.body)
	require.Equal(e.t, code, ae.Error.Code, "%s", r.body)
	require.Equal(e.t, field, ae.Error.Field, "%s", r.body)
	require.NotEmpty(e.t, ae.Error.Message)
	return ae
}

// submit submits a task through the API and returns its id.
func (e *testEnv) submit(body web.SubmitBody) api.TaskID {
	e.t.Helper()
	var sub api.Submission
	e.json(http.MethodPost, "/api/v1/tasks", submitToken, body, http.StatusCreated, &sub)
	return sub.ID
}

// sseEvent is one Server-Sent Event.
type sseEvent struct {
	Event, ID, Data string
}

// sseStream reads an event stream.
type sseStream struct {
	t      *testing.T
	resp   *http.Response
	r      *bufio.Reader
	cancel context.CancelFunc
}

// openEvents opens GET /api/v1/events?query with the read token and
// header; it fails the test unless the answer is 200 and a "ready" event.
func (e *testEnv) openEvents(query string, header http.Header) (*sseStream, sseEvent) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.ctx)
	e.t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.ts.URL+"/api/v1/events?"+query, nil)
	require.NoError(e.t, err)
	req.Header.Set("Authorization", "Bearer "+readToken)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := e.ts.Client().Do(req)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		e.t.Fatalf("GET /api/v1/events?%s: %d %s", query, resp.StatusCode, body)
	}
	require.Equal(e.t, "text/event-stream; charset=utf-8", resp.Header.Get("Content-Type"))
	s := &sseStream{t: e.t, resp: resp, r: bufio.NewReader(resp.Body), cancel: cancel}
	ready := s.next()
	require.Equal(e.t, "ready", ready.Event)
	return s, ready
}

// next reads the next event, skipping comments. It fails the test when
// the stream ends.
func (s *sseStream) next() sseEvent {
	s.t.Helper()
	var ev sseEvent
	for {
		line, err := s.r.ReadString('\n')
		require.NoError(s.t, err, "the event stream ended")
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if ev.Event != "" || ev.Data != "" {
				return ev
			}
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "event: "):
			ev.Event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "id: "):
			ev.ID = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			ev.Data += strings.TrimPrefix(line, "data: ")
		}
	}
}

// nextTask reads events until a task event for id and returns it;
// cursors passes each cursor event seen on the way.
func (s *sseStream) nextTask(id api.TaskID, cursors func(sseEvent)) api.Event {
	s.t.Helper()
	for {
		ev := s.next()
		switch ev.Event {
		case "cursor":
			if cursors != nil {
				cursors(ev)
			}
		case "task":
			var e api.Event
			require.NoError(s.t, json.Unmarshal([]byte(ev.Data), &e))
			if e.TaskID == id {
				return e
			}
		default:
			s.t.Fatalf("unexpected event %q: %s", ev.Event, ev.Data)
		}
	}
}

// statusesUntilFinal reads the states of task id until its final event.
func (s *sseStream) statusesUntilFinal(id api.TaskID, cursors func(sseEvent)) []api.Status {
	s.t.Helper()
	var out []api.Status
	for {
		e := s.nextTask(id, cursors)
		out = append(out, e.Status)
		if e.Final {
			return out
		}
	}
}

// serveWithTimeouts serves the API of e's configuration on a loopback
// port through web.NewServer with its read and write timeouts cut to
// timeout, and returns its base URL.
func (e *testEnv) serveWithTimeouts(timeout time.Duration) string {
	e.t.Helper()
	h, err := web.New(e.cfg)
	require.NoError(e.t, err)
	srv := web.NewServer(h, nil)
	srv.ReadTimeout, srv.WriteTimeout = timeout, timeout
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(e.t, err)
	go func() { _ = srv.Serve(ln) }()
	e.t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}
