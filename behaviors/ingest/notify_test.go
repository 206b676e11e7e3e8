package ingest_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/ingest"
	"github.com/stinthq/stint/internal/smtptest"
	"github.com/stinthq/stint/spi"
)

// notifyingServer starts a node that mails the depositors of profile coll
// through the mailbox.
func (e *tenv) notifyingServer(mb *smtptest.Server, to ...string) {
	e.t.Helper()
	n, err := ingest.NewSMTPNotifier(ingest.SMTPConfig{Addr: mb.Addr, From: "Ingest Queue <queue@example.org>"})
	require.NoError(e.t, err)
	e.server("node", func(cfg *ingest.Config) {
		cfg.Notifier = n
		p := cfg.Profiles["coll"]
		p.Notify = to
		cfg.Profiles["coll"] = p
	})
}

// TestNotificationsByMail: a batch's depositors get a mail when it is
// queued and one with its report, from a real SMTP server's point of view.
func TestNotificationsByMail(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	mb := smtptest.Start(t)
	e.notifyingServer(mb, "depositor@example.org", "Cora Curator <curator@example.org>")
	missing := e.fileLine("o2", "gone.txt", "", []byte("gone"))
	e.fs.setStatus("/files/o2/gone.txt", 404)
	batch := e.submit(manifest(e.fileLine("o1", "a.txt", "md5", []byte("a")), missing))
	bt := e.await(batch)
	require.Equal(t, api.StatusFailure, bt.Status)

	mails := mb.Mails()
	require.Len(t, mails, 2)
	for _, m := range mails {
		require.Equal(t, "queue@example.org", m.From)
		require.Equal(t, []string{"depositor@example.org", "curator@example.org"}, m.To)
		require.Equal(t, `"Ingest Queue" <queue@example.org>`, m.Header.Get("From"))
		to, err := m.Header.AddressList("To")
		require.NoError(t, err)
		require.Len(t, to, 2)
		require.Equal(t, "Cora Curator", to[1].Name)
		require.Contains(t, m.Body, "Submitter: tester")
		require.Contains(t, m.Body, "Profile:   coll")
	}
	queued, report := mails[0], mails[1]
	require.Equal(t, "Ingest batch "+string(batch)+" queued: 2 objects", queued.Header.Get("Subject"))
	require.Contains(t, queued.Body, "The batch was queued")
	require.Equal(t, "Ingest batch "+string(batch)+" failed: 1 of 2 objects failed", report.Header.Get("Subject"))
	require.Contains(t, report.Body, "Failed jobs:\r\n  "+string(ingest.JobID(batch, 1)))
	require.Contains(t, report.Body, "Ingested jobs:\r\n  "+string(ingest.JobID(batch, 0)))

	bv := e.batchView(batch)
	require.Len(t, bv.Notices, 2)
	require.Equal(t, ingest.NoticeQueued, bv.Notices[0].Kind)
	require.Equal(t, ingest.NoticeReport, bv.Notices[1].Kind)
	require.Empty(t, bv.Notices[0].Error)
	require.Empty(t, bv.Notices[1].Error)
}

// TestFailedNotificationDoesNotFailTheBatch: the SMTP server refuses the
// recipient; the batch completes all the same and records the failures.
func TestFailedNotificationDoesNotFailTheBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	mb := smtptest.Start(t, "nobody@example.org")
	e.notifyingServer(mb, "nobody@example.org")
	batch := e.submit(manifest(e.fileLine("o1", "a.txt", "", []byte("a"))))
	bt := e.await(batch)
	require.Equal(t, api.StatusSuccess, bt.Status, "batch error: %v", bt.Error)
	require.Empty(t, mb.Mails())
	bv := e.batchView(batch)
	require.Equal(t, ingest.BatchCompleted, bv.Status)
	require.Len(t, bv.Notices, 2)
	for _, n := range bv.Notices {
		require.Contains(t, n.Error, "nobody@example.org")
		require.Contains(t, n.Error, "no such mailbox")
	}
}

// TestNotifierSettings: bad SMTP settings and notify addresses are
// refused with an error that names them.
func TestNotifierSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  ingest.SMTPConfig
		want string
	}{
		{ingest.SMTPConfig{Addr: "", From: "a@example.org"}, "want host:port"},
		{ingest.SMTPConfig{Addr: "mail.example.org", From: "a@example.org"}, "want host:port"},
		{ingest.SMTPConfig{Addr: ":25", From: "a@example.org"}, "want host:port"},
		{ingest.SMTPConfig{Addr: "mail.example.org:0", From: "a@example.org"}, "port"},
		{ingest.SMTPConfig{Addr: "mail.example.org:smtp", From: "a@example.org"}, "port"},
		{ingest.SMTPConfig{Addr: "mail.example.org:25", From: ""}, "smtp sender"},
		{ingest.SMTPConfig{Addr: "mail.example.org:25", From: "not an address"}, "smtp sender"},
	} {
		_, err := ingest.NewSMTPNotifier(tc.cfg)
		require.ErrorContains(t, err, tc.want, "%+v", tc.cfg)
	}
	for _, raw := range []string{"mail.example.org:25", "http://mail.example.org:25?from=a@example.org",
		"smtp://mail.example.org:25", "smtp://mail.example.org:25?from=a@example.org&tls=no", "smtp:opaque"} {
		_, err := ingest.ParseSMTPURL(raw)
		require.Error(t, err, raw)
		require.ErrorContains(t, err, "smtp URL", raw)
	}
	cfg, err := ingest.ParseSMTPURL("smtp://user:secret@mail.example.org:587?from=queue@example.org")
	require.NoError(t, err)
	require.Equal(t, ingest.SMTPConfig{Addr: "mail.example.org:587", From: "queue@example.org", Username: "user", Password: "secret"}, cfg)

	err = ingest.Register(spi.NewRegistry(), ingest.Config{WorkDir: t.TempDir(), StorageDir: t.TempDir(),
		OpenPool: func(context.Context) (*pgxpool.Pool, error) { return nil, errors.New("not opened") },
		Profiles: map[string]ingest.Profile{"coll": {Notify: []string{"ok@example.org", "broken"}}}})
	require.ErrorContains(t, err, `profile coll: notify address "broken"`)
	require.True(t, strings.HasPrefix(err.Error(), "register ingest"))
}
