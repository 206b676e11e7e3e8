package api_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"testing"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

func TestMain(m *testing.M) { pgtest.MainWithExamples(m) }

// Submit takes a behavior's Kind, here demo.Echo, which fixes the types of
// its params and result, and returns a Future whose Await returns the typed
// result. Any api.Tasks will do: a server node, as here, or a client-only
// process (impl.NewClient). Bad params are refused before anything is
// stored, with an error wrapping api.ErrInvalid.
func Example() {
	ctx := context.Background()
	st, err := postgres.Open(ctx, os.Getenv("DATABASE_URL"), postgres.Migrate())
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
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
	defer srv.Stop(ctx)

	var tasks api.Tasks = srv
	f, err := api.Submit(ctx, tasks, demo.Echo, demo.EchoParams{Text: "hi", Upper: true})
	if err != nil {
		log.Fatal(err)
	}
	res, err := f.Await(ctx) // res is a demo.EchoResult
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Text, "after", res.Attempt, "attempt")

	_, err = api.Submit(ctx, tasks, demo.Echo, demo.EchoParams{})
	fmt.Println(errors.Is(err, api.ErrInvalid), err)
	// Output:
	// HI after 1 attempt
	// true submit demo.echo: invalid params.text: is required
}
