package ingest_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/mail"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/ingest"
	"github.com/stinthq/stint/spi"
)

// mailbox is a real SMTP server on a local port that keeps the mails it
// receives. Recipients in reject are refused at RCPT.
type mailbox struct {
	addr   string
	mu     sync.Mutex
	mails  []received
	reject map[string]bool
}

// received is one delivered mail: its envelope and its parsed message.
type received struct {
	from string
	to   []string
	msg  *mail.Message
	body string
}

func newMailbox(t *testing.T, reject ...string) *mailbox {
	t.Helper()
	mb := &mailbox{reject: map[string]bool{}}
	for _, r := range reject {
		mb.reject[r] = true
	}
	srv := smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) { return &mailSession{mb: mb}, nil }))
	srv.Domain = "localhost"
	srv.ReadTimeout, srv.WriteTimeout = time.Minute, time.Minute
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	mb.addr = l.Addr().String()
	return mb
}

func (mb *mailbox) received() []received {
	mb.mu.Lock()
	defer mb.mu.Unlock()
	return append([]received(nil), mb.mails...)
}

// mailSession is one SMTP session of a mailbox.
type mailSession struct {
	mb   *mailbox
	from string
	to   []string
}

func (s *mailSession) Reset()        { s.from, s.to = "", nil }
func (s *mailSession) Logout() error { return nil }
func (s *mailSession) Mail(from string, _ *smtp.MailOptions) error {
	s.from = from
	return nil
}

func (s *mailSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	if s.mb.reject[to] {
		return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such mailbox"}
	}
	s.to = append(s.to, to)
	return nil
}

func (s *mailSession) Data(r io.Reader) error {
	msg, err := mail.ReadMessage(r)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(msg.Body)
	if err != nil {
		return err
	}
	s.mb.mu.Lock()
	defer s.mb.mu.Unlock()
	s.mb.mails = append(s.mb.mails, received{from: s.from, to: s.to, msg: msg, body: string(body)})
	return nil
}

// notifyingServer starts a node that mails the depositors of profile coll
// through the mailbox.
func (e *tenv) notifyingServer(mb *mailbox, to ...string) {
	e.t.Helper()
	n, err := ingest.NewSMTPNotifier(ingest.SMTPConfig{Addr: mb.addr, From: "Ingest Queue <queue@example.org>"})
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
	mb := newMailbox(t)
	e.notifyingServer(mb, "depositor@example.org", "Cora Curator <curator@example.org>")
	missing := e.fileLine("o2", "gone.txt", "", []byte("gone"))
	e.fs.setStatus("/files/o2/gone.txt", 404)
	batch := e.submit(manifest(e.fileLine("o1", "a.txt", "md5", []byte("a")), missing))
	bt := e.await(batch)
	require.Equal(t, api.StatusFailure, bt.Status)

	mails := mb.received()
	require.Len(t, mails, 2)
	for _, m := range mails {
		require.Equal(t, "queue@example.org", m.from)
		require.Equal(t, []string{"depositor@example.org", "curator@example.org"}, m.to)
		require.Equal(t, `"Ingest Queue" <queue@example.org>`, m.msg.Header.Get("From"))
		to, err := m.msg.Header.AddressList("To")
		require.NoError(t, err)
		require.Len(t, to, 2)
		require.Equal(t, "Cora Curator", to[1].Name)
		require.Contains(t, m.body, "Submitter: tester")
		require.Contains(t, m.body, "Profile:   coll")
	}
	queued, report := mails[0], mails[1]
	require.Equal(t, "Ingest batch "+string(batch)+" queued: 2 objects", queued.msg.Header.Get("Subject"))
	require.Contains(t, queued.body, "The batch was queued")
	require.Equal(t, "Ingest batch "+string(batch)+" failed: 1 of 2 objects failed", report.msg.Header.Get("Subject"))
	require.Contains(t, report.body, "Failed jobs:\r\n  "+string(ingest.JobID(batch, 1)))
	require.Contains(t, report.body, "Ingested jobs:\r\n  "+string(ingest.JobID(batch, 0)))

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
	mb := newMailbox(t, "nobody@example.org")
	e.notifyingServer(mb, "nobody@example.org")
	batch := e.submit(manifest(e.fileLine("o1", "a.txt", "", []byte("a"))))
	bt := e.await(batch)
	require.Equal(t, api.StatusSuccess, bt.Status, "batch error: %v", bt.Error)
	require.Empty(t, mb.received())
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
