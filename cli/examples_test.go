package cli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

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
// file named by the line is looked up in dir, and what the stint command
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
		if _, err := os.Stat(filepath.Join(dir, w)); err == nil && !strings.HasPrefix(w, "-") {
			args[i] = filepath.Join(dir, w)
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

// TestWorkflowHelpExamplesRun: the workflow file that `stint workflows
// submit --help` shows, saved as nightly.json, and every example command
// line of the workflows commands' help run as written against a server.
func TestWorkflowHelpExamplesRun(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
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
	require.NoError(t, os.WriteFile(filepath.Join(dir, "nightly.json"), file.Bytes(), 0o600))

	c, err := newCLI("stint", &bytes.Buffer{}, &bytes.Buffer{}, nil)
	require.NoError(t, err)
	t.Cleanup(c.builtins.close)
	workflows, _, err := c.newRootCmd().Find([]string{"workflows"})
	require.NoError(t, err)
	var submits, others []string // the workflow is there before the others run
	for _, sub := range workflows.Commands() {
		for _, line := range strings.Split(sub.Example, "\n") {
			switch line = strings.TrimSpace(line); {
			case line == "":
			case sub.Name() == "submit":
				submits = append(submits, line)
			default:
				others = append(others, line)
			}
		}
	}
	require.NotEmpty(t, submits)
	for _, line := range append(submits, others...) {
		runExample(t, ctx, dir, dsn, line)
	}
	r := runCLI(ctx, "workflows", "show", "nightly-2026-11-27", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, "workflow nightly-2026-11-27: succeeded")
}

// cliBlocks matches the CLI paragraph of docs/workflows.md: the workflow
// file nightly.json, then the command lines.
var cliBlocks = regexp.MustCompile("(?s)From the CLI, with a file `nightly.json`.*?```json\n(.*?)```\n\n```sh\n(.*?)```")

// TestWorkflowDocsExamplesRun: the nightly.json of docs/workflows.md and
// its command lines, run one after the other as written, against a
// database no server works on: the workflow is still running when it is
// listed as running and cancelled.
func TestWorkflowDocsExamplesRun(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	dsn := pgtest.New(t)
	page, err := os.ReadFile("../docs/workflows.md")
	require.NoError(t, err)
	m := cliBlocks.FindStringSubmatch(string(page))
	require.NotNil(t, m, "docs/workflows.md has no CLI paragraph with nightly.json")
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "nightly.json"), []byte(m[1]), 0o600))
	var ran []string
	for _, line := range strings.Split(strings.TrimSpace(m[2]), "\n") {
		r := runExample(t, ctx, dir, dsn, line)
		ran = append(ran, shellWords(t, line)[2])
		if ran[len(ran)-1] == "ls" {
			require.Contains(t, r.stdout, "nightly-2026-11-27", line)
		}
	}
	require.Equal(t, []string{"submit", "ls", "show", "cancel"}, ran)
	r := runCLI(ctx, "workflows", "show", "nightly-2026-11-27", "--format", "json", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, `"state": "cancelled"`)
}
