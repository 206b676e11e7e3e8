package impl_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver of database/sql

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

// GreetParams are the params of example.greet.
type GreetParams struct {
	Name string `json:"name" validate:"required,max=100"`
}

// Greeting is the result of example.greet.
type Greeting struct {
	Text string `json:"text"`
}

// Greet is the kind of example.greet's tasks.
var Greet = api.Kind[GreetParams, Greeting]{ID: "example.greet"}

// greeter is example.greet: it greets by name.
type greeter struct{}

func (greeter) Kind() api.Kind[GreetParams, Greeting]        { return Greet }
func (greeter) TaskID(ids spi.IDs, p GreetParams) api.TaskID { return ids.Deterministic(p.Name) }
func (greeter) Run(_ context.Context, _ spi.RunContext, p GreetParams) (Greeting, error) {
	return Greeting{Text: "hello, " + p.Name}, nil
}

// startGreeter starts a server node that runs example.greet on st; stop
// stops it.
func startGreeter(ctx context.Context, st *postgres.Store) (srv *impl.Server, stop func()) {
	reg := spi.NewRegistry()
	spi.MustRegister[GreetParams, Greeting](reg, greeter{})
	srv, err := impl.NewServer(st, impl.ServerConfig{Registry: reg})
	if err != nil {
		log.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		log.Fatal(err)
	}
	return srv, func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := srv.Stop(stopCtx); err != nil {
			log.Print(err)
		}
	}
}

// A server node runs the behaviors of its registry and submits like a
// client: Submit returns a Future, whose Await returns the task's result.
func Example_submitAndAwait() {
	ctx := context.Background()
	st, err := postgres.Open(ctx, os.Getenv("DATABASE_URL"), postgres.Migrate())
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	reg := spi.NewRegistry()
	spi.MustRegister[GreetParams, Greeting](reg, greeter{})
	srv, err := impl.NewServer(st, impl.ServerConfig{Registry: reg})
	if err != nil {
		log.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer func() {
		// Give running tasks 30 s, then hand them to other nodes.
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := srv.Stop(stopCtx); err != nil {
			log.Print(err)
		}
	}()

	f, err := api.Submit(ctx, srv, Greet, GreetParams{Name: "Ada"})
	if err != nil {
		log.Fatal(err)
	}
	g, err := f.Await(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(g.Text)
	// Output: hello, Ada
}

// A client-only process submits and awaits but runs nothing: the tasks
// run on the server nodes, here one started alongside it.
func ExampleNewClient() {
	ctx := context.Background()
	st, err := postgres.Open(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	_, stop := startGreeter(ctx, st) // elsewhere: the service's nodes
	defer stop()

	// The client's registry knows the behaviors it submits to validate
	// their params; it runs none.
	reg := spi.NewRegistry()
	spi.MustRegister[GreetParams, Greeting](reg, greeter{})
	client, err := impl.NewClient(st, impl.ClientConfig{Registry: reg})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	if _, err := api.Submit(ctx, client, Greet, GreetParams{Name: ""}); err != nil {
		fmt.Println(err)
	}
	f, err := api.Submit(ctx, client, Greet, GreetParams{Name: "Grace"})
	if err != nil {
		log.Fatal(err)
	}
	g, err := f.Await(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(g.Text)
	// Output:
	// submit example.greet: invalid params.name: is required
	// hello, Grace
}

// SubmitTx submits in the caller's pgx transaction, next to the caller's
// own writes: the task exists if and only if the transaction commits, and
// the commit wakes the nodes that run it.
func ExampleSubmitTx() {
	ctx := context.Background()
	st, err := postgres.Open(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	srv, stop := startGreeter(ctx, st)
	defer stop()
	pool := st.Pool() // or the service's own pool

	var f *api.Future[Greeting]
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_signup (name text)`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO example_signup VALUES ('Hedy')`); err != nil {
			return err
		}
		f, err = impl.SubmitTx(ctx, srv.Client, tx, Greet, GreetParams{Name: "Hedy"})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	g, err := f.Await(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(g.Text)
	// Output: hello, Hedy
}

// SubmitSQLTx submits in a database/sql transaction of pgx's stdlib
// driver, as GORM, Bun, sqlx or sqlc begin them: a rollback leaves no task.
func ExampleSubmitSQLTx() {
	ctx := context.Background()
	st, err := postgres.Open(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	srv, stop := startGreeter(ctx, st)
	defer stop()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	// Rolled back: the task never existed.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	f, err := impl.SubmitSQLTx(ctx, srv.Client, tx, Greet, GreetParams{Name: "Nobody"})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		log.Fatal(err)
	}
	if _, err := srv.Get(ctx, f.ID()); errors.Is(err, api.ErrNotFound) {
		fmt.Println("rolled back: no task")
	}

	// Committed: it runs.
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	f, err = impl.SubmitSQLTx(ctx, srv.Client, tx, Greet, GreetParams{Name: "Barbara"})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	g, err := f.Await(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(g.Text)
	// Output:
	// rolled back: no task
	// hello, Barbara
}
