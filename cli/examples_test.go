package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/internal/syncbuf"
)

// runCLIIn is runCLI reading stdin.
func runCLIIn(ctx context.Context, stdin string, args ...string) result {
	var stdout, stderr syncbuf.Buffer
	code := Run(ctx, args, nil, strings.NewReader(stdin), &stdout, &stderr)
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// shellWords splits a command line as a shell would, for the quoting
// examples use: words apart by spaces, 'single' and "double" quotes.
func shellWords(t *testing.T, line string) []string {
	t.Helper()
	var words []string
	var word strings.Builder
	inWord := false
	var quote rune
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			word.WriteRune(r)
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, word.String())
				word.Reset()
				inWord = false
			}
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	require.Zero(t, quote, "unbalanced quote in %q", line)
	if inWord {
		words = append(words, word.String())
	}
	return words
}

// runExample runs an example command line of the help or the docs, as
// written, in dir against the database at dsn, and fails the test unless
// it succeeds: `cat FILE | stint ...` reads FILE on standard input, a
// file named by the line (FILE, or @FILE) is looked up in dir, and what the stint command
// prints is piped to the rest of the line (`| dot -Tsvg > graph.svg`) when
// that program is installed.
func runExample(t *testing.T, ctx context.Context, dir, dsn, line string) result {
	t.Helper()
	line, _, _ = strings.Cut(line, "#") // a comment
	segments := strings.Split(strings.TrimSpace(line), " | ")
	stdin := ""
	if words := shellWords(t, segments[0]); words[0] == "cat" {
		require.Len(t, words, 2, line)
		raw, err := os.ReadFile(filepath.Join(dir, words[1]))
		require.NoError(t, err, line)
		stdin, segments = string(raw), segments[1:]
	}
	words := shellWords(t, segments[0])
	require.Equal(t, "stint", words[0], line)
	args := words[1:]
	for i, w := range args {
		at, name := "", w
		if rest, ok := strings.CutPrefix(w, "@"); ok { // --params @FILE
			at, name = "@", rest
		}
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil && name != "" && !strings.HasPrefix(name, "-") {
			args[i] = at + filepath.Join(dir, name)
		}
	}
	r := runCLIIn(ctx, stdin, append(args, "--db", dsn)...)
	requireOK(t, r)
	if rest := segments[1:]; len(rest) > 0 {
		tool := shellWords(t, rest[0])[0]
		if _, err := exec.LookPath(tool); err != nil {
			t.Logf("%s is not installed: %q runs up to its pipe", tool, line)
			return r
		}
		cmd := exec.CommandContext(ctx, "sh", "-c", strings.Join(rest, " | "))
		cmd.Dir, cmd.Stdin = dir, strings.NewReader(r.stdout)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s:\n%s", line, out)
	}
	return r
}

// exampleBlock is an indented block of a help text, after a line ending
// in a colon: the workflow file of `workflows submit --help`.
var exampleBlock = regexp.MustCompile(`(?m):\n\n((?:  .*\n)+)\n`)

// helpExamplesSkipped are the help's examples a test cannot run as
// written, each with why.
var helpExamplesSkipped = map[string]string{
	"stint server --db postgres://user@db/stint --node node-1 --workers 200":                              "serves until stopped",
	"stint replications define orders-eu --continuous --params @orders-eu.json":                           "replicates between two databases of its own",
	"stint replications trigger install --dsn postgres://app@src/shop --table public.orders --column chg": "changes a source database of its own",
	"stint signal --workflow release-7 --node approve approval '{\"ok\":true}'":                           "signals a node of a workflow of its own",
}

// TestHelpExamplesRun runs every example command line of the help as
// written, against a server and its database: the workflow file that
// `stint workflows submit --help` shows is nightly.json, params.json,
// event.json and objects.checkm are files of the kind they name. The
// commands that submit run first, so that the others find what they name.
func TestHelpExamplesRun(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 3*time.Minute)
	dsn := pgtest.New(t)
	startServer(t, ctx, dsn, "examples-node")
	dir := t.TempDir()

	help := runCLI(ctx, "workflows", "submit", "--help")
	requireOK(t, help)
	m := exampleBlock.FindStringSubmatch(help.stdout)
	require.NotNil(t, m, help.stdout)
	var file bytes.Buffer
	for _, line := range strings.SplitAfter(m[1], "\n") {
		file.WriteString(strings.TrimPrefix(line, "  "))
	}
	write := func(name string, body []byte) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), body, 0o600))
	}
	write("nightly.json", file.Bytes())
	write("params.json", []byte(`{"text":"hi"}`))
	write("event.json", []byte(`{"type":"payment.succeeded"}`))
	files := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "alpha") }))
	t.Cleanup(files.Close)
	sum := sha256.Sum256([]byte("alpha"))
	write("objects.checkm", fmt.Appendf(nil, "%s/a.txt | sha256 | %x | 5 | a.txt | obj-1\n", files.URL, sum))

	c, err := newCLI("stint", &bytes.Buffer{}, &bytes.Buffer{}, nil)
	require.NoError(t, err)
	t.Cleanup(c.builtins.close)
	var submits, others []string
	var walk func(*cobra.Command)
	walk = func(cmd *cobra.Command) {
		for _, line := range strings.Split(cmd.Example, "\n") {
			switch line = strings.TrimSpace(line); {
			case line == "":
			case helpExamplesSkipped[line] != "":
				t.Logf("not run: %s: it %s", line, helpExamplesSkipped[line])
			case cmd.Name() == "submit":
				submits = append(submits, line)
			default:
				others = append(others, line)
			}
		}
		for _, sub := range cmd.Commands() {
			walk(sub)
		}
	}
	walk(c.newRootCmd())
	require.Contains(t, submits, "stint workflows submit nightly.json --wait")
	for _, line := range append(submits, others...) {
		runExample(t, ctx, dir, dsn, line)
	}
	r := runCLI(ctx, "workflows", "show", "nightly-2026-11-27", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, "workflow nightly-2026-11-27: succeeded")
}

// docsBlock matches a block of shell in README.md or docs/*.md, and
// nightlyFile the workflow file of docs/workflows.md.
var (
	docsBlock   = regexp.MustCompile("(?s)```sh\n(.*?)```")
	nightlyFile = regexp.MustCompile("(?s)From the CLI, with a file `nightly.json`.*?```json\n(.*?)```")
)

// TestDocsExamplesRun runs each block of README.md and docs/*.md made of
// stint command lines alone, one line after the other as written,
// against a database no server works on (a workflow is still running
// when it is listed as running and cancelled); the nightly.json of
// docs/workflows.md is there.
func TestDocsExamplesRun(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)
	dir := t.TempDir()
	page, err := os.ReadFile("../docs/workflows.md")
	require.NoError(t, err)
	m := nightlyFile.FindStringSubmatch(string(page))
	require.NotNil(t, m, "docs/workflows.md has no CLI paragraph with nightly.json")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "nightly.json"), []byte(m[1]), 0o600))

	pages, err := filepath.Glob("../docs/*.md")
	require.NoError(t, err)
	ran := map[string][]string{}
	for _, path := range append([]string{"../README.md"}, pages...) {
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
	blocks:
		for _, b := range docsBlock.FindAllStringSubmatch(string(raw), -1) {
			lines := strings.Split(strings.TrimSpace(b[1]), "\n")
			for _, line := range lines {
				if !strings.HasPrefix(line, "stint ") {
					continue blocks
				}
			}
			for _, line := range lines {
				runExample(t, ctx, dir, dsn, line)
				ran[filepath.Base(path)] = append(ran[filepath.Base(path)], line)
			}
		}
	}
	require.Len(t, ran["workflows.md"], 4, "docs/workflows.md")
	require.Len(t, ran["flow-control.md"], 6, "docs/flow-control.md")
	r := runCLI(ctx, "workflows", "show", "nightly-2026-11-27", "--format", "json", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, `"state": "cancelled"`)
}
