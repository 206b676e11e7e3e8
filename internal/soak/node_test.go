package soak

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/cleanup"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/childtest"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

// Environment of a node process.
const (
	envDSN   = "STINT_SOAK_DSN"
	envNode  = "STINT_SOAK_NODE"
	envLog   = "STINT_SOAK_LOG"   // a file for the node's log, as JSON lines
	envStats = "STINT_SOAK_STATS" // a file the node writes its stats address to
)

// shortest is the shortest retention stint keeps: every soak task has it,
// so that the cleanup must keep up with the load.
const shortest = time.Microsecond

// Kinds of effect, the kind column of soak_effect.
const (
	kindTask    = 1 // soak.task: a no-op, a sleep, or a task failing once
	kindGrouped = 2 // soak.grouped: a no-op under a group key's cap
	kindNode    = 3 // soak.node: a workflow's node
	kindTick    = 4 // soak.tick: a schedule's tick; n is the tick's Unix second
)

// Params are the params of the soak behaviors.
type Params struct {
	// N numbers the task; the ledger counts its effects.
	N int64 `json:"n"`
	// At is when the load submitted it, in Unix microseconds.
	At      int64 `json:"at"`
	SleepMS int   `json:"sleep_ms,omitempty"`
	// FailOnce fails the first attempt (retryable).
	FailOnce bool `json:"fail_once,omitempty"`
	// Reads names a node of the same workflow whose result this node
	// reads (spi.NodeResult) before it ends.
	Reads string `json:"reads,omitempty"`
}

var (
	taskKind    = api.Kind[Params, int64]{ID: "soak.task"}
	groupedKind = api.Kind[Params, int64]{ID: "soak.grouped"}
	nodeKind    = api.Kind[Params, int64]{ID: "soak.node"}
	tickKind    = api.Kind[Params, int64]{ID: "soak.tick"}
)

// effect is a soak behavior: each run that succeeds records its effect in
// soak_effect (unlogged, so that the WAL measured is stint's), with the
// delay from submit to the start of the task's first attempt.
type effect struct {
	kind api.Kind[Params, int64]
	code int
	pool *pgxpool.Pool // nil on the client's registry, which runs nothing
	// groups caps the running tasks per group key (Policy.GroupConcurrency).
	groups int
}

func (b effect) Kind() api.Kind[Params, int64] { return b.kind }

func (b effect) TaskID(ids spi.IDs, p Params) api.TaskID {
	if b.code == kindTick {
		return ids.Unique()
	}
	return ids.Deterministic(p.N)
}

func (b effect) Policy() spi.Policy {
	return spi.Policy{Retention: shortest, FailureRetention: shortest, MaxAttempts: 3,
		BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second, GroupConcurrency: b.groups}
}

// Schedules fires soak.tick every second.
func (b effect) Schedules() []api.Schedule {
	if b.code != kindTick {
		return nil
	}
	return []api.Schedule{{Name: "soak-tick", Spec: "@every 1s"}}
}

func (b effect) Run(ctx context.Context, rc spi.RunContext, p Params) (int64, error) {
	began := time.Now()
	n, submitted := p.N, p.At
	if b.code == kindTick {
		tick, err := tickSecond(rc.TaskID())
		if err != nil {
			return 0, api.Permanent("tick", "%v", err)
		}
		n, submitted = tick, tick*1_000_000
	}
	var latency *int64
	if rc.Attempt() == 1 {
		us := began.UnixMicro() - submitted
		latency = &us
	}
	if p.FailOnce && rc.Attempt() == 1 {
		return 0, api.Retryable("once", "fails its first attempt")
	}
	if p.SleepMS > 0 {
		if err := spi.Sleep(ctx, time.Duration(p.SleepMS)*time.Millisecond); err != nil {
			return 0, err
		}
	}
	if p.Reads != "" {
		if _, err := spi.NodeResult[int64](ctx, rc, p.Reads); err != nil {
			return 0, api.Permanent("reads", "read node %s: %v", p.Reads, err)
		}
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO soak_effect (n, kind, attempt, latency_us) VALUES ($1, $2, $3, $4)`,
		n, b.code, rc.Attempt(), latency); err != nil {
		return 0, api.Retryable("effect", "record the effect: %v", err)
	}
	return n, nil
}

// tickSecond reads the tick's Unix second from a schedule task's id
// (schedule:NAME:UNIX).
func tickSecond(id api.TaskID) (int64, error) {
	s := string(id)
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return 0, fmt.Errorf("%s is not a schedule's task", id)
	}
	return strconv.ParseInt(s[i+1:], 10, 64)
}

// registry holds the soak behaviors, run on pool (nil for a client).
func registry(pool *pgxpool.Pool) *spi.Registry {
	reg := spi.NewRegistry()
	spi.MustRegister[Params, int64](reg, effect{kind: taskKind, code: kindTask, pool: pool})
	spi.MustRegister[Params, int64](reg, effect{kind: groupedKind, code: kindGrouped, pool: pool, groups: 4})
	spi.MustRegister[Params, int64](reg, effect{kind: nodeKind, code: kindNode, pool: pool})
	spi.MustRegister[Params, int64](reg, effect{kind: tickKind, code: kindTick, pool: pool})
	return reg
}

// runNode is a node process: a server at its defaults, with the cleanup
// behavior at its defaults, running until SIGTERM or SIGKILL. It serves
// its goroutine count and the bytes of its heap's objects on 127.0.0.1,
// and its profiles under /debug/pprof/ there (go tool pprof
// http://ADDR/debug/pprof/heap), and writes the address to the file named
// by envStats before it starts.
func runNode() {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err == nil {
		err = os.WriteFile(os.Getenv(envStats), []byte(l.Addr().String()), 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		fmt.Fprint(w, runtime.NumGoroutine(), " ", m.HeapAlloc)
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	go func() { _ = http.Serve(l, mux) }()
	childtest.Serve(os.Getenv(envDSN), func(st *postgres.Store) (*impl.Server, error) {
		out, err := childtest.OpenLog(os.Getenv(envLog))
		if err != nil {
			return nil, err
		}
		log := slog.New(slog.NewJSONHandler(out, nil))
		reg := registry(st.Pool())
		if err := cleanup.Register(reg, st, cleanup.Config{Logger: log}); err != nil {
			return nil, err
		}
		return impl.NewServer(st, impl.ServerConfig{Node: os.Getenv(envNode), Registry: reg, Logger: log})
	})
}
