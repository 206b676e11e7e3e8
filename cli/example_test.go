package cli_test

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/cli"
	"github.com/stinthq/stint/spi"
)

// HelloParams are the params of acme.hello.
type HelloParams struct {
	Name string `json:"name" validate:"required"`
}

// hello is acme.hello, a behavior of the program's own.
type hello struct{}

func (hello) Kind() api.Kind[HelloParams, string] {
	return api.Kind[HelloParams, string]{ID: "acme.hello"}
}

func (hello) TaskID(ids spi.IDs, p HelloParams) api.TaskID { return ids.Deterministic(p.Name) }

func (hello) Run(_ context.Context, _ spi.RunContext, p HelloParams) (string, error) {
	return "hello, " + p.Name, nil
}

// A program of one's own registers its behaviors and hands them to Main,
// which gives it every stint command under its own name:
//
//	func main() {
//		reg := spi.NewRegistry()
//		spi.MustRegister[HelloParams, string](reg, hello{})
//		cli.Main(reg)
//	}
//
// Here RunAs, which Main calls with the program's name and arguments, runs
// command lines of the program acme, as two terminals would run
// `acme server` and `acme submit`: a submit that waits for the result, and
// one whose params the behavior refuses (exit code 2, nothing stored).
func ExampleMain() {
	reg := spi.NewRegistry()
	spi.MustRegister[HelloParams, string](reg, hello{})
	db := os.Getenv("DATABASE_URL")

	ctx, stopServer := context.WithCancel(context.Background())
	served := make(chan int)
	go func() {
		served <- cli.RunAs(ctx, "acme", []string{"server", "--db", db, "--node", "node-1"}, reg, nil, io.Discard, io.Discard)
	}()

	args := []string{"submit", "acme.hello", "--params", `{"name":"Ada"}`, "--id", "hello-ada", "--wait", "--db", db}
	code := cli.RunAs(context.Background(), "acme", args, reg, nil, os.Stdout, io.Discard)
	fmt.Println("exit code", code)
	code = cli.RunAs(context.Background(), "acme", []string{"submit", "acme.hello", "--db", db}, reg, nil, os.Stdout, os.Stdout)
	fmt.Println("exit code", code)
	stopServer()
	<-served
	// Output:
	// task hello-ada: created (status scheduled)
	// task hello-ada: success (attempt 1 on node-1)
	// result: "hello, Ada"
	// exit code 0
	// acme: error: invalid params.name: is required
	// exit code 2
}
