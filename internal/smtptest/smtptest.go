// Package smtptest runs a real SMTP server on a local port for tests: it
// speaks the protocol (github.com/emersion/go-smtp) and keeps the mails it
// is given, so that a test checks what a mail client really delivered.
package smtptest

import (
	"io"
	"net"
	"net/mail"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
)

// Server is a running SMTP server. It stops when the test ends.
type Server struct {
	// Addr is the server's host:port.
	Addr string

	mu     sync.Mutex
	mails  []Mail
	reject map[string]bool
}

// Mail is one delivered mail: its envelope and its parsed message.
type Mail struct {
	// From and To are the envelope's sender and recipients.
	From string
	To   []string
	// Header is the message's header; Body its body.
	Header mail.Header
	Body   string
}

// Start starts a server on 127.0.0.1. It refuses the recipients in reject
// at RCPT with 550 "no such mailbox".
func Start(t testing.TB, reject ...string) *Server {
	t.Helper()
	s := &Server{reject: map[string]bool{}}
	for _, r := range reject {
		s.reject[r] = true
	}
	srv := smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) { return &session{s: s}, nil }))
	srv.Domain = "localhost"
	srv.ReadTimeout, srv.WriteTimeout = time.Minute, time.Minute
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("smtptest: listen: %v", err)
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	s.Addr = l.Addr().String()
	return s
}

// Mails returns the mails delivered so far, in order.
func (s *Server) Mails() []Mail {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Mail(nil), s.mails...)
}

// session is one SMTP session.
type session struct {
	s    *Server
	from string
	to   []string
}

func (ss *session) Reset()        { ss.from, ss.to = "", nil }
func (ss *session) Logout() error { return nil }

func (ss *session) Mail(from string, _ *smtp.MailOptions) error {
	ss.from = from
	return nil
}

func (ss *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	if ss.s.reject[to] {
		return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such mailbox"}
	}
	ss.to = append(ss.to, to)
	return nil
}

func (ss *session) Data(r io.Reader) error {
	msg, err := mail.ReadMessage(r)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(msg.Body)
	if err != nil {
		return err
	}
	ss.s.mu.Lock()
	defer ss.s.mu.Unlock()
	ss.s.mails = append(ss.s.mails, Mail{From: ss.from, To: ss.to, Header: msg.Header, Body: string(body)})
	return nil
}
