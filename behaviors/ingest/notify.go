package ingest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/mail"
	"net/smtp"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/stinthq/stint/api"
)

// NoticeKind says what a notification tells the depositor.
type NoticeKind string

// The notifications of a batch.
const (
	// NoticeQueued: the batch was accepted and its jobs are queued.
	NoticeQueued NoticeKind = "queued"
	// NoticeReport: the batch's report was made (again, after
	// re-reporting).
	NoticeReport NoticeKind = "report"
)

// Notification is what a Notifier tells the depositor of a batch.
type Notification struct {
	Kind      NoticeKind `json:"kind"`
	BatchID   api.TaskID `json:"batch_id"`
	Profile   string     `json:"profile"`
	Submitter string     `json:"submitter"`
	// To are the addresses of the profile's Notify setting; empty when
	// the profile names none.
	To []string `json:"to,omitempty"`
	// Status is the batch's state: Processing when queued, Completed or
	// Failed with a report.
	Status BatchState `json:"status"`
	// Jobs is the number of jobs (objects) of the batch.
	Jobs int `json:"jobs"`
	// Report is the batch's report; set for NoticeReport.
	Report *Report `json:"report,omitempty"`
}

// Notifier tells depositors about their batches: when a batch is queued
// and when its report is made. Config.Notifier plugs one in; SMTPNotifier
// sends mail.
//
// A notification that fails does not fail the batch: the batch logs the
// error and records it in its progress (BatchProgress.Notices). A
// notification is sent at most once: a batch run that stops between its
// state change and the notification does not send it again.
type Notifier interface {
	Notify(ctx context.Context, n Notification) error
}

// Notice records a notification a batch sent, or failed to send.
type Notice struct {
	Kind NoticeKind `json:"kind"`
	At   time.Time  `json:"at"`
	// Error is why the notification failed; empty when it was sent.
	Error string `json:"error,omitempty"`
}

// notify tells the depositor through the configured notifier, if any,
// and records the outcome in the batch's progress. It never fails the
// batch: an error is logged and recorded.
func (r *batchRun) notify(ctx context.Context, kind NoticeKind) error {
	n := r.env.cfg.Notifier
	if n == nil {
		return nil
	}
	note := Notification{Kind: kind, BatchID: r.id, Profile: r.params.Profile, Submitter: r.params.Submitter,
		To: r.env.cfg.Profiles[r.params.Profile].Notify, Status: r.prog.state(), Jobs: r.prog.Jobs}
	if kind == NoticeReport {
		note.Report = r.prog.Report
	}
	rec := Notice{Kind: kind}
	if err := n.Notify(ctx, note); err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		rec.Error = err.Error()
		r.env.log.Warn("ingest: notifying the depositor failed; the batch goes on", "batch", r.id,
			"notice", kind, "err", err)
	}
	rec.At = time.Now().UTC()
	r.prog.Notices = append(r.prog.Notices, rec)
	if len(r.prog.Notices) > maxHistory {
		r.prog.Notices = r.prog.Notices[len(r.prog.Notices)-maxHistory:]
	}
	return r.rc.Checkpoint(ctx, r.prog)
}

// SMTPConfig configures an SMTPNotifier.
type SMTPConfig struct {
	// Addr is the SMTP server's host:port. Required.
	Addr string
	// From is the sender's address. Required.
	From string
	// Username and Password authenticate with PLAIN, which net/smtp
	// allows only over TLS or to localhost. Empty: no authentication.
	Username, Password string
	// Timeout bounds the delivery of one mail. Defaults to 30 seconds.
	Timeout time.Duration
}

// SMTPNotifier is a Notifier that mails the profile's Notify addresses.
// It uses STARTTLS when the server offers it. A notification without
// addresses sends nothing.
type SMTPNotifier struct {
	cfg  SMTPConfig
	host string
	from *mail.Address
}

// NewSMTPNotifier checks cfg and returns its notifier. A bad address or
// sender is an error naming it.
func NewSMTPNotifier(cfg SMTPConfig) (*SMTPNotifier, error) {
	host, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil || host == "" {
		return nil, fmt.Errorf("smtp server %q: want host:port", cfg.Addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return nil, fmt.Errorf("smtp server %q: port %q is not a number from 1 to 65535", cfg.Addr, port)
	}
	from, err := mail.ParseAddress(cfg.From)
	if err != nil {
		return nil, fmt.Errorf("smtp sender %q: %w", cfg.From, err)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	return &SMTPNotifier{cfg: cfg, host: host, from: from}, nil
}

// ParseSMTPURL returns the SMTPConfig of a URL
// smtp://[user:password@]host:port?from=ADDRESS, the form the command line
// takes.
func ParseSMTPURL(raw string) (SMTPConfig, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return SMTPConfig{}, fmt.Errorf("smtp URL: %w", err)
	}
	if u.Scheme != "smtp" || u.Host == "" || u.Opaque != "" {
		return SMTPConfig{}, errors.New("smtp URL: want smtp://[user:password@]host:port?from=ADDRESS")
	}
	q := u.Query()
	for k := range q {
		if k != "from" {
			return SMTPConfig{}, fmt.Errorf("smtp URL: unknown parameter %q (want from)", k)
		}
	}
	cfg := SMTPConfig{Addr: u.Host, From: q.Get("from")}
	if u.User != nil {
		cfg.Username = u.User.Username()
		cfg.Password, _ = u.User.Password()
	}
	if _, err := NewSMTPNotifier(cfg); err != nil {
		return SMTPConfig{}, fmt.Errorf("smtp URL: %w", err)
	}
	return cfg, nil
}

// Notify mails n to n.To.
func (s *SMTPNotifier) Notify(ctx context.Context, n Notification) error {
	var to []*mail.Address
	for _, a := range n.To {
		addr, err := mail.ParseAddress(a)
		if err != nil {
			return fmt.Errorf("notify %s: recipient %q: %w", n.BatchID, a, err)
		}
		to = append(to, addr)
	}
	if len(to) == 0 {
		return nil
	}
	msg := s.message(n, to)
	if err := s.send(ctx, to, msg); err != nil {
		return fmt.Errorf("mail the %s notice of batch %s via %s: %w", n.Kind, n.BatchID, s.cfg.Addr, err)
	}
	return nil
}

// send delivers msg in one SMTP session, within the timeout.
func (s *SMTPNotifier) send(ctx context.Context, to []*mail.Address, msg []byte) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", s.cfg.Addr)
	if err != nil {
		return err
	}
	defer context.AfterFunc(ctx, func() { _ = conn.Close() })()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	c, err := smtp.NewClient(conn, s.host)
	if err != nil {
		_ = conn.Close()
		return err
	}
	defer c.Close()
	if ok, _ := c.Extension("STARTTLS"); ok {
		if err := c.StartTLS(&tls.Config{ServerName: s.host}); err != nil {
			return fmt.Errorf("starttls: %w", err)
		}
	}
	if s.cfg.Username != "" {
		if err := c.Auth(smtp.PlainAuth("", s.cfg.Username, s.cfg.Password, s.host)); err != nil {
			return fmt.Errorf("auth: %w", err)
		}
	}
	if err := c.Mail(s.from.Address); err != nil {
		return err
	}
	for _, a := range to {
		if err := c.Rcpt(a.Address); err != nil {
			return fmt.Errorf("recipient %s: %w", a.Address, err)
		}
	}
	w, err := c.Data()
	if err != nil {
		return err
	}
	if _, err := w.Write(msg); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	return c.Quit()
}

// message renders the mail of n: plain text, CRLF line ends.
func (s *SMTPNotifier) message(n Notification, to []*mail.Address) []byte {
	subject, body := noticeText(n)
	addrs := make([]string, len(to))
	for i, a := range to {
		addrs[i] = a.String()
	}
	id := make([]byte, 12)
	_, _ = rand.Read(id)
	var b bytes.Buffer
	header := func(k, v string) { fmt.Fprintf(&b, "%s: %s\r\n", k, v) }
	header("From", s.from.String())
	header("To", strings.Join(addrs, ", "))
	header("Subject", mimeWord(subject))
	header("Date", time.Now().Format(time.RFC1123Z))
	header("Message-ID", "<"+hex.EncodeToString(id)+"@"+s.host+">")
	header("MIME-Version", "1.0")
	header("Content-Type", "text/plain; charset=utf-8")
	header("Content-Transfer-Encoding", "8bit")
	b.WriteString("\r\n")
	// The SMTP client's writer dot-stuffs the lines.
	for _, line := range strings.Split(body, "\n") {
		b.WriteString(line + "\r\n")
	}
	return b.Bytes()
}

// mimeWord encodes a header value that is not plain ASCII, and keeps it
// on one line.
func mimeWord(s string) string {
	s = strings.NewReplacer("\r", " ", "\n", " ").Replace(s)
	return mime.QEncoding.Encode("utf-8", s)
}

// noticeText returns the subject and body of a notification.
func noticeText(n Notification) (string, string) {
	var b strings.Builder
	fmt.Fprintf(&b, "Batch:     %s\nProfile:   %s\nSubmitter: %s\nObjects:   %d\n", n.BatchID, n.Profile, n.Submitter, n.Jobs)
	if n.Kind == NoticeQueued || n.Report == nil {
		fmt.Fprintf(&b, "\nThe batch was queued: its %d objects will be ingested. A report follows when all are done.\n", n.Jobs)
		return fmt.Sprintf("Ingest batch %s queued: %d objects", n.BatchID, n.Jobs), b.String()
	}
	r := n.Report
	subject := fmt.Sprintf("Ingest batch %s completed: %d of %d objects ingested", n.BatchID, len(r.Succeeded), r.Jobs)
	if n.Status == BatchFailed || len(r.Failed) > 0 {
		subject = fmt.Sprintf("Ingest batch %s failed: %d of %d objects failed", n.BatchID, len(r.Failed), r.Jobs)
	}
	fmt.Fprintf(&b, "Status:    %s\nIngested:  %d\nFailed:    %d\n", n.Status, len(r.Succeeded), len(r.Failed))
	if r.Deleted > 0 {
		fmt.Fprintf(&b, "Deleted:   %d\n", r.Deleted)
	}
	list := func(title string, ids []api.TaskID) {
		if len(ids) == 0 {
			return
		}
		fmt.Fprintf(&b, "\n%s:\n", title)
		for _, id := range ids {
			fmt.Fprintf(&b, "  %s\n", id)
		}
	}
	list("Failed jobs", r.Failed)
	list("Recovered since the previous report", r.Recovered)
	list("Ingested jobs", r.Succeeded)
	return subject, b.String()
}
