// Package cli is the command line of stint, the task framework on
// PostgreSQL: the stint command, and the same commands for a program with
// behaviors of its own.
//
// It runs a development setup with an embedded PostgreSQL (dev), a server
// node with the HTTP API and dashboard (server), applies the schema
// (migrate), submits tasks and awaits their results (submit), inspects
// tasks (tasks), server nodes (nodes), ingest batches and replications, and
// steers the cluster: pauses behaviors (behaviors), holds group keys
// (groups), sets limits (limits).
// cmd/stint is Main with the built-in behaviors; a program registers its
// own behaviors and calls Main with them from its func main (see Main's
// example).
//
// Every command except dev takes the database as --db URL, defaulting to the
// environment variable STINT_DATABASE_URL. server, submit, stats and the
// tasks commands ls, show and wait also take --read-db URL, defaulting to
// STINT_READ_DATABASE_URL: a hot standby of the database that serves their
// reads that may lag, while writes and claims stay on --db.
//
// Exit codes: 0 on success; 1 when something failed (the database could not
// be reached, a task that was awaited failed, a task was not found, an
// operation the state of its task or workflow does not allow); 2 for
// bad input (an unknown flag, a malformed flag value, invalid params, an
// unknown behavior), in which case nothing was stored; 130 (128 and the
// signal's number: 143 for SIGTERM) when Ctrl-C stopped a command that
// waits for a task, a workflow or a batch, which runs on.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/pgcluster"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store/postgres"
)

// envDatabaseURL names the environment variable that --db defaults to.
const envDatabaseURL = "STINT_DATABASE_URL"

// envReadDatabaseURL names the environment variable that --read-db
// defaults to.
const envReadDatabaseURL = "STINT_READ_DATABASE_URL"

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// Main runs the stint command line on os.Args with the behaviors of reg in
// addition to stint's built-in ones, and exits with its code: 0 on success,
// 1 on failure, 2 for bad input. Help, usage and error messages name the
// program as it was run (the last element of os.Args[0], without .exe),
// so a program of one's own names itself. A program that defines its own behaviors
// calls it from its main to get every stint command (server, dev, submit,
// tasks, the HTTP API and dashboard, ...) for them. reg may be nil; a
// behavior with a built-in's id is an error. SIGINT and SIGTERM stop the
// command gracefully; a second one ends the process at once.
func Main(reg *spi.Registry) {
	ctx, stop := signalContext(os.Interrupt, syscall.SIGTERM)
	name := programName(os.Args[0])
	shutdownTelemetry, err := setupTelemetry(ctx, name, os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: error: %v\n", name, err)
		os.Exit(exitFailure)
	}
	code := RunAs(ctx, name, os.Args[1:], reg, os.Stdin, os.Stdout, os.Stderr)
	stop()
	flushCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = shutdownTelemetry(flushCtx)
	cancel()
	os.Exit(code)
}

// Run runs the stint command line with args (the program name left out)
// and the behaviors of reg in addition to the built-in ones, reading stdin
// and writing to stdout and stderr, until it is done or ctx ends. It
// returns the exit code: 0 on success, 1 on failure, 2 for bad input. It
// sets up no signal handling or telemetry: Main does. Its help and
// messages name the program stint; RunAs names it otherwise.
func Run(ctx context.Context, args []string, reg *spi.Registry, stdin io.Reader, stdout, stderr io.Writer) int {
	return RunAs(ctx, "stint", args, reg, stdin, stdout, stderr)
}

// RunAs is Run for the program called name, which its help, usage and
// error messages name ("name: error: ...", "Run 'name submit --help'").
func RunAs(ctx context.Context, name string, args []string, reg *spi.Registry, stdin io.Reader, stdout, stderr io.Writer) int {
	if name == "" {
		name = "stint"
	}
	c, err := newCLI(name, stdout, stderr, reg)
	if err != nil {
		fmt.Fprintf(stderr, "%s: error: %v\n", name, err)
		return exitFailure
	}
	defer c.builtins.close()
	root := c.newRootCmd()
	root.SetIn(stdin)
	root.SetArgs(args)
	return execute(ctx, name, root, stderr)
}

// programName returns the name of the program run as arg0: its last path
// element, without the .exe of Windows.
func programName(arg0 string) string {
	name := strings.TrimSuffix(filepath.Base(arg0), ".exe")
	if name == "" || name == "." || name == string(filepath.Separator) {
		return "stint"
	}
	return name
}

// exitError is an error together with the exit code it ends the process
// with. A nil err means the failure was already reported on the output and
// nothing more is printed.
type exitError struct {
	code int
	err  error
}

// Error returns the message of the wrapped error.
func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

// Unwrap returns the wrapped error.
func (e *exitError) Unwrap() error { return e.err }

// usageErrorf returns an error about bad command-line input, which ends the
// process with exit code 2.
func usageErrorf(format string, args ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

// silentExit returns an error that ends the process with code without
// printing anything more.
func silentExit(code int) error { return &exitError{code: code} }

// classify gives an error returned by a command its exit code: bad input
// (api.ErrInvalid) is 2, anything else 1, unless it already has one. An
// operation the state of its task or workflow does not allow
// (api.ErrConflict, HTTP's 409) is 1, its message without the sentinel's
// words, which add nothing to the reason before them ("hold workflow w:
// it has ended").
func classify(err error) error {
	if err == nil {
		return nil
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return err
	}
	if errors.Is(err, api.ErrInvalid) {
		return &exitError{code: exitUsage, err: err}
	}
	if errors.Is(err, api.ErrConflict) {
		return &exitError{code: exitFailure, err: conflict{err}}
	}
	return &exitError{code: exitFailure, err: err}
}

// conflict is an error wrapping api.ErrConflict, worded without the
// sentinel's words when the error says more than them.
type conflict struct{ err error }

// Error returns the message of the wrapped error without the sentinel's
// words.
func (c conflict) Error() string {
	msg := c.err.Error()
	sentinel := api.ErrConflict.Error()
	if msg == sentinel {
		return msg
	}
	msg = strings.ReplaceAll(msg, ": "+sentinel, "")
	return strings.ReplaceAll(msg, sentinel+": ", "")
}

// Unwrap returns the wrapped error.
func (c conflict) Unwrap() error { return c.err }

// exitCode returns the process exit code for an error returned by the root
// command. Errors that did not come from a command's own code come from
// cobra's parsing of the command line (unknown command or flag, wrong
// number of arguments, missing required flag), so they are usage errors.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return exitUsage
}

// execute runs root, the command tree of the program name, with ctx,
// prints any error to stderr and returns the process exit code.
func execute(ctx context.Context, name string, root *cobra.Command, stderr io.Writer) int {
	cmd, err := root.ExecuteContextC(ctx)
	code := exitCode(err)
	if err == nil {
		return code
	}
	var ee *exitError
	if errors.As(err, &ee) && ee.err == nil {
		return code
	}
	fmt.Fprintf(stderr, "%s: error: %v\n", name, err)
	if code == exitUsage && cmd != nil && !errors.Is(err, api.ErrInvalid) {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	return code
}

// cli holds what every command shares: the outputs, the logger and the
// behaviors.
type cli struct {
	// name is the program's name, which help and messages use.
	name           string
	stdout, stderr io.Writer
	level          *slog.LevelVar
	log            *slog.Logger
	// behaviors are the program's own behaviors, nil for none.
	behaviors *spi.Registry
	// builtins wires the built-in behaviors for this run.
	builtins *builtins
	// reg holds every behavior, for commands that submit and inspect but
	// run nothing; servers build their own (see serverRegistry).
	reg *spi.Registry
	// postgresBinDir finds the PostgreSQL server binaries for dev,
	// installing them where it can: pgcluster.EnsureBinDir.
	postgresBinDir func(context.Context) (string, error)
}

// newCLI returns the shared state of one run of the command line of the
// program name, with the program's behaviors (nil for none) besides the
// built-in ones.
func newCLI(name string, stdout, stderr io.Writer, behaviors *spi.Registry) (*cli, error) {
	c := &cli{name: name, stdout: stdout, stderr: stderr, level: new(slog.LevelVar), behaviors: behaviors,
		postgresBinDir: pgcluster.EnsureBinDir}
	c.log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: c.level}))
	c.builtins = &builtins{log: c.log}
	reg, err := c.builtins.registry(nil, behaviors)
	if err != nil {
		return nil, err
	}
	c.reg = reg
	return c, nil
}

// serverRegistry returns a registry of every behavior for a server on st.
func (c *cli) serverRegistry(st *postgres.Store) (*spi.Registry, error) {
	return c.builtins.registry(st, c.behaviors)
}

// newRootCmd returns the stint command tree. Errors returned by its
// commands carry their exit code (see exitCode).
func (c *cli) newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "stint",
		Short: "stint runs durable tasks on PostgreSQL",
		Long: `stint runs durable tasks on PostgreSQL: services submit tasks and await their
results, server nodes claim and run them.

Start with 'stint dev', which runs PostgreSQL and a server node locally.
Every command except dev takes --db URL (default: $` + envDatabaseURL + `);
server, submit, stats and tasks ls|show|wait also take --read-db URL (default:
$` + envReadDatabaseURL + `), a hot standby that serves their reads.

Exit codes: 0 success, 1 failure (an operation the state of its task or
workflow does not allow included: nothing changed), 2 bad input (nothing was
stored), 130 when Ctrl-C stopped a wait (what was awaited runs on).`,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
	}
	root.SetOut(c.stdout)
	root.SetErr(c.stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		if cmd.HasSubCommands() {
			// The words before the flag that failed: a mistyped command
			// is the error to report, not the flag it does not take.
			if args := cmd.Flags().Args(); len(args) > 0 {
				return unknownCommand(cmd, args[0])
			}
		}
		return &exitError{code: exitUsage, err: err}
	})
	root.PersistentFlags().Var((*levelFlag)(c.level), "log-level", "log level: debug, info, warn or error")

	root.AddCommand(
		c.newDevCmd(),
		c.newServerCmd(),
		c.newMigrateCmd(),
		c.newSubmitCmd(),
		c.newTasksCmd(),
		c.newEventsCmd(),
		c.newSignalCmd(),
		c.newNodesCmd(),
		c.newSchedulesCmd(),
		c.newLimitsCmd(),
		c.newBehaviorsCmd(),
		c.newGroupsCmd(),
		c.newStatsCmd(),
		c.newIngestCmd(), c.newBatchesCmd(),
		c.newReplicationsCmd(),
		c.newWorkflowsCmd(),
		c.newVersionCmd(),
	)
	if text, err := versionText(); err == nil {
		root.Version = text
		root.SetVersionTemplate(text)
	}
	classifyErrors(root)
	checkCommands(root)
	nameProgram(root, c.name)
	return root
}

// checkCommands makes cmd and every command below it that holds commands
// refuse an argument that names none of them (see unknownCommand).
func checkCommands(cmd *cobra.Command) {
	cmd.SuggestionsMinimumDistance = 1 // a typo of one letter; "ls" is no typo of "up"
	cmd.Args = func(cmd *cobra.Command, args []string) error {
		if len(args) > 0 {
			return unknownCommand(cmd, args[0])
		}
		return nil
	}
	for _, sub := range cmd.Commands() {
		if sub.HasSubCommands() {
			checkCommands(sub)
		}
	}
}

// unknownCommand is the usage error for a word that names no command of
// cmd: it names the word, a close command if there is one, and below the
// root the commands cmd holds.
func unknownCommand(cmd *cobra.Command, word string) error {
	msg := fmt.Sprintf("unknown command %q for %q", word, cmd.CommandPath())
	if cmd.HasParent() {
		var names []string
		for _, sub := range cmd.Commands() {
			if sub.IsAvailableCommand() {
				names = append(names, sub.Name())
			}
		}
		msg += " (its commands: " + strings.Join(names, ", ") + ")"
	}
	if s := cmd.SuggestionsFor(word); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return usageErrorf("%s", msg)
}

// commandLine matches the program's name where help text shows a command
// line: "stint" before one of its commands or at the start of a line.
var commandLine = regexp.MustCompile(`(^|[\s'"` + "`" + `(])stint( (?:dev|server|migrate|submit|tasks|events|signal|nodes|schedules|limits|behaviors|groups|stats|ingest|batches|replications|workflows|version)\b|\s|$)`)

// nameProgram renames the program in the help of root and its
// descendants, written for stint, to name: the command path, and every
// command line of the help text. The framework keeps its name where the
// text is about it ("the stint database").
func nameProgram(root *cobra.Command, name string) {
	if name == "stint" {
		return
	}
	root.Use = name
	var walk func(*cobra.Command)
	walk = func(cmd *cobra.Command) {
		for _, s := range []*string{&cmd.Short, &cmd.Long, &cmd.Example} {
			*s = commandLine.ReplaceAllString(*s, "${1}"+name+"${2}")
		}
		for _, sub := range cmd.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// classifyErrors wraps the RunE of cmd and its descendants so that every
// error they return carries an exit code.
func classifyErrors(cmd *cobra.Command) {
	if run := cmd.RunE; run != nil {
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			return classify(run(cmd, args))
		}
	}
	for _, sub := range cmd.Commands() {
		classifyErrors(sub)
	}
}

// levelFlag is a pflag.Value that sets a slog.LevelVar.
type levelFlag slog.LevelVar

var _ pflag.Value = (*levelFlag)(nil)

// String returns the level's name.
func (l *levelFlag) String() string { return strings.ToLower((*slog.LevelVar)(l).Level().String()) }

// Set parses a level name such as "debug".
func (l *levelFlag) Set(s string) error {
	if err := (*slog.LevelVar)(l).UnmarshalText([]byte(s)); err != nil {
		return errors.New("want debug, info, warn or error")
	}
	return nil
}

// Type names the flag's value in the help.
func (l *levelFlag) Type() string { return "level" }

// dbFlag is the --db flag of a command, and its --read-db if it has one.
type dbFlag struct {
	value    string
	read     string
	readable bool // the command has --read-db
}

// addDBFlag adds --db to cmd. Its default, $STINT_DATABASE_URL, is read
// when the command runs, so that help never shows a URL with a password.
func addDBFlag(cmd *cobra.Command) *dbFlag {
	f := &dbFlag{}
	cmd.Flags().StringVar(&f.value, "db", "", "PostgreSQL URL of the stint database (default $"+envDatabaseURL+")")
	return f
}

// URL returns the database URL: the flag's value, else the environment's.
// It is a usage error when there is none or it is malformed.
func (f *dbFlag) URL() (string, error) {
	dsn := f.value
	if dsn == "" {
		dsn = os.Getenv(envDatabaseURL)
	}
	if dsn == "" {
		return "", usageErrorf("no database: pass --db URL or set %s", envDatabaseURL)
	}
	if _, err := pgx.ParseConfig(dsn); err != nil {
		return "", usageErrorf("--db: %w", err)
	}
	return dsn, nil
}

// addReadDBFlag adds --read-db to cmd, whose --db is f: a hot standby of
// the database that serves the command's reads that may lag (see
// postgres.ReadDSN). Its default, $STINT_READ_DATABASE_URL, is read when
// the command runs; with neither, every read goes to --db.
func addReadDBFlag(cmd *cobra.Command, f *dbFlag) {
	f.readable = true
	cmd.Flags().StringVar(&f.read, "read-db", "", "PostgreSQL URL of a hot standby of the database, for reads (default $"+envReadDatabaseURL+"; none: every read on --db)")
}

// ReadURL returns the standby's URL, or "" when the command has no
// --read-db or none is set. A malformed one is a usage error.
func (f *dbFlag) ReadURL() (string, error) {
	if !f.readable {
		return "", nil
	}
	dsn := f.read
	if dsn == "" {
		dsn = os.Getenv(envReadDatabaseURL)
	}
	if strings.TrimSpace(dsn) == "" {
		return "", nil
	}
	if _, err := pgx.ParseConfig(dsn); err != nil {
		return "", usageErrorf("--read-db: %w", err)
	}
	return dsn, nil
}

// openStore opens the store at the database db names, with opts, reading
// from its --read-db standby if one is set.
func (c *cli) openStore(ctx context.Context, db *dbFlag, opts ...postgres.Option) (*postgres.Store, error) {
	dsn, err := db.URL()
	if err != nil {
		return nil, err
	}
	read, err := db.ReadURL()
	if err != nil {
		return nil, err
	}
	if read != "" {
		opts = append(opts, postgres.ReadDSN(read))
	}
	c.builtins.setDatabase(dsn) // the built-in behaviors work on it too
	return postgres.Open(ctx, dsn, opts...)
}

// openClient opens the store at the database db names and a client-only
// api.Tasks on it with every built-in behavior. close releases both.
func (c *cli) openClient(ctx context.Context, db *dbFlag) (client *impl.Client, close func(), err error) {
	st, err := c.openStore(ctx, db, postgres.MaxConns(4))
	if err != nil {
		return nil, nil, err
	}
	client, err = impl.NewClient(st, impl.ClientConfig{Registry: c.reg, Logger: c.log})
	if err != nil {
		st.Close()
		return nil, nil, fmt.Errorf("create client: %w", err)
	}
	return client, func() { client.Close(); st.Close() }, nil
}

// schemaHint adds advice to an error caused by a missing stint table.
func (c *cli) schemaHint(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return fmt.Errorf("%w (is the schema migrated? run '%s migrate up --db URL')", err, c.name)
	}
	return err
}
