package main

// Child processes: the scale scenario's node processes, the client
// processes that submit bursts, and Graphile Worker's Node.js processes all
// speak one line protocol on their standard input and output:
//
//	child -> "ready"          set up, waiting for commands
//	bench -> "go"             start working (worker processes)
//	bench -> "add N CHUNK"    submit N no-op tasks, CHUNK per batch call
//	child -> "ok" | "error MESSAGE"   the answer to an add
//	child -> "ran N"          (Graphile Worker) N tasks run so far
//	child -> "span START END" (a node process of the flow-control scenarios,
//	                          as it stops) one run of a sleeping task, in
//	                          Unix nanoseconds
//
// Closing the child's standard input stops it: it lets its runs finish and
// exits.

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// clientCommand is the hidden subcommand that runs one client process for
// stint or River: `stint-bench client --system stint|river --dsn DSN`. It
// only submits, on "add" commands.
const clientCommand = "client"

// child is a running child process.
type child struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	answers chan string // "ok", "ok ..." and "error ..." lines
	exited  chan error
	done    chan struct{} // closed when the process has exited
	err     error         // the exit, once done is closed
	spans   []span        // the "span" lines, complete once done is closed
}

// startChild starts cmd and waits until it prints "ready". onRan, if not
// nil, is called with N for each "ran N" line.
func startChild(ctx context.Context, cmd *exec.Cmd, onRan func(int64)) (*child, error) {
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("child stdin: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("child stdout: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	p := &child{cmd: cmd, stdin: stdin, answers: make(chan string, 16), done: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		// An answer may carry a run's latency samples.
		sc.Buffer(make([]byte, 64<<10), 64<<20)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "ready":
				close(ready)
			case strings.HasPrefix(line, "ran "):
				if n, err := strconv.ParseInt(line[len("ran "):], 10, 64); err == nil && onRan != nil {
					onRan(n)
				}
			case line == "ok" || strings.HasPrefix(line, "ok ") || strings.HasPrefix(line, "error"):
				p.answers <- line
			case strings.HasPrefix(line, "span "):
				if s, ok := parseSpan(line); ok {
					p.spans = append(p.spans, s)
				}
			}
		}
		p.err = cmd.Wait()
		close(p.done)
	}()
	select {
	case <-ready:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("child process %d (%s) exited before it was ready: %v", cmd.Process.Pid, cmd.Path, p.err)
	case <-ctx.Done():
		p.kill()
		return nil, fmt.Errorf("wait for child process: %w", ctx.Err())
	case <-time.After(2 * time.Minute):
		p.kill()
		return nil, fmt.Errorf("child process %d (%s) not ready after two minutes", cmd.Process.Pid, cmd.Path)
	}
}

// startSelf re-executes this binary as a child running subcommand.
func startSelf(ctx context.Context, subcommand string, args []string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find the bench binary: %w", err)
	}
	cmd := exec.Command(exe, append([]string{subcommand}, args...)...)
	cmd.Env = append(os.Environ(), envNode+"=1")
	return startChild(ctx, cmd, nil)
}

// start tells the child to start working.
func (p *child) start() error {
	if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
		return fmt.Errorf("start child process %d: %w", p.cmd.Process.Pid, err)
	}
	return nil
}

// add has the child submit n tasks in batch calls of chunk each and waits
// for it to answer.
func (p *child) add(ctx context.Context, n, chunk int) error {
	_, err := p.ask(ctx, fmt.Sprintf("add %d %d", n, chunk))
	return err
}

// ask sends the child the command line and waits for its answer: the
// text after "ok", or an error with the text after "error".
func (p *child) ask(ctx context.Context, line string) (string, error) {
	if _, err := fmt.Fprintln(p.stdin, line); err != nil {
		return "", fmt.Errorf("child process %d: send %q: %w", p.cmd.Process.Pid, line, err)
	}
	select {
	case a := <-p.answers:
		if rest, ok := strings.CutPrefix(a, "ok"); ok {
			return strings.TrimPrefix(rest, " "), nil
		}
		return "", fmt.Errorf("child process %d: %s: %s", p.cmd.Process.Pid, line, strings.TrimPrefix(strings.TrimPrefix(a, "error"), " "))
	case <-p.done:
		return "", fmt.Errorf("child process %d exited during %q: %v", p.cmd.Process.Pid, line, p.err)
	case <-ctx.Done():
		return "", fmt.Errorf("child process %d: %s: %w", p.cmd.Process.Pid, line, ctx.Err())
	}
}

// stop closes the child's stdin, which stops it, and waits for it to exit.
func (p *child) stop(timeout time.Duration) error {
	_ = p.stdin.Close()
	select {
	case <-p.done:
		if p.err != nil {
			return fmt.Errorf("child process %d: %w", p.cmd.Process.Pid, p.err)
		}
		return nil
	case <-time.After(timeout):
		p.kill()
		return fmt.Errorf("child process %d did not stop within %s", p.cmd.Process.Pid, timeout)
	}
}

// kill ends the child process if it still runs.
func (p *child) kill() {
	_ = p.stdin.Close()
	_ = p.cmd.Process.Kill() // an error only says it has exited already
}

// serveAdds answers the "add N CHUNK" lines of in with insert, until in
// ends; other lines are ignored.
func serveAdds(ctx context.Context, in *bufio.Scanner, out io.Writer, insert func(context.Context, int) error) {
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) != 3 || f[0] != "add" {
			continue
		}
		n, err1 := strconv.Atoi(f[1])
		chunk, err2 := strconv.Atoi(f[2])
		if err := errors.Join(err1, err2); err != nil || n <= 0 || chunk <= 0 {
			fmt.Fprintf(out, "error bad add command %q\n", in.Text())
			continue
		}
		err := addChunks(ctx, n, chunk, insert)
		if err != nil {
			fmt.Fprintf(out, "error %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
			continue
		}
		fmt.Fprintln(out, "ok")
	}
}

// addChunks calls insert for n tasks in chunks of chunk.
func addChunks(ctx context.Context, n, chunk int, insert func(context.Context, int) error) error {
	for left := n; left > 0; {
		k := min(left, chunk)
		if err := insert(ctx, k); err != nil {
			return err
		}
		left -= k
	}
	return nil
}

// parseChildFlags parses the flags of a node or client process: the
// system, its database, the systems' tuning and those extra adds.
func parseChildFlags(command string, args []string, extra func(*flag.FlagSet)) (cfg config, system, dsn string, err error) {
	cfg = defaultConfig()
	fs := flag.NewFlagSet(command, flag.ContinueOnError)
	fs.StringVar(&system, "system", sysStint, "stint or river")
	fs.StringVar(&dsn, "dsn", "", "database")
	cfg.addSystemFlags(fs)
	cfg.flow.addBehaviorFlags(fs)
	fs.BoolVar(&cfg.flowNode, "flow", false, "register the flow-control behaviors")
	fs.BoolVar(&cfg.verbose, "v", false, "")
	if extra != nil {
		extra(fs)
	}
	err = fs.Parse(args)
	return cfg, system, dsn, err
}

// childLogger logs a child's errors, and its warnings too when verbose.
func childLogger(verbose bool) *slog.Logger {
	level := slog.LevelError
	if verbose {
		level = slog.LevelWarn
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// clientMain runs a client process; see clientCommand.
func clientMain(args []string) int {
	cfg, system, dsn, err := parseChildFlags(clientCommand, args, nil)
	if err != nil {
		return 2
	}
	ctx := context.Background()
	log := childLogger(cfg.verbose)
	var h harness
	switch system {
	case sysStint:
		h, err = newStint(ctx, dsn, cfg, log, stintOptions{client: true})
	case sysRiver:
		h, err = newRiver(ctx, dsn, cfg, log, riverOptions{inserter: true})
	default:
		err = fmt.Errorf("unknown system %q", system)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "stint-bench client: %v\n", err)
		return 1
	}
	defer h.close()
	fmt.Println("ready")
	serveAdds(ctx, bufio.NewScanner(os.Stdin), os.Stdout, h.insert)
	return 0
}
