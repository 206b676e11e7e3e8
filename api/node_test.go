package api_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

// NewWorkflow builds from typed params and options the request that would
// otherwise be written by hand, with each node's params encoded.
func TestNewWorkflowBuildsTheRequest(t *testing.T) {
	t.Parallel()
	req, err := api.NewWorkflow("nightly-1127",
		api.NewNode("fetch", demo.Echo, demo.EchoParams{Text: "fetch"}, api.WithTask(api.WithPriority(3), api.WithDelay(time.Minute))),
		api.NewNode("a", demo.Echo, demo.EchoParams{Text: "a", Upper: true}, api.DependsOn("fetch")),
		api.NewNode("merge", demo.Echo, demo.EchoParams{Text: "merge"}, api.DependsOn("a"), api.DependsOn("fetch"), api.WithRule(api.RuleAnySucceeded)),
		api.NewNode("notify", demo.Echo, demo.EchoParams{Text: "done"}, api.Finally(), api.WithTask(api.WithGroupKey("g"))),
		api.NewGate("approve", "approval", 72*time.Hour, api.DependsOn("merge")),
	)
	require.NoError(t, err)
	three := 3
	require.Equal(t, api.WorkflowRequest{ID: "nightly-1127", Nodes: []api.WorkflowNode{
		{Name: "fetch", Task: api.SubmitRequest{Behavior: "demo.echo", Params: []byte(`{"text":"fetch"}`), Priority: &three, Delay: time.Minute}},
		{Name: "a", Task: api.SubmitRequest{Behavior: "demo.echo", Params: []byte(`{"text":"a","upper":true}`)}, DependsOn: []string{"fetch"}},
		{Name: "merge", Task: api.SubmitRequest{Behavior: "demo.echo", Params: []byte(`{"text":"merge"}`)},
			DependsOn: []string{"a", "fetch"}, Rule: api.RuleAnySucceeded},
		{Name: "notify", Task: api.SubmitRequest{Behavior: "demo.echo", Params: []byte(`{"text":"done"}`), GroupKey: "g"}, Finally: true},
		{Name: "approve", Gate: &api.Gate{Topic: "approval", Timeout: 72 * time.Hour}, DependsOn: []string{"merge"}},
	}}, req)

	nodes, err := api.NewNodes(api.NewNode("one", demo.Echo, demo.EchoParams{Text: "1"}))
	require.NoError(t, err)
	require.Equal(t, []api.WorkflowNode{{Name: "one", Task: api.SubmitRequest{Behavior: "demo.echo", Params: []byte(`{"text":"1"}`)}}}, nodes)
}

// Params that do not encode are an error naming the node, returned by
// NewWorkflow: nothing is built.
func TestNewWorkflowReturnsTheParamsError(t *testing.T) {
	t.Parallel()
	measure := api.Kind[struct{ Value float64 }, struct{}]{ID: "test.measure"}
	bad := api.NewNode("b", measure, struct{ Value float64 }{math.NaN()})
	_, err := bad.Node()
	require.Error(t, err)
	req, err := api.NewWorkflow("w-1",
		api.NewNode("a", measure, struct{ Value float64 }{1}),
		bad,
	)
	require.ErrorIs(t, err, api.ErrInvalid)
	var inv *api.InvalidError
	require.True(t, errors.As(err, &inv))
	require.Equal(t, "nodes[1].task.params", inv.Field)
	require.Contains(t, inv.Reason, `node "b": json: unsupported value: NaN`)
	require.Zero(t, req)
	_, err = api.NewNodes(bad)
	require.ErrorContains(t, err, "invalid nodes[0].task.params")
}

// A workflow's nodes are built from a behavior's Kind and typed params,
// as Submit takes them, and NewWorkflow collects them into the request, or
// returns the first node whose params do not encode.
func ExampleNewWorkflow() {
	ctx := context.Background()
	client, stop := exampleServer(ctx)
	defer stop()
	w, err := diamond(ctx, client)
	if err != nil {
		log.Fatal(err)
	}
	merge, _ := w.Node("merge")
	fmt.Println(w.State, merge.Task.ID, merge.Task.Status)
	// Output:
	// succeeded nightly-2026-11-27/merge success
}

// Each node runs as its rule says; a finally node runs once, after all.
func ExampleNewWorkflow_rules() {
	ctx := context.Background()
	client, stop := exampleServer(ctx)
	defer stop()
	w, err := nightly(ctx, client)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(w.State, w.Counts)
	// Output:
	// succeeded map[success:7]
}

// diamond is the first example of docs/workflows.md, which shows it whole
// (TestWorkflowDocsShowTheExamples).
func diamond(ctx context.Context, client api.Workflows) (api.Workflow, error) {
	req, err := api.NewWorkflow("nightly-2026-11-27",
		api.NewNode("fetch", demo.Echo, demo.EchoParams{Text: "fetch"}),
		api.NewNode("left", demo.Echo, demo.EchoParams{Text: "left"}, api.DependsOn("fetch")),
		api.NewNode("right", demo.Echo, demo.EchoParams{Text: "right"}, api.DependsOn("fetch")),
		api.NewNode("merge", demo.Echo, demo.EchoParams{Text: "merge"}, api.DependsOn("left", "right")),
		api.NewNode("tidy", demo.Echo, demo.EchoParams{Text: "tidy"}, api.DependsOn("merge"), api.WithRule(api.RuleAllEnded)),
		api.NewNode("notify", demo.Echo, demo.EchoParams{Text: "done"}, api.Finally()),
	)
	if err != nil {
		return api.Workflow{}, err // params that do not encode, naming the node
	}
	sub, err := client.SubmitWorkflow(ctx, req)
	if err != nil {
		return api.Workflow{}, err
	}
	w, err := client.AwaitWorkflow(ctx, sub.ID) // w.State: succeeded, failed or cancelled
	return w, err
}

// nightly is the workflow of the README, which shows it whole
// (TestWorkflowDocsShowTheExamples).
func nightly(ctx context.Context, client api.Workflows) (api.Workflow, error) {
	echo := func(text string) demo.EchoParams { return demo.EchoParams{Text: text} }
	req, err := api.NewWorkflow("nightly-1127",
		api.NewNode("fetch", demo.Echo, echo("fetch")),
		api.NewNode("a", demo.Echo, echo("a"), api.DependsOn("fetch")), // all_succeeded (default)
		api.NewNode("b", demo.Echo, echo("b"), api.DependsOn("fetch")),
		api.NewNode("merge", demo.Echo, echo("merge"), api.DependsOn("a", "b"), api.WithRule(api.RuleAnySucceeded)), // one is enough
		api.NewNode("report", demo.Echo, echo("report"), api.DependsOn("merge"), api.WithRule(api.RuleNoneFailed)),  // skipped deps are fine
		api.NewNode("tidy", demo.Echo, echo("tidy"), api.DependsOn("a", "b"), api.WithRule(api.RuleAllEnded)),       // whatever happened
		api.NewNode("notify", demo.Echo, echo("done"), api.Finally()),                                               // once, after all
	)
	if err != nil {
		return api.Workflow{}, err // params that do not encode, naming the node
	}
	sub, err := client.SubmitWorkflow(ctx, req)
	if err != nil {
		return api.Workflow{}, err
	}
	w, err := client.AwaitWorkflow(ctx, sub.ID) // from any process: state and every node's outcome
	return w, err
}

// exampleServer starts a server node running demo.echo on the examples'
// database, and returns it with its stop.
func exampleServer(ctx context.Context) (*impl.Server, func()) {
	st, err := postgres.Open(ctx, os.Getenv("DATABASE_URL"), postgres.Migrate())
	if err != nil {
		log.Fatal(err)
	}
	reg := spi.NewRegistry()
	if err := demo.Register(reg); err != nil {
		log.Fatal(err)
	}
	srv, err := impl.NewServer(st, impl.ServerConfig{Registry: reg})
	if err != nil {
		log.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		log.Fatal(err)
	}
	return srv, func() {
		_ = srv.Stop(ctx)
		st.Close()
	}
}

// The workflow examples of README.md and docs/workflows.md are nightly
// and diamond, which compile and run: each page's first Go block under
// its heading is its function as written here (spaces aside).
func TestWorkflowDocsShowTheExamples(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("node_test.go")
	require.NoError(t, err)
	src := string(raw)
	for _, c := range []struct{ page, heading, fn string }{
		{"../README.md", "## Workflows", "nightly"},
		{"../docs/workflows.md", "## Workflows", "diamond"},
	} {
		raw, err := os.ReadFile(c.page)
		require.NoError(t, err)
		_, section, ok := strings.Cut(string(raw), "\n"+c.heading+"\n")
		require.True(t, ok, "%s has %q", c.page, c.heading)
		_, block, ok := strings.Cut(section, "```go\n")
		require.True(t, ok, "%s has a Go block under %q", c.page, c.heading)
		block, _, ok = strings.Cut(block, "```")
		require.True(t, ok, "%s: the Go block closes", c.page)

		at := strings.Index(src, "\nfunc "+c.fn+"(")
		require.Positive(t, at, "node_test.go has %s", c.fn)
		fn, _, ok := strings.Cut(src[at+1:], "\n}\n")
		require.True(t, ok)
		require.Equal(t, normalize(fn+"\n}"), normalize(block), "%s shows %s as node_test.go has it", c.page, c.fn)
	}
}

// normalize trims each line of code and joins runs of spaces, so that
// indentation and the alignment of comments do not count.
func normalize(code string) []string {
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(code), "\n") {
		out = append(out, strings.Join(strings.Fields(line), " "))
	}
	return out
}
