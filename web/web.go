// Package web is stint's HTTP surface: a JSON API under /api/v1/ and the
// dashboard at /, which is a page of plain HTML, CSS and JavaScript embedded
// in the binary that uses nothing but that API.
//
// # API
//
// Every response is JSON. Errors are
//
//	{"error": {"code": "invalid", "message": "invalid status: ...", "field": "status"}}
//
// with the codes invalid (400; 413 for a body over its limit, MaxBody or
// for a workflow submit MaxWorkflowBody, which the message names; 415 for a
// body that is not application/json), unauthorized (401), forbidden (403),
// not_found (404), method_not_allowed (405), conflict (409), unavailable
// (503) and internal (500, whose message tells nothing; the log does). The
// endpoints, with the least role each needs:
//
//	GET    /api/v1/openapi.json             none    this list as an OpenAPI 3 document
//	GET    /api/v1/whoami                   read    the caller's role, and whether auth is on
//	GET    /api/v1/tasks                    read    filters behavior, status, parent, group; keyset paging after, limit
//	GET    /api/v1/tasks/{id}               read    ?wait=30s: answers when the task is finished for good or when the wait (at most MaxWait) runs out; header Stint-Wait says which
//	POST   /api/v1/tasks                    submit  {"behavior", "params", "id", "priority", "delay": "30s", "group_key"}: 201 created, 200 merged;
//	                                                or an array of them (at most MaxBatchSubmit): 200, one SubmitAnswer per element, in order
//	POST   /api/v1/tasks/{id}/hold          admin   also release, retry, fail (body: reason)
//	POST   /api/v1/tasks/{id}/rewind        admin   {"step": 2}: a finished task runs again from its step 2
//	POST   /api/v1/tasks/{id}/fork          admin   {"step": 2, "id": "new"}: 201, a copy of the task from its step 2
//	GET    /api/v1/tasks/{id}/events        read    the events the task published; ?key=K one; ?key=K&wait=30s answers once it is set (Stint-Wait: set, finished or timeout)
//	POST   /api/v1/tasks/{id}/signals/{topic}  submit  the body (JSON, none for null) is the payload; key=K or Idempotency-Key: K; 202
//	DELETE /api/v1/tasks/{id}               admin   204
//	GET    /api/v1/nodes                    read    with heartbeat age and health
//	GET    /api/v1/schedules                read    the periodic schedules with their next tick
//	GET    /api/v1/stats                    read    counts per behavior and status, backlog, queue lag, running per node
//	GET    /api/v1/history                  read    per minute and behavior: runs ended by outcome, backlog, queue lag; window (default 1h)
//	GET    /api/v1/changes                  read    the latest changes, newest first; limit (default 50)
//	GET    /api/v1/events                   read    Server-Sent Events; filters id, behavior, status, parent; since
//	POST   /api/v1/groups/{key}/hold        admin   also release
//	POST   /api/v1/behaviors/{id}/pause     admin   also resume
//	GET    /api/v1/limits                   read    the rate limits and concurrency caps, with use, waiting tasks, next free unit
//	PUT    /api/v1/limits/rate/{name}       admin   {"limit": 100, "period": "1m"} (period also in nanoseconds); DELETE removes: 204
//	PUT    /api/v1/limits/concurrency/{b}   admin   {"key", "max", "weight"} for behavior b; DELETE ?key=K removes: 204
//	POST   /api/v1/workflows                submit  {"id", "nodes": [{"name", "task": <as POST /tasks>, "depends_on", "rule", "finally"}]}: 201 created, 200 existed
//	GET    /api/v1/workflows                read    filter state; keyset paging after, limit
//	GET    /api/v1/workflows/{id}           read    its state, counts, and nodes with their tasks
//	POST   /api/v1/workflows/{id}/cancel    admin   204; also retry (its failed nodes run again; 409 unless it ended with one)
//	POST   /api/v1/workflows/{id}/nodes/{name}/signals/{topic}  submit  a signal to the workflow's node, as to its task
//
// With Config.Metrics, GET /metrics (read role) serves the process's
// metrics in the Prometheus text format.
//
// A path's {id}, {key}, {name} or {topic} is written as it is, slashes
// included: GET /api/v1/tasks/nightly/merge reads the workflow node
// nightly/merge, and POST /api/v1/tasks/nightly/merge/retry retries it. The
// literal end of the path (an action such as /retry, or none) chooses the
// endpoint, so an id that ends in an action's name is read whole (POST
// /api/v1/tasks/x/hold/release releases the task x/hold); a POST whose path
// has a segment signals after the id signals the task before it, under the
// topic after it (POST /api/v1/tasks/a/b/signals/bank/paid signals a/b under
// bank/paid). A slash may also be sent as %2F, which is never taken for the
// one before an action or before signals.
//
// Endpoints of other parts are added as Config.Routes; ingest.Routes is one
// of the ingest batches (GET /api/v1/batches, /batches/{id}, /jobs/{id}, and
// the admin actions requeue, hold, release and delete of batches and jobs).
// GET /api/v1/openapi.json describes the endpoints a server has.
//
// # Auth
//
// Requests carry "Authorization: Bearer TOKEN"; each token has a role (see
// Role and Tokens). A missing or unknown token is a 401, a role too weak a
// 403. The event stream takes the token the same way: the dashboard reads
// the stream with fetch, which can send the header, rather than with
// EventSource, which cannot; so a token never appears in a URL, where it
// would end up in logs and the browser's history. With Config.InsecureNoAuth
// every request is admin. The page and its files need no token. Unsafe
// requests that a browser marks as cross-origin are refused
// (http.CrossOriginProtection), so that a web page cannot act on a server
// without auth through its visitor's browser.
//
// # Events
//
// GET /api/v1/events streams task state changes as "task" events whose data
// is an api.Event. Without a cursor it follows api.Tasks.Subscribe from the
// moment of the request. With ?since=CURSOR (or since=now, or the
// Last-Event-ID header an EventSource sends when it reconnects) it reads the
// change feed after the cursor, and after each batch it sends a "cursor"
// event whose id is the cursor to resume from: a client that reconnects with
// it misses nothing the feed still keeps. Comments are sent every 15 seconds
// to keep idle connections open.
package web

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// Config configures the API and the dashboard.
type Config struct {
	// Client is the one door to the engine: it submits, inspects and acts
	// on tasks and reads nodes, statistics and the change feed. A Server
	// or a client-only Client will do. Required.
	Client api.Operator
	// Registry lists the behaviors that the statistics show even when they
	// have no tasks, and that the dashboard offers to submit. Optional.
	Registry *spi.Registry
	// Tokens are the accepted bearer tokens. Required unless
	// InsecureNoAuth.
	Tokens *Tokens
	// InsecureNoAuth serves every request as admin, without a token. Only
	// for a server that nobody else can reach.
	InsecureNoAuth bool
	// Routes are extra endpoints under /api/v1/, such as ingest.Routes.
	Routes []Route
	// Features name the optional pages the dashboard shows, for the
	// endpoints of Routes, such as ingest.Feature.
	Features []string
	// NodeHeartbeat is the servers' heartbeat interval, by which nodes
	// are judged: late after 3 missed heartbeats, dead after 10 (when
	// other nodes drop them). Defaults to 5 seconds, the servers' default.
	NodeHeartbeat time.Duration
	// FeedPoll is how often an event stream with a cursor reads the change
	// feed when it has caught up. Defaults to 500 milliseconds.
	FeedPoll time.Duration
	// StreamKeepAlive is the interval of the comments that keep an idle
	// event stream open. Defaults to 15 seconds.
	StreamKeepAlive time.Duration
	// MaxStreams caps the event streams open at once; more get a 503.
	// Defaults to 100.
	MaxStreams int
	// StatsMaxAge is how long a statistics snapshot is reused, so that
	// many dashboards cost the database one count per interval. Defaults
	// to 1 second.
	StatsMaxAge time.Duration
	// Logger receives request logs (at debug level) and errors. Defaults
	// to slog.Default().
	Logger *slog.Logger
	// Metrics, when set, is served at GET /metrics to callers with the
	// read role: the Prometheus text exposition of the process's metrics
	// (package cli gives OpenTelemetry's Prometheus exporter). Optional.
	Metrics http.Handler
}

// Route is an extra endpoint under /api/v1/.
type Route struct {
	// Pattern is a net/http.ServeMux pattern with a method, relative to
	// /api/v1, e.g. "GET /batches/{id}".
	Pattern string
	// Role is the least role allowed to call it.
	Role Role
	// Handle serves the request. An error it returns is written as an
	// error response: an *Error as it is, api.ErrNotFound as a 404,
	// api.ErrConflict as a 409, an *api.InvalidError as a 400 naming its
	// field, anything else as a 500.
	Handle func(w http.ResponseWriter, r *http.Request) error
}

// Handler serves the API and the dashboard. It is an http.Handler; see
// NewServer for an http.Server with the right timeouts.
type Handler struct {
	cfg     Config
	log     *slog.Logger
	mux     *http.ServeMux
	handler http.Handler
	streams atomic.Int64
	static  *staticFiles

	statsMu   sync.Mutex
	statsLast snapshot

	// patterns are the API's routes, "METHOD /path" under apiPrefix.
	patterns []string
	// tails are the tail routes (see tailRoutes) by method and prefix, the
	// longest prefix first.
	tails []*tailRoutes
	// openAPI is the OpenAPI document of patterns.
	openAPI []byte
}

// New returns the handler for cfg.
func New(cfg Config) (*Handler, error) {
	if cfg.Client == nil {
		return nil, errors.New("new web handler: Config.Client is required")
	}
	if cfg.InsecureNoAuth && cfg.Tokens.Len() > 0 {
		return nil, errors.New("new web handler: tokens and InsecureNoAuth exclude each other")
	}
	if !cfg.InsecureNoAuth && cfg.Tokens.Len() == 0 {
		return nil, errors.New("new web handler: no tokens: give tokens, or choose InsecureNoAuth explicitly")
	}
	if cfg.NodeHeartbeat <= 0 {
		cfg.NodeHeartbeat = 5 * time.Second
	}
	if cfg.FeedPoll <= 0 {
		cfg.FeedPoll = 500 * time.Millisecond
	}
	if cfg.StreamKeepAlive <= 0 {
		cfg.StreamKeepAlive = 15 * time.Second
	}
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = 100
	}
	if cfg.StatsMaxAge <= 0 {
		cfg.StatsMaxAge = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	static, err := loadStatic()
	if err != nil {
		return nil, fmt.Errorf("new web handler: %w", err)
	}
	h := &Handler{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux(), static: static}

	routes := []Route{
		{"GET /whoami", RoleRead, h.whoami},
		{"GET /tasks", RoleRead, h.listTasks},
		{"POST /tasks", RoleSubmit, h.submitTask},
		{"GET /tasks/{id}", RoleRead, h.getTask},
		{"GET /tasks/{id}/events", RoleRead, h.taskEvents},
		{"POST /tasks/{id}/signals/{topic}", RoleSubmit, h.signalTask},
		{"DELETE /tasks/{id}", RoleAdmin, h.removeTask},
		{"POST /tasks/{id}/hold", RoleAdmin, h.taskAction("hold", cfg.Client.Hold)},
		{"POST /tasks/{id}/release", RoleAdmin, h.taskAction("release", cfg.Client.Release)},
		{"POST /tasks/{id}/retry", RoleAdmin, h.taskAction("retry", cfg.Client.Retry)},
		{"POST /tasks/{id}/fail", RoleAdmin, h.failTask},
		{"POST /tasks/{id}/rewind", RoleAdmin, h.rewindTask},
		{"POST /tasks/{id}/fork", RoleAdmin, h.forkTask},
		{"GET /nodes", RoleRead, h.nodes},
		{"GET /schedules", RoleRead, h.schedules},
		{"GET /stats", RoleRead, h.stats},
		{"GET /history", RoleRead, h.history},
		{"GET /events", RoleRead, h.events},
		{"GET /changes", RoleRead, h.recentChanges},
		{"POST /groups/{key}/hold", RoleAdmin, h.groupAction(true)},
		{"POST /groups/{key}/release", RoleAdmin, h.groupAction(false)},
		{"POST /behaviors/{id}/pause", RoleAdmin, h.behaviorAction(true)},
		{"POST /behaviors/{id}/resume", RoleAdmin, h.behaviorAction(false)},
		{"GET /limits", RoleRead, h.listLimits},
		{"PUT /limits/rate/{name}", RoleAdmin, h.setRateLimit},
		{"DELETE /limits/rate/{name}", RoleAdmin, h.removeRateLimit},
		{"PUT /limits/concurrency/{behavior}", RoleAdmin, h.setConcurrencyLimit},
		{"DELETE /limits/concurrency/{behavior}", RoleAdmin, h.removeConcurrencyLimit},
		{"POST /workflows", RoleSubmit, h.submitWorkflow},
		{"GET /workflows", RoleRead, h.listWorkflows},
		{"GET /workflows/{id}", RoleRead, h.getWorkflow},
		{"POST /workflows/{id}/cancel", RoleAdmin, h.cancelWorkflow},
		{"POST /workflows/{id}/retry", RoleAdmin, h.retryWorkflow},
		{"POST /workflows/{id}/hold", RoleAdmin, h.holdWorkflow},
		{"POST /workflows/{id}/release", RoleAdmin, h.releaseWorkflow},
		{"DELETE /workflows/{id}", RoleAdmin, h.removeWorkflow},
		{"POST /workflows/{id}/nodes/{name}/signals/{topic}", RoleSubmit, h.signalNode},
	}
	for _, rt := range append(routes, cfg.Routes...) {
		method, path, ok := strings.Cut(rt.Pattern, " ")
		if !ok || !strings.HasPrefix(path, "/") || rt.Handle == nil || rt.Role < RoleRead || rt.Role > RoleAdmin {
			return nil, fmt.Errorf("new web handler: route %q: want \"METHOD /path\", a handler and a role", rt.Pattern)
		}
		if err := h.route(method+" "+path, h.endpoint(rt)); err != nil {
			return nil, fmt.Errorf("new web handler: route %q: %w", rt.Pattern, err)
		}
		h.patterns = append(h.patterns, rt.Pattern)
	}
	if err := registerRoute(h.mux, "GET "+apiPrefix+openAPIPath, http.HandlerFunc(h.serveOpenAPI)); err != nil {
		return nil, fmt.Errorf("new web handler: route %q: %w", openAPIPath, err)
	}
	h.patterns = append(h.patterns, "GET "+openAPIPath)
	if h.openAPI, err = buildOpenAPI(h.patterns); err != nil {
		return nil, fmt.Errorf("new web handler: %w", err)
	}
	h.mux.HandleFunc(apiPrefix+"/", h.serveAPI)
	if cfg.Metrics != nil {
		h.mux.HandleFunc("GET "+metricsPath, h.serveMetrics)
	}
	h.mux.HandleFunc("GET /{$}", h.static.serve)
	h.mux.HandleFunc("GET /assets/{file}", h.static.serve)

	protect := http.NewCrossOriginProtection()
	protect.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, &Error{Status: http.StatusForbidden, Code: CodeForbidden, Message: "cross-origin request refused"})
	}))
	h.handler = protect.Handler(h.mux)
	return h, nil
}

// registerRoute adds a pattern to mux, turning its panic on a bad or
// conflicting pattern into an error.
func registerRoute(mux *http.ServeMux, pattern string, handler http.Handler) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	mux.Handle(pattern, handler)
	return nil
}

// apiPrefix is the path under which the API is served.
const apiPrefix = "/api/v1"

// ServeHTTP serves a request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	hd := w.Header()
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Frame-Options", "DENY")
	if strings.HasPrefix(r.URL.Path, apiPrefix+"/") {
		hd.Set("Cache-Control", "no-store")
	}
	h.handler.ServeHTTP(sw, r)
	h.log.Debug("stint http: request", "method", r.Method, "path", r.URL.Path, "status", sw.status,
		"duration", time.Since(start).Round(time.Microsecond), "remote", r.RemoteAddr)
}

// statusWriter remembers the status of a response, for the request log,
// and whether it has begun.
type statusWriter struct {
	http.ResponseWriter
	status  int
	started bool
}

// WriteHeader records the status and writes it.
func (s *statusWriter) WriteHeader(status int) {
	if !s.started {
		s.status, s.started = status, true
	}
	s.ResponseWriter.WriteHeader(status)
}

// Write records that the response has begun and writes b.
func (s *statusWriter) Write(b []byte) (int, error) {
	s.started = true
	return s.ResponseWriter.Write(b)
}

// Unwrap returns the underlying writer, for http.ResponseController.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// roleKey is the context key of the caller's role.
type roleKey struct{}

// RoleOf returns the role of the request's caller, for the handlers of
// Config.Routes.
func RoleOf(r *http.Request) Role {
	role, _ := r.Context().Value(roleKey{}).(Role)
	return role
}

// authenticate returns the role of the request's caller, or the error
// response for a missing or unknown token.
func (h *Handler) authenticate(r *http.Request) (Role, *Error) {
	if h.cfg.InsecureNoAuth {
		return RoleAdmin, nil
	}
	token := bearerToken(r)
	if token == "" {
		return RoleNone, &Error{Status: http.StatusUnauthorized, Code: CodeUnauthorized,
			Message: "no token: send Authorization: Bearer TOKEN"}
	}
	role := h.cfg.Tokens.Lookup(token)
	if role == RoleNone {
		return RoleNone, &Error{Status: http.StatusUnauthorized, Code: CodeUnauthorized, Message: "unknown token"}
	}
	return role, nil
}

// endpoint wraps a route: it checks the caller's role, runs the handler
// and writes its error.
func (h *Handler) endpoint(rt Route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		role, aerr := h.authenticate(r)
		if aerr != nil {
			writeError(w, aerr)
			return
		}
		if role < rt.Role {
			writeError(w, &Error{Status: http.StatusForbidden, Code: CodeForbidden,
				Message: fmt.Sprintf("this needs the %s role; the token has %s", rt.Role, role)})
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), roleKey{}, role))
		err := rt.Handle(w, r)
		if err == nil {
			return
		}
		if r.Context().Err() != nil && errors.Is(err, r.Context().Err()) {
			return // the client went away
		}
		e := errorFor(err)
		// A database incident is the engine's to log, once (not once per
		// request).
		if e.Status >= 500 && !errors.Is(err, api.ErrUnavailable) {
			h.log.Error("stint http: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		}
		if sw, ok := w.(*statusWriter); ok && sw.started {
			return // the response has begun (an event stream)
		}
		writeError(w, e)
	})
}

// apiFallback answers API paths no route matched: 405 when the path is
// known with other methods, else 404. Authentication comes first, so that
// the answer tells nothing to a caller without a token.
func (h *Handler) apiFallback(w http.ResponseWriter, r *http.Request) {
	if _, aerr := h.authenticate(r); aerr != nil {
		writeError(w, aerr)
		return
	}
	var allowed []string
	var tails *tailRoutes // of r's method, when its path has their prefix
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		probe := r.Clone(r.Context())
		probe.Method = m
		ok, t := h.routed(probe)
		if ok {
			allowed = append(allowed, m)
		}
		if m == r.Method {
			tails = t
		}
	}
	hint := tails.hint(r.Method)
	if len(allowed) > 0 {
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		writeError(w, &Error{Status: http.StatusMethodNotAllowed, Code: CodeMethodNotAllowed,
			Message: fmt.Sprintf("%s is not allowed here; allowed: %s%s", r.Method, strings.Join(allowed, ", "), hint)})
		return
	}
	writeError(w, notFound("no endpoint %s %s%s", r.Method, r.URL.Path, hint))
}

// whoamiResponse is the answer of GET /whoami.
type whoamiResponse struct {
	// Role is the caller's role.
	Role string `json:"role"`
	// Auth is false when the server runs without tokens.
	Auth bool `json:"auth"`
	// Behaviors are the behaviors the server knows, for the dashboard's
	// submit form.
	Behaviors []api.BehaviorID `json:"behaviors"`
	// Features are the optional pages the dashboard may show (see
	// Config.Features).
	Features []string `json:"features"`
	// MaxAttempts are the runs a failing task of each behavior gets, for
	// the dashboard's "attempt n of m".
	MaxAttempts map[api.BehaviorID]int `json:"max_attempts"`
}

func (h *Handler) whoami(w http.ResponseWriter, r *http.Request) error {
	resp := whoamiResponse{Role: RoleOf(r).String(), Auth: !h.cfg.InsecureNoAuth, Behaviors: []api.BehaviorID{},
		Features: append([]string{}, h.cfg.Features...), MaxAttempts: map[api.BehaviorID]int{}}
	if h.cfg.Registry != nil {
		resp.Behaviors = h.cfg.Registry.IDs()
		for _, id := range resp.Behaviors {
			if reg, ok := h.cfg.Registry.Lookup(id); ok {
				resp.MaxAttempts[id] = reg.Policy.MaxAttempts
			}
		}
		// A workflow's own task, and its gate and sub-workflow nodes, are
		// stored with their workflow, not submitted alone.
		resp.Behaviors = slices.DeleteFunc(resp.Behaviors, func(id api.BehaviorID) bool {
			return id == api.WorkflowBehavior || id == api.GateBehavior || id == api.SubworkflowBehavior
		})
	}
	WriteJSON(w, http.StatusOK, resp)
	return nil
}
