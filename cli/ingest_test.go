package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/internal/smtptest"
)

func TestIngestSubmitAndBatchesShow(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)
	files := map[string]string{"/a.txt": "alpha", "/b.txt": "bravo"}
	fs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, body)
	}))
	t.Cleanup(fs.Close)
	sum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	manifest := filepath.Join(t.TempDir(), "objects.checkm")
	require.NoError(t, os.WriteFile(manifest, fmt.Appendf(nil,
		"%s/a.txt | sha256 | %s | 5 | a.txt | obj-1\n%s/b.txt | sha256 | %s | 5 | b.txt | obj-2\n",
		fs.URL, sum("alpha"), fs.URL, sum("bravo")), 0o644))

	// A bad manifest is refused before anything is stored.
	bad := filepath.Join(t.TempDir(), "bad.checkm")
	require.NoError(t, os.WriteFile(bad, []byte("ftp://nope/x | crc | 1\n"), 0o644))
	r := runCLI(ctx, "ingest", "submit", "--profile", "p1", "--submitter", "me", "--manifest", bad, "--db", dsn)
	require.Equal(t, exitUsage, r.code, r.stderr)
	require.Contains(t, r.stderr, "line 1")

	startServer(t, ctx, dsn, "node-ingest")
	r = runCLI(ctx, "ingest", "submit", "--profile", "p1", "--submitter", "me", "--manifest", manifest, "--wait", "--json", "--db", dsn)
	requireOK(t, r)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, 2, "the submission, then the finished batch")
	var sub struct{ ID string }
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &sub))
	var done struct {
		Status string
		Result struct {
			Report struct {
				Jobs      int
				Succeeded []string
				Failed    []string
			}
		}
	}
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &done))
	require.Equal(t, "success", done.Status)
	require.Equal(t, 2, done.Result.Report.Jobs)
	require.Len(t, done.Result.Report.Succeeded, 2)
	require.Empty(t, done.Result.Report.Failed)

	r = runCLI(ctx, "batches", "show", sub.ID, "--db", dsn)
	requireOK(t, r)
	require.Regexp(t, `(?i)completed`, r.stdout)
	require.Contains(t, r.stdout, sub.ID+"/j00000")
	r = runCLI(ctx, "batches", "ls", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, sub.ID)

	// An action the batch's state does not allow says why, once.
	r = runCLI(ctx, "ingest", "requeue", sub.ID, "--db", dsn)
	require.Equal(t, exitFailure, r.code, r.stderr)
	require.Equal(t, "stint: error: requeue of batch "+sub.ID+" that is Completed, not Failed\n", r.stderr)

	// A failed batch names its failed jobs' errors and where to see more.
	wrong := filepath.Join(t.TempDir(), "wrong.checkm")
	require.NoError(t, os.WriteFile(wrong, fmt.Appendf(nil, "%s/a.txt | sha256 | %s | 5 | a.txt | obj-1\n",
		fs.URL, sum("not alpha")), 0o644))
	r = runCLI(ctx, "ingest", "submit", "--profile", "p1", "--submitter", "me", "--manifest", wrong, "--wait", "--db", dsn)
	require.Equal(t, exitFailure, r.code, r.stderr)
	require.Regexp(t, `(?m)^  job \S+/j00000: .*digest_mismatch.*a\.txt`, r.stdout)
	require.Regexp(t, `(?m)^see every job: stint batches show \S+$`, r.stdout)
	r = runCLI(ctx, "batches", "ls", "--json", "--db", dsn)
	requireOK(t, r)
	require.Contains(t, r.stdout, `"p1"`)
}

// TestIngestSubmitBadFlagsNameTheFlags: bad batch input is reported in the
// command line's terms (flags, not the JSON fields they fill) before any
// database is involved.
func TestIngestSubmitBadFlagsNameTheFlags(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	const db = "postgres://nobody@127.0.0.1:1/none"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--profile", "p", "--submitter", "me"}, "stint: error: invalid batch: --url or --manifest: one of them is required\n"},
		{[]string{"--submitter", "me", "--url", "http://x/y"}, `stint: error: invalid batch: --profile "": want 1 to 128 characters`},
		{[]string{"--profile", "p", "--submitter", "me", "--url", "ftp://x"}, `stint: error: invalid batch: --url: URL "ftp://x": scheme "ftp" is not allowed`},
		{[]string{"--profile", "p", "--url", "http://x/y"}, "stint: error: invalid --submitter: is required\n"},
		{[]string{"--profile", "p", "--submitter", "me", "--url", "http://x/y", "--priority", "40000"}, "stint: error: invalid --priority: must be at most 32767\n"},
	} {
		r := runCLI(ctx, append(append([]string{"ingest", "submit"}, tc.args...), "--db", db)...)
		require.Equal(t, exitUsage, r.code, r.stderr)
		require.True(t, strings.HasPrefix(r.stderr, tc.want), "%v: got %q", tc.args, r.stderr)
		require.NotContains(t, r.stderr, "JSON")
	}
}

// TestIngestServerSettingsFromTheEnvironment: a server configured by the
// environment mails a profile's depositors through a real SMTP server and
// lowers the priority of large jobs; `batches show` shows the notices, the
// priorities and the local ids. Not parallel: it sets the environment.
func TestIngestServerSettingsFromTheEnvironment(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	dsn := pgtest.New(t)
	mb := smtptest.Start(t)
	fs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "a large object") }))
	t.Cleanup(fs.Close)
	profiles := filepath.Join(t.TempDir(), "profiles.json")
	require.NoError(t, os.WriteFile(profiles, []byte(`{"p2": {"notify": ["dep@example.org", "not an address"]}}`), 0o644))
	t.Setenv(envIngestProfiles, profiles)
	t.Setenv(envIngestSMTP, "smtp://"+mb.Addr+"?from=queue@example.org")
	t.Setenv(envIngestLargeBytes, "10")
	t.Setenv(envIngestLargePriority, "11")
	manifest := filepath.Join(t.TempDir(), "objects.checkm")
	require.NoError(t, os.WriteFile(manifest, fmt.Appendf(nil, "%s/big.txt | | | | big.txt | obj-9\n", fs.URL), 0o644))

	startServer(t, ctx, dsn, "node-settings")
	r := runCLI(ctx, "ingest", "submit", "--profile", "p2", "--submitter", "me", "--manifest", manifest, "--wait", "--json", "--db", dsn)
	requireOK(t, r)
	var sub struct{ ID string }
	require.NoError(t, json.Unmarshal([]byte(strings.Split(r.stdout, "\n")[0]), &sub))

	mails := mb.Mails()
	require.Len(t, mails, 2, "queued and report")
	for _, m := range mails {
		require.Equal(t, []string{"dep@example.org"}, m.To, "the bad address was dropped")
		require.Contains(t, m.Header.Get("Subject"), sub.ID)
	}
	r = runCLI(ctx, "batches", "show", sub.ID, "--db", dsn)
	requireOK(t, r)
	require.Regexp(t, `(?m)^notice:\s+queued: sent `, r.stdout)
	require.Regexp(t, `(?m)^notice:\s+report: sent `, r.stdout)
	require.Regexp(t, `(?m)^`+regexp.QuoteMeta(sub.ID)+`/j00000\s+Completed\s+\S+\s+0\s+11\s+obj-9\s+ark:/`, r.stdout)
}
