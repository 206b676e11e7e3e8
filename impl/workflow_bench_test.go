package impl_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

// BenchmarkWorkflow runs workflows of no-op nodes of three shapes on one
// server and reports the submit's time and the nodes finished per second
// (the workflow's whole time, from its submit to its end): a fan-out of
// one node to b.N, a fan-in of b.N nodes to one, and a chain of b.N nodes,
// whose figure is the time per hop (a node's finish to its dependent's).
func BenchmarkWorkflow(b *testing.B) {
	shapes := map[string]func(n int) []api.WorkflowNode{
		"fan-out": func(n int) []api.WorkflowNode {
			nodes := []api.WorkflowNode{{Name: "root", Task: api.SubmitRequest{Behavior: noopKind.ID}}}
			for i := range n {
				nodes = append(nodes, api.WorkflowNode{Name: fmt.Sprint("n", i), Task: api.SubmitRequest{Behavior: noopKind.ID}, DependsOn: []string{"root"}})
			}
			return nodes
		},
		"fan-in": func(n int) []api.WorkflowNode {
			nodes := []api.WorkflowNode{}
			deps := make([]string, n)
			for i := range n {
				deps[i] = fmt.Sprint("n", i)
				nodes = append(nodes, api.WorkflowNode{Name: deps[i], Task: api.SubmitRequest{Behavior: noopKind.ID}})
			}
			return append(nodes, api.WorkflowNode{Name: "sink", Task: api.SubmitRequest{Behavior: noopKind.ID}, DependsOn: deps})
		},
		"chain": func(n int) []api.WorkflowNode {
			nodes := []api.WorkflowNode{{Name: "n0", Task: api.SubmitRequest{Behavior: noopKind.ID}}}
			for i := 1; i < n; i++ {
				nodes = append(nodes, api.WorkflowNode{Name: fmt.Sprint("n", i), Task: api.SubmitRequest{Behavior: noopKind.ID}, DependsOn: []string{fmt.Sprint("n", i-1)}})
			}
			return nodes
		},
	}
	for _, name := range []string{"fan-out", "fan-in", "chain"} {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			reg := spi.NewRegistry()
			spi.MustRegister[struct{}, struct{}](reg, noop{})
			_, srv := benchServer(b, reg)
			if err := srv.Start(ctx); err != nil {
				b.Fatal(err)
			}
			defer srv.Stop(ctx)
			nodes := shapes[name](max(b.N, 2))
			b.ResetTimer()
			start := time.Now()
			sub, err := srv.SubmitWorkflow(ctx, api.WorkflowRequest{Nodes: nodes})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(time.Since(start).Milliseconds()), "submit-ms")
			w, err := srv.AwaitWorkflow(ctx, sub.ID)
			if err != nil {
				b.Fatal(err)
			}
			if w.State != api.WorkflowSucceeded {
				b.Fatalf("workflow %s", w.State)
			}
			took := time.Since(start)
			b.ReportMetric(float64(len(nodes))/took.Seconds(), "nodes/s")
			if name == "chain" {
				b.ReportMetric(float64(took.Microseconds())/1000/float64(len(nodes)), "ms/hop")
			}
		})
	}
}

// benchServer returns a server, not started, with the behaviors of reg on
// a fresh database, and its store; both end with the benchmark.
func benchServer(b *testing.B, reg *spi.Registry) (*postgres.Store, *impl.Server) {
	st, err := postgres.Open(context.Background(), pgtest.New(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(st.Close)
	srv, err := impl.NewServer(st, impl.ServerConfig{Registry: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	return st, srv
}
