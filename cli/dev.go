package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/pgcluster"
	"github.com/stinthq/stint/store/postgres"
)

// Names inside the dev data directory.
const (
	// devPGData is the PostgreSQL data directory.
	devPGData = "pgdata"
	// devPortFile remembers the port of the last run, so that the DSN stays
	// the same from one run to the next.
	devPortFile = "port"
	// devHTTPPortFile remembers the port the dashboard was served on, and
	// devTokenFile (mode 0600) the admin token of its link, so that the
	// link stays good from one run to the next.
	devHTTPPortFile = "http-port"
	devTokenFile    = "token"
	// devDatabase is the database dev creates and uses.
	devDatabase = "stint"
)

// devStopTimeout bounds how long `stint dev` waits for running tasks when
// it stops.
const devStopTimeout = 10 * time.Second

// devOptions are the flags of stint dev.
type devOptions struct {
	data    string
	port    int
	workers int
	http    httpOptions
}

// newDevCmd returns `stint dev`.
func (c *cli) newDevCmd() *cobra.Command {
	o := &devOptions{}
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run PostgreSQL and a server node locally, for development",
		Long: `Run a local development setup: a PostgreSQL server from the installed
PostgreSQL binaries (installing the distribution's postgresql package first
when they are missing and dev runs as root on Debian or Ubuntu), with its data
kept in DATA/pgdata (or, when dev runs as root and PostgreSQL's unprivileged
user cannot enter DATA, in /var/lib/stint-dev/<hash of DATA>/pgdata; dev says
so), a database named stint with the schema migrated, and a server node
running every built-in behavior.
It prints the database URL to use with the other commands and a link to the
dashboard, runs its demo.echo task (stint-dev-demo) so that a round trip shows
in the log, submits a demo ingest batch unless an earlier run's is there, and
runs until SIGINT or SIGTERM. DATA keeps what the URL and the link hold from
one run to the next: the ports, and the link's admin token (DATA/token, mode
0600) unless tokens are given.

If a PostgreSQL server already runs in DATA/pgdata (another 'stint dev', or a
detached one), it is reused and left running at the end; otherwise dev stops
the server it started.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.runDev(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.data, "data", ".stint", "directory for the development data")
	f.IntVar(&o.port, "port", 0, "PostgreSQL port on 127.0.0.1 (0: the previous run's port if free, else a free one)")
	f.IntVar(&o.workers, "workers", 0, "most tasks run at once (default 1000)")
	addHTTPFlags(cmd, &o.http, devHTTPAddr)
	return cmd
}

// runDev implements `stint dev`.
func (c *cli) runDev(ctx context.Context, o *devOptions) (err error) {
	if o.port < 0 || o.port > 65535 {
		return usageErrorf("--port %d is outside 0..65535", o.port)
	}
	if o.workers < 0 {
		return usageErrorf("--workers %d is negative", o.workers)
	}
	httpSrv, err := c.prepareHTTP(&o.http, true)
	if err != nil {
		return err
	}
	if _, err := c.postgresBinDir(ctx); err != nil {
		// The error says how to install PostgreSQL.
		return err
	}
	dir, pgdata, err := c.devDirs(o.data)
	if err != nil {
		return err
	}
	if err := httpSrv.useDevState(dir); err != nil {
		return err
	}
	cluster, err := c.startCluster(ctx, dir, pgdata, o.port)
	if err != nil {
		return err
	}
	defer func() {
		if cluster.Reused() {
			c.log.Info(c.name+" dev: leaving the PostgreSQL server running, as it was running before", "port", cluster.Port())
			return
		}
		c.log.Info(c.name + " dev: stopping PostgreSQL")
		if serr := cluster.Stop(); serr != nil {
			err = errors.Join(err, fmt.Errorf("stop PostgreSQL: %w", serr))
			return
		}
		c.log.Info(c.name + " dev: PostgreSQL stopped")
	}()
	if err := os.WriteFile(filepath.Join(dir, devPortFile), []byte(strconv.Itoa(cluster.Port())+"\n"), 0o644); err != nil {
		c.log.Warn(c.name+" dev: cannot remember the port for the next run", "err", err)
	}

	if err := ensureDatabase(ctx, cluster.DSN("postgres"), devDatabase); err != nil {
		return err
	}
	dsn := cluster.DSN(devDatabase)
	st, err := postgres.Open(ctx, dsn, postgres.Migrate())
	if err != nil {
		return err
	}
	defer st.Close()
	ingestDemo := c.prepareIngestDemo(dir, st.Pool()) // before serverRegistry: configures the ingest behaviors
	reg, err := c.serverRegistry(st)
	if err != nil {
		return err
	}
	metrics, err := httpSrv.newMetrics(ctx)
	if err != nil {
		return err
	}
	defer metrics.shutdown()
	srv, err := impl.NewServer(st, impl.ServerConfig{
		Registry:      reg,
		MaxWorkers:    o.workers,
		Logger:        c.log,
		MeterProvider: metrics.meterProvider(),
	})
	if err != nil {
		return err
	}
	if err := srv.Start(ctx); err != nil {
		return err
	}
	if err := httpSrv.start(srv.Client, reg); err != nil {
		return errors.Join(err, c.stopServer(srv, devStopTimeout))
	}

	c.printDevReady(cluster, dsn, srv.Node())

	var demoDone sync.WaitGroup
	demoDone.Go(func() { c.demoRoundTrip(ctx, srv) })
	demoDone.Go(func() { ingestDemo.run(ctx, c, srv) })

	<-ctx.Done()
	demoDone.Wait()
	httpSrv.stop()
	return c.stopServer(srv, devStopTimeout)
}

// devDirs creates the data directory of `stint dev` and returns it with
// the PostgreSQL data directory inside it, or elsewhere when PostgreSQL's
// unprivileged user could not reach it there.
func (c *cli) devDirs(data string) (dir, pgdata string, err error) {
	dir, err = filepath.Abs(data)
	if err != nil {
		return "", "", fmt.Errorf("resolve --data %s: %w", data, err)
	}
	// Searchable by all: when stint runs as root, PostgreSQL runs as an
	// unprivileged user that must reach the data directory inside.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("create the data directory: %w", err)
	}
	pgdata, moved, err := pgcluster.ReachableDataDir(filepath.Join(dir, devPGData))
	if err != nil {
		return "", "", fmt.Errorf("place the PostgreSQL data directory: %w", err)
	}
	if moved {
		fmt.Fprintf(c.stdout, "%s dev: PostgreSQL runs as an unprivileged user that cannot enter %s, so its data is in %s\n", c.name, dir, pgdata)
	}
	return dir, pgdata, nil
}

// printDevReady says where things are and what to try. The try-it lines
// are the README's quickstart, word for word.
func (c *cli) printDevReady(cluster *pgcluster.Cluster, dsn, node string) {
	fmt.Fprintf(c.stdout, "%s dev: PostgreSQL data in %s (server log: %s)\n", c.name, cluster.DataDir(), cluster.LogFile())
	fmt.Fprintf(c.stdout, "url: %s\n", dsn)
	fmt.Fprintf(c.stdout, "ready: node %s runs %s; press Ctrl-C to stop. In another terminal, try:\n", node, c.knownBehaviors())
	fmt.Fprintf(c.stdout, "  URL='%s'\n", dsn)
	// stint's own command is the README's: run from the repository.
	command := c.name
	if command == "stint" {
		command = "go run ./cmd/stint"
	}
	fmt.Fprintf(c.stdout, "  %s submit demo.echo --params '{\"text\":\"hi\"}' --wait --db \"$URL\"\n", command)
}

// startCluster starts or reuses the PostgreSQL server in pgdata. With port
// 0 it tries the port of the previous run (recorded in dir) first, so that
// the DSN stays the same, and falls back to a free port.
func (c *cli) startCluster(ctx context.Context, dir, pgdata string, port int) (*pgcluster.Cluster, error) {
	opts := pgcluster.Options{DataDir: pgdata, Port: port}
	previous := 0
	if port == 0 {
		previous = readPort(filepath.Join(dir, devPortFile))
		opts.Port = previous
	}
	c.log.Info(c.name+" dev: starting PostgreSQL", "data", opts.DataDir, "port", opts.Port)
	cluster, err := pgcluster.Start(ctx, opts)
	if err != nil && previous != 0 && ctx.Err() == nil {
		firstLine, _, _ := strings.Cut(err.Error(), "\n")
		c.log.Warn(c.name+" dev: cannot use the previous port; trying a free one", "port", previous, "err", firstLine)
		opts.Port = 0
		cluster, err = pgcluster.Start(ctx, opts)
	}
	if err != nil {
		return nil, fmt.Errorf("start PostgreSQL: %w", err)
	}
	if cluster.Reused() {
		c.log.Info(c.name+" dev: reusing the PostgreSQL server already running", "port", cluster.Port())
	}
	return cluster, nil
}

// readPort returns the port recorded in the file at path, or 0.
func readPort(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	port, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || port <= 0 || port > 65535 {
		return 0
	}
	return port
}

// ensureDatabase creates database name through the maintenance database at
// adminDSN unless it exists.
func ensureDatabase(ctx context.Context, adminDSN, name string) error {
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return fmt.Errorf("look up database %s: %w", name, err)
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database: created meanwhile
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// devDemoTask is the id of dev's demo.echo task: each run submits it
// again, which runs it again, and adds no task.
const devDemoTask api.TaskID = "stint-dev-demo"

// demoRoundTrip submits the demo.echo task and logs its result, to show a
// round trip through the database.
func (c *cli) demoRoundTrip(ctx context.Context, tasks api.Tasks) {
	f, err := api.Submit(ctx, tasks, demo.Echo, demo.EchoParams{Text: "hello from stint dev"}, api.WithID(devDemoTask))
	if err != nil {
		if ctx.Err() == nil {
			c.log.Error(c.name+" dev: submit the demo task", "err", err)
		}
		return
	}
	c.log.Info(c.name+" dev: submitted a demo task", "behavior", demo.Echo.ID, "id", f.ID())
	res, err := f.Await(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.log.Error(c.name+" dev: the demo task failed", "id", f.ID(), "err", err)
		}
		return
	}
	c.log.Info(c.name+" dev: the demo task finished: round trip done", "id", f.ID(), "result", res.Text, "attempt", res.Attempt)
}
