package spi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"testing"
	"time"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

func TestMain(m *testing.M) { pgtest.MainWithExamples(m) }

// ImportParams are the params of example.import: the items to import.
type ImportParams struct {
	Items []string `json:"items" validate:"required,min=1"`
}

// ImportResult is the result of example.import.
type ImportResult struct {
	Imported int `json:"imported"`
}

// importer is example.import. It checkpoints after each item, so that a
// retry resumes after the last item imported; its first run fails at the
// third item, as a flaky connection would.
type importer struct{}

func (importer) Kind() api.Kind[ImportParams, ImportResult] {
	return api.Kind[ImportParams, ImportResult]{ID: "example.import"}
}

func (importer) TaskID(ids spi.IDs, _ ImportParams) api.TaskID { return ids.Unique() }

// Policy retries a failed run after 100 to 200 ms (doubling), three runs
// at most, and takes a task of a node that stopped renewing its lease over
// after 10 s.
func (importer) Policy() spi.Policy {
	return spi.Policy{Lease: 10 * time.Second, MaxAttempts: 3, BackoffMin: 100 * time.Millisecond, BackoffMax: 200 * time.Millisecond}
}

func (importer) Run(ctx context.Context, rc spi.RunContext, p ImportParams) (ImportResult, error) {
	var done int // items imported by earlier runs
	if _, err := rc.Progress(&done); err != nil {
		return ImportResult{}, err
	}
	for i := done; i < len(p.Items); i++ {
		if rc.Attempt() == 1 && i == 2 {
			// Any error but a *api.TaskError saying otherwise is retried.
			return ImportResult{}, errors.New("connection reset")
		}
		fmt.Printf("attempt %d: imported %s\n", rc.Attempt(), p.Items[i])
		if err := rc.Checkpoint(ctx, i+1); err != nil {
			return ImportResult{}, err // api.ErrHalt: the task is no longer this run's
		}
	}
	return ImportResult{Imported: len(p.Items)}, nil
}

// A behavior with a policy and a checkpoint: its failed first run is
// retried after the policy's backoff, and the retry resumes after the last
// checkpoint instead of starting over.
func ExamplePolicy() {
	ctx := context.Background()
	st, err := postgres.Open(ctx, os.Getenv("DATABASE_URL"), postgres.Migrate())
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	reg := spi.NewRegistry()
	spi.MustRegister[ImportParams, ImportResult](reg, importer{})
	srv, err := impl.NewServer(st, impl.ServerConfig{Registry: reg})
	if err != nil {
		log.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer srv.Stop(ctx)

	kind := importer{}.Kind()
	f, err := api.Submit(ctx, srv, kind, ImportParams{Items: []string{"a", "b", "c"}})
	if err != nil {
		log.Fatal(err)
	}
	res, err := f.Await(ctx)
	if err != nil {
		log.Fatal(err)
	}
	task, err := srv.Get(ctx, f.ID())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("imported %d items in %d runs\n", res.Imported, task.Attempt)
	// Output:
	// attempt 1: imported a
	// attempt 1: imported b
	// attempt 2: imported c
	// imported 3 items in 2 runs
}

// ReportParams are the params of example.report.
type ReportParams struct {
	Kind string `json:"kind"`
}

// reported receives the kind of each report example.report builds.
var reported = make(chan string, 1)

// reporter is example.report, which runs on a schedule.
type reporter struct{}

func (reporter) Kind() api.Kind[ReportParams, struct{}] {
	return api.Kind[ReportParams, struct{}]{ID: "example.report"}
}

func (reporter) TaskID(ids spi.IDs, _ ReportParams) api.TaskID { return ids.Unique() }

// Schedules fires a daily report every second, for the example; a cron
// expression such as "0 3 * * *" with a TimeZone is the usual spec. Every
// server that runs the behavior stores it; each tick fires one task across
// all of them.
func (reporter) Schedules() []api.Schedule {
	return []api.Schedule{{Name: "example-report", Spec: "@every 1s", Params: []byte(`{"kind":"daily"}`)}}
}

func (reporter) Run(_ context.Context, _ spi.RunContext, p ReportParams) (struct{}, error) {
	select {
	case reported <- p.Kind:
	default: // the example has its report already
	}
	return struct{}{}, nil
}

// A behavior that runs on a schedule declares it: nobody submits its tasks.
func ExampleScheduler() {
	ctx := context.Background()
	st, err := postgres.Open(ctx, os.Getenv("DATABASE_URL"), postgres.Migrate())
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	reg := spi.NewRegistry()
	spi.MustRegister[ReportParams, struct{}](reg, reporter{})
	srv, err := impl.NewServer(st, impl.ServerConfig{Registry: reg})
	if err != nil {
		log.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer srv.Stop(ctx)

	schedules, err := srv.Schedules(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range schedules {
		fmt.Println(s.Name, s.Behavior, s.Spec, s.Registered)
	}
	fmt.Println("built the", <-reported, "report")
	// Output:
	// example-report example.report @every 1s true
	// built the daily report
}

// GreetParams are the params of example.greet.
type GreetParams struct {
	Name string `json:"name" validate:"required,max=100"`
}

// Greet is the kind of example.greet: its params and result types.
var Greet = api.Kind[GreetParams, string]{ID: "example.greet"}

// greeter is example.greet. A submit of a name it greeted already is the
// same task (a deterministic id).
type greeter struct{}

func (greeter) Kind() api.Kind[GreetParams, string]          { return Greet }
func (greeter) TaskID(ids spi.IDs, p GreetParams) api.TaskID { return ids.Deterministic(p.Name) }
func (greeter) Run(_ context.Context, _ spi.RunContext, p GreetParams) (string, error) {
	return "hello, " + p.Name, nil
}

// A behavior is a Kind, a TaskID and a Run. Registered in a Registry, it
// has its params checked by their validate tags and its ids derived; a
// server given the registry (impl.NewServer) runs its tasks, and clients
// given it submit them (ExamplePolicy runs one).
func Example() {
	reg := spi.NewRegistry()
	if err := spi.Register[GreetParams, string](reg, greeter{}); err != nil {
		log.Fatal(err)
	}
	r, ok := reg.Lookup(Greet.ID)
	fmt.Println(reg.IDs(), ok)
	p, err := r.Decode(json.RawMessage(`{"name":"Ada"}`))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(r.TaskID(p) == r.TaskID(p))
	_, err = r.Decode(json.RawMessage(`{"name":""}`))
	fmt.Println(err)
	// Output:
	// [example.greet] true
	// true
	// invalid params.name: is required
}
