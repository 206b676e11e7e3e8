package ingest_test

import (
	"context"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/ingest"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/childtest"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

// Environment of a child node process (see runChildNode).
const (
	envChildDSN     = "STINT_INGEST_TEST_CHILD_DSN"
	envChildNode    = "STINT_INGEST_TEST_CHILD_NODE"
	envChildWork    = "STINT_INGEST_TEST_CHILD_WORK"
	envChildStorage = "STINT_INGEST_TEST_CHILD_STORAGE"
	// envChildLease is the child node's lease in milliseconds; unset, that
	// of testConfig.
	envChildLease = "STINT_INGEST_TEST_CHILD_LEASE_MS"
)

func TestMain(m *testing.M) {
	if os.Getenv(envChildDSN) != "" {
		runChildNode()
		return
	}
	pgtest.Main(m)
}

// runChildNode runs a server node with the ingest behaviors in this
// process until it is killed, for the test that SIGKILLs a node
// mid-download. It prints "ready" once started.
func runChildNode() {
	childtest.Serve(os.Getenv(envChildDSN), func(st *postgres.Store) (*impl.Server, error) {
		reg := spi.NewRegistry()
		cfg := testConfig(os.Getenv(envChildWork), os.Getenv(envChildStorage), st.Pool())
		if ms, err := strconv.Atoi(os.Getenv(envChildLease)); err == nil {
			cfg.Lease = time.Duration(ms) * time.Millisecond
		}
		if err := ingest.Register(reg, cfg); err != nil {
			return nil, err
		}
		return impl.NewServer(st, impl.ServerConfig{Node: os.Getenv(envChildNode), Registry: reg, PollInterval: 50 * time.Millisecond})
	})
}

// submitRegistry holds the ingest behaviors for submits only.
func submitRegistry() *spi.Registry {
	reg := spi.NewRegistry()
	if err := ingest.RegisterForSubmit(reg); err != nil {
		panic(err)
	}
	return reg
}

// testConfig is the ingest configuration of test nodes: short waits, few
// retries. Leases are 10 seconds: a shorter lease lets a loaded machine,
// whose renewals come late, lose runs to takeovers that repeat work the
// tests count (a file fetched twice); the tests of takeovers set their
// own. The behaviors list jobs through the server they run on.
func testConfig(work, storage string, pool *pgxpool.Pool) ingest.Config {
	return ingest.Config{
		WorkDir:          work,
		StorageDir:       storage,
		Pool:             pool,
		ProvisionRecheck: 100 * time.Millisecond,
		HTTPAttempts:     2,
		RetryBackoff:     10 * time.Millisecond,
		Lease:            10 * time.Second,
		ChildPoll:        100 * time.Millisecond,
		BatchWaitMax:     30 * time.Second,
	}
}

// fileServer serves files and a callback endpoint, counting requests.
type fileServer struct {
	*httptest.Server
	mu       sync.Mutex
	files    map[string][]byte // by path
	counts   map[string]int    // by "METHOD path"
	status   map[string]int    // path -> status to answer instead
	block    map[string]chan struct{}
	gates    map[string]*gate
	callback []ingest.Summary
	cbStatus int
}

func newFileServer(t *testing.T) *fileServer {
	fs := &fileServer{files: map[string][]byte{}, counts: map[string]int{}, status: map[string]int{},
		block: map[string]chan struct{}{}, gates: map[string]*gate{}}
	fs.Server = httptest.NewServer(http.HandlerFunc(fs.serve))
	t.Cleanup(fs.Close)
	return fs
}

func (fs *fileServer) serve(w http.ResponseWriter, r *http.Request) {
	fs.mu.Lock()
	fs.counts[r.Method+" "+r.URL.Path]++
	n := fs.counts[r.Method+" "+r.URL.Path]
	if r.URL.Path == "/callback" {
		status := fs.cbStatus
		var s ingest.Summary
		body, _ := io.ReadAll(r.Body)
		if status == 0 && json.Unmarshal(body, &s) == nil {
			fs.callback = append(fs.callback, s)
		}
		fs.mu.Unlock()
		if status != 0 {
			w.WriteHeader(status)
		}
		return
	}
	status := fs.status[r.URL.Path]
	content, ok := fs.files[r.URL.Path]
	started := fs.block[r.URL.Path]
	g := fs.gates[r.URL.Path]
	fs.mu.Unlock()
	if g != nil && r.Method == http.MethodGet {
		g.startOnce.Do(func() { close(g.started) })
		select {
		case <-g.open:
		case <-r.Context().Done():
			return
		}
	}
	switch {
	case status != 0:
		w.WriteHeader(status)
		return
	case !ok:
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(content)))
	if r.Method == http.MethodHead {
		return
	}
	if started != nil && n == 1 {
		// The first GET sends half the file and hangs until the client
		// goes away.
		_, _ = w.Write(content[:len(content)/2])
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done()
		return
	}
	_, _ = w.Write(content)
}

// add serves content at path and returns its URL.
func (fs *fileServer) add(path string, content []byte) string {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.files[path] = content
	return fs.URL + path
}

func (fs *fileServer) setStatus(path string, status int) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.status[path] = status
}

func (fs *fileServer) setCallbackStatus(status int) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.cbStatus = status
}

// blockFirst makes the first GET of path hang; the returned channel is
// closed when it started.
func (fs *fileServer) blockFirst(path string) <-chan struct{} {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	ch := make(chan struct{})
	fs.block[path] = ch
	return ch
}

// gate holds GETs of a path until it is opened.
type gate struct {
	started   chan struct{}
	startOnce sync.Once
	open      chan struct{}
}

// gate makes GETs of path wait until open is called; started is closed
// when the first one arrived.
func (fs *fileServer) gate(path string) (started <-chan struct{}, open func()) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	g := &gate{started: make(chan struct{}), open: make(chan struct{})}
	fs.gates[path] = g
	var once sync.Once
	return g.started, func() { once.Do(func() { close(g.open) }) }
}

func (fs *fileServer) count(method, path string) int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.counts[method+" "+path]
}

func (fs *fileServer) callbacks() []ingest.Summary {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return append([]ingest.Summary(nil), fs.callback...)
}

// tenv is one test's database, directories, file server and client.
type tenv struct {
	t       *testing.T
	ctx     context.Context
	dsn     string
	st      *postgres.Store
	pool    *pgxpool.Pool
	client  *impl.Client
	admin   *ingest.Admin
	fs      *fileServer
	work    string
	storage string
	free    atomic.Int64 // bytes FreeSpace reports; negative: the real value
	checks  atomic.Int32 // FreeSpace calls
	mints   atomic.Int32
	// tp is the tracer provider of the test's nodes; nil: the global one.
	tp trace.TracerProvider
}

func newEnv(t *testing.T) *tenv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	dsn := pgtest.New(t)
	st, err := postgres.Open(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(st.Close)
	client, err := impl.NewClient(st, impl.ClientConfig{Registry: submitRegistry(), PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(client.Close)
	dir := t.TempDir()
	e := &tenv{t: t, ctx: ctx, dsn: dsn, st: st, pool: st.Pool(), client: client,
		admin: ingest.NewAdmin(client), fs: newFileServer(t),
		work: filepath.Join(dir, "work"), storage: filepath.Join(dir, "storage")}
	e.free.Store(-1)
	return e
}

// config returns the ingest configuration of this test's nodes.
func (e *tenv) config() ingest.Config {
	cfg := testConfig(e.work, e.storage, e.pool)
	cfg.Profiles = map[string]ingest.Profile{"coll": {CallbackURL: e.fs.URL + "/callback"}}
	cfg.FreeSpace = func(dir string) (uint64, error) {
		e.checks.Add(1)
		if n := e.free.Load(); n >= 0 {
			return uint64(n), nil
		}
		return ingest.StatfsFree(dir)
	}
	cfg.Mint = func(ctx context.Context) (string, error) {
		e.mints.Add(1)
		return ingest.MintLocal(ctx)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(e.t.Output(), nil))
	return cfg
}

// server starts an in-process node running the ingest behaviors.
func (e *tenv) server(node string, mod ...func(*ingest.Config)) *impl.Server {
	e.t.Helper()
	cfg := e.config()
	for _, m := range mod {
		m(&cfg)
	}
	reg := spi.NewRegistry()
	require.NoError(e.t, ingest.Register(reg, cfg))
	srv, err := impl.NewServer(e.st, impl.ServerConfig{Node: node, Registry: reg, PollInterval: 50 * time.Millisecond,
		AwaitPollInterval: 50 * time.Millisecond, Logger: cfg.Logger, TracerProvider: e.tp})
	require.NoError(e.t, err)
	require.NoError(e.t, srv.Start(e.ctx))
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Stop(ctx)
	})
	return srv
}

// submit submits a batch of profile coll with the manifest.
func (e *tenv) submit(manifest string) api.TaskID {
	e.t.Helper()
	f, err := ingest.SubmitBatch(e.ctx, e.client, ingest.BatchParams{Submitter: "tester", Profile: "coll", Manifest: manifest})
	require.NoError(e.t, err)
	return f.ID()
}

// await waits for a task to finish.
func (e *tenv) await(id api.TaskID) api.Task {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	t, err := e.client.Await(ctx, id)
	require.NoError(e.t, err, "await %s", id)
	return t
}

func (e *tenv) count(query string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(e.ctx, query, args...).Scan(&n))
	return n
}

func (e *tenv) jobView(id api.TaskID) ingest.JobView {
	e.t.Helper()
	v, err := e.admin.Job(e.ctx, id)
	require.NoError(e.t, err)
	return v
}

func (e *tenv) batchView(id api.TaskID) ingest.BatchView {
	e.t.Helper()
	v, err := e.admin.Batch(e.ctx, id)
	require.NoError(e.t, err)
	return v
}

func (e *tenv) jobProgress(id api.TaskID) ingest.JobProgress {
	e.t.Helper()
	t, err := e.client.Get(e.ctx, id)
	require.NoError(e.t, err)
	var p ingest.JobProgress
	if len(t.Progress) > 0 {
		require.NoError(e.t, json.Unmarshal(t.Progress, &p))
	}
	return p
}

// waitFor polls cond every 10 ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition with a deadline
	}
}

// digest returns the hex digest of data with alg.
func digest(alg string, data []byte) string {
	var h hash.Hash
	switch alg {
	case "md5":
		h = md5.New()
	case "sha1":
		h = sha1.New()
	case "sha512":
		h = sha512.New()
	default:
		h = sha256.New()
	}
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))
}

// line is one manifest line.
type line struct {
	url, alg, digest, name, local, ident string
	size                                 int
}

// manifest renders manifest lines with a checkm header.
func manifest(lines ...line) string {
	var b strings.Builder
	b.WriteString("#%checkm_0.7\n#%fields | nfo:fileUrl | nfo:hashAlgorithm | nfo:hashValue | nfo:fileSize | nfo:fileName | mrt:localIdentifier | mrt:primaryIdentifier\n")
	for _, l := range lines {
		size := ""
		if l.size > 0 {
			size = strconv.Itoa(l.size)
		}
		fmt.Fprintf(&b, "%s | %s | %s | %s | %s | %s | %s\n", l.url, l.alg, l.digest, size, l.name, l.local, l.ident)
	}
	b.WriteString("#%eof\n")
	return b.String()
}

// fileLine serves content at /files/<local>/<name> and returns its
// manifest line with a digest of alg (none when alg is empty).
func (e *tenv) fileLine(local, name, alg string, content []byte) line {
	l := line{url: e.fs.add("/files/"+local+"/"+name, content), name: name, local: local, size: len(content)}
	if alg != "" {
		l.alg, l.digest = alg, digest(alg, content)
	}
	return l
}
