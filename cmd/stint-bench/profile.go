package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// profile starts a CPU profile of a stint run named run, written to
// <--cpuprofile>-<run>.pprof, and returns the function that stops it. It
// does nothing for other systems or without --cpuprofile.
func (b *bench) profile(system, run string) func() {
	if b.cfg.cpuprofile == "" || system != sysStint {
		return func() {}
	}
	path := b.cfg.cpuprofile + "-" + run + ".pprof"
	stop, err := startCPUProfile(path)
	if err != nil {
		b.rep.Notes = append(b.rep.Notes, err.Error())
		return func() {}
	}
	b.rep.Profiles = append(b.rep.Profiles, path)
	return stop
}

// startCPUProfile starts a CPU profile written to path.
func startCPUProfile(path string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("cpu profile %s: %w", path, err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

func numCPU() int { return runtime.NumCPU() }

// SQLProfile is what pg_stat_statements recorded for one run's database.
type SQLProfile struct {
	Run        string      `json:"run"`
	WallSecs   float64     `json:"wall_seconds"`
	Statements []Statement `json:"statements"`
}

// Statement is one normalized statement of a SQLProfile.
type Statement struct {
	Query   string  `json:"query"`
	Calls   int64   `json:"calls"`
	TotalMS float64 `json:"total_ms"`
	MeanMS  float64 `json:"mean_ms"`
	MaxMS   float64 `json:"max_ms"`
	Rows    int64   `json:"rows"`
	// BlocksHit are the shared buffer hits of all calls: pages visited.
	BlocksHit int64 `json:"blocks_hit"`
}

// resetStatements clears pg_stat_statements before a measured run.
func (b *bench) resetStatements(ctx context.Context) {
	if !b.statements {
		return
	}
	if err := b.db.adminExec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
		b.rep.Notes = append(b.rep.Notes, fmt.Sprintf("reset pg_stat_statements: %v", err))
	}
}

// collectStatements records the costliest statements run in dsn's database
// since the last reset.
func (b *bench) collectStatements(ctx context.Context, run, dsn string, wall time.Duration) {
	if !b.statements {
		return
	}
	ctx = context.WithoutCancel(ctx)
	name, err := dbName(dsn)
	if err == nil {
		var prof *SQLProfile
		prof, err = b.statementsOf(ctx, name)
		if err == nil {
			prof.Run, prof.WallSecs = run, wall.Seconds()
			b.rep.SQL = append(b.rep.SQL, *prof)
			return
		}
	}
	b.rep.Notes = append(b.rep.Notes, fmt.Sprintf("SQL profile of %s: %v", run, err))
}

func (b *bench) statementsOf(ctx context.Context, db string) (*SQLProfile, error) {
	conn, err := pgx.Connect(ctx, b.db.admin)
	if err != nil {
		return nil, fmt.Errorf("connect to the maintenance database: %w", err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `
		SELECT query, calls, total_exec_time, mean_exec_time, max_exec_time, rows, shared_blks_hit
		FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1)
		ORDER BY total_exec_time DESC
		LIMIT 8`, db)
	if err != nil {
		return nil, fmt.Errorf("query pg_stat_statements: %w", err)
	}
	prof := &SQLProfile{}
	var s Statement
	_, err = pgx.ForEachRow(rows, []any{&s.Query, &s.Calls, &s.TotalMS, &s.MeanMS, &s.MaxMS, &s.Rows, &s.BlocksHit}, func() error {
		s.Query = strings.Join(strings.Fields(s.Query), " ")
		prof.Statements = append(prof.Statements, s)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("query pg_stat_statements: %w", err)
	}
	return prof, nil
}
