package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/store/postgres"
)

// serverStopTimeout bounds how long `stint server` waits for running tasks
// when it stops; the runs still going then are released to other nodes.
const serverStopTimeout = 30 * time.Second

// serverOptions are the flags of stint server.
type serverOptions struct {
	db        *dbFlag
	node      string
	workers   int
	behaviors []string
	http      httpOptions
}

// newServerCmd returns `stint server`.
func (c *cli) newServerCmd() *cobra.Command {
	o := &serverOptions{}
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run a server node that claims and runs tasks",
		Long: `Run a server node: apply pending migrations, register the node, and claim and
run due tasks of the chosen behaviors (all built-in ones by default) until
SIGINT or SIGTERM. Then stop claiming, wait up to 30s for running tasks to
finish, release the rest to other nodes, and deregister.`,
		Example: `  stint server --db postgres://user@db/stint --node node-1 --workers 200`,
		Args:    exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.runServer(cmd.Context(), o)
		},
	}
	o.db = addDBFlag(cmd)
	addReadDBFlag(cmd, o.db)
	f := cmd.Flags()
	f.StringVar(&o.node, "node", "", "node id (default host-pid-random)")
	f.IntVar(&o.workers, "workers", 0, "most tasks run at once (default 1000)")
	f.StringSliceVar(&o.behaviors, "behaviors", nil, "comma-separated behaviors to run (default all: "+c.knownBehaviors()+")")
	addHTTPFlags(cmd, &o.http, "")
	return cmd
}

// runServer implements `stint server`.
func (c *cli) runServer(ctx context.Context, o *serverOptions) error {
	if o.workers < 0 {
		return usageErrorf("--workers %d is negative", o.workers)
	}
	behaviors, err := c.parseBehaviors(o.behaviors)
	if err != nil {
		return err
	}
	httpSrv, err := c.prepareHTTP(&o.http, false)
	if err != nil {
		return err
	}
	st, err := c.openStore(ctx, o.db, postgres.Migrate())
	if err != nil {
		return err
	}
	defer st.Close()
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
		Node:          o.node,
		Registry:      reg,
		Behaviors:     behaviors,
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
	c.log.Info(c.name+" server: running; send SIGINT or SIGTERM to stop", "node", srv.Node())
	if err := httpSrv.start(srv.Client, reg); err != nil {
		return errors.Join(err, c.stopServer(srv, serverStopTimeout))
	}
	<-ctx.Done()
	httpSrv.stop()
	return c.stopServer(srv, serverStopTimeout)
}

// stopServer stops srv, giving its running tasks up to timeout to finish.
func (c *cli) stopServer(srv *impl.Server, timeout time.Duration) error {
	c.log.Info(c.name+": stopping: waiting for running tasks", "node", srv.Node(), "running", srv.Running(), "timeout", timeout)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := srv.Stop(ctx); err != nil {
		return fmt.Errorf("stop server: %w", err)
	}
	return nil
}

// parseBehaviors checks the values of a --behaviors flag against the
// registered behaviors.
func (c *cli) parseBehaviors(names []string) ([]api.BehaviorID, error) {
	reg := c.reg
	var ids []api.BehaviorID
	for _, name := range names {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if _, ok := reg.Lookup(api.BehaviorID(name)); !ok {
			return nil, usageErrorf("--behaviors: unknown behavior %q; known behaviors: %s", name, c.knownBehaviors())
		}
		ids = append(ids, api.BehaviorID(name))
	}
	return ids, nil
}
