package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/stinthq/stint/behaviors/ingest"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/web"
)

// envTokens names the environment variable with API tokens, as ROLE:TOKEN
// entries separated by commas, spaces or newlines.
const envTokens = "STINT_TOKENS"

// devHTTPAddr is where `stint dev` serves the API and dashboard unless told
// otherwise.
const devHTTPAddr = "127.0.0.1:7777"

// httpStopTimeout bounds how long requests may take to finish when the
// HTTP server stops.
const httpStopTimeout = 5 * time.Second

// httpOptions are the flags of the HTTP API and dashboard.
type httpOptions struct {
	addr      string
	tokens    []string
	tokenFile string
	noAuth    bool
	// tlsCert and tlsKey are the files of the certificate and key to
	// serve HTTPS with; insecureHTTP lets plain HTTP listen beyond
	// loopback.
	tlsCert, tlsKey string
	insecureHTTP    bool
	// addrSet is whether --http was given, rather than defaulted.
	addrSet func() bool
}

// addHTTPFlags adds --http and the token flags to cmd. An empty
// defaultAddr leaves HTTP off unless --http is given.
func addHTTPFlags(cmd *cobra.Command, o *httpOptions, defaultAddr string) {
	f := cmd.Flags()
	help := "serve the HTTP API and dashboard on `ADDR` (host:port; a bare port or :port binds 127.0.0.1, 0.0.0.0:port binds all interfaces)"
	if defaultAddr == "" {
		help += " (default off)"
	} else {
		help += "; \"off\" to serve none"
	}
	f.StringVar(&o.addr, "http", defaultAddr, help)
	f.StringArrayVar(&o.tokens, "token", nil, "API token as `ROLE:TOKEN`, ROLE read, submit or admin; repeatable (visible in process lists: prefer --token-file or $"+envTokens+")")
	f.StringVar(&o.tokenFile, "token-file", "", "`FILE` of API tokens, one ROLE:TOKEN a line (# comments)")
	f.BoolVar(&o.noAuth, "insecure-no-auth", false, "serve HTTP without tokens: everyone who can reach it is admin")
	f.StringVar(&o.tlsCert, "tls-cert", "", "serve HTTPS with the certificate (and its chain) in the PEM `FILE`; with --tls-key; both are read again on SIGHUP")
	f.StringVar(&o.tlsKey, "tls-key", "", "the private key of --tls-cert, a PEM `FILE`")
	f.BoolVar(&o.insecureHTTP, "insecure-http", false, "serve plain HTTP on an address beyond loopback: tokens cross the network in clear text")
	o.addrSet = func() bool { return f.Changed("http") }
}

// httpServer is the HTTP API and dashboard of a server or dev command,
// prepared from the flags before anything starts. A nil *httpServer serves
// nothing.
type httpServer struct {
	c      *cli
	addr   string
	tokens *web.Tokens
	noAuth bool
	// devToken is the admin token of dev when none was given, printed in
	// the dashboard link; wantDevToken says dev needs one (see
	// useDevState).
	devToken     string
	wantDevToken bool
	// fallback lets dev move to a free port when its default one is
	// taken; portFile, if set, remembers the port dev served on, which
	// its next run tries first.
	fallback bool
	portFile string
	// metrics serves /metrics; nil serves none.
	metrics *httpMetrics
	// cert, if set, is served: HTTPS.
	cert *web.Certificate
	// hup ends the goroutine that reloads cert on SIGHUP.
	hup chan os.Signal

	srv  *http.Server
	done chan error
}

// prepareHTTP checks the HTTP flags and reads the tokens; it returns nil
// when HTTP is off. Without tokens, dev uses an admin token of its own
// (see useDevState), and server refuses unless --insecure-no-auth is
// given.
func (c *cli) prepareHTTP(o *httpOptions, dev bool) (*httpServer, error) {
	if o.addr == "" || o.addr == "off" {
		if len(o.tokens) > 0 || o.tokenFile != "" || o.noAuth || o.tlsCert != "" || o.tlsKey != "" || o.insecureHTTP {
			return nil, usageErrorf("--token, --token-file, --insecure-no-auth, --tls-cert, --tls-key and --insecure-http need --http ADDR")
		}
		return nil, nil
	}
	addr, err := listenAddr(o.addr)
	if err != nil {
		return nil, usageErrorf("--http: %w", err)
	}
	s := &httpServer{c: c, addr: addr, tokens: &web.Tokens{}, noAuth: o.noAuth, fallback: dev && !o.addrSet()}
	if err := s.prepareTLS(o); err != nil {
		return nil, err
	}
	if o.tokenFile != "" {
		if err := s.readTokenFile(o.tokenFile); err != nil {
			return nil, err
		}
	}
	if env := os.Getenv(envTokens); env != "" {
		if err := s.tokens.AddText("$"+envTokens, env); err != nil {
			return nil, usageErrorf("%w", err)
		}
	}
	for i, t := range o.tokens {
		if err := s.tokens.AddText(fmt.Sprintf("--token #%d", i+1), t); err != nil {
			return nil, usageErrorf("%w", err)
		}
	}
	switch {
	case o.noAuth && s.tokens.Len() > 0:
		return nil, usageErrorf("--insecure-no-auth and tokens exclude each other: drop one")
	case o.noAuth:
		s.tokens = nil
	case s.tokens.Len() == 0 && dev:
		s.wantDevToken = true
	case s.tokens.Len() == 0:
		return nil, usageErrorf("--http needs API tokens: give --token-file FILE or $%s (ROLE:TOKEN entries), or run without auth with --insecure-no-auth", envTokens)
	}
	return s, nil
}

// prepareTLS loads the certificate of --tls-cert and --tls-key, if
// given, and refuses plain HTTP beyond loopback unless --insecure-http
// says so: bearer tokens would cross the network in clear text.
func (s *httpServer) prepareTLS(o *httpOptions) error {
	switch {
	case (o.tlsCert == "") != (o.tlsKey == ""):
		return usageErrorf("--tls-cert and --tls-key go together: give both")
	case o.tlsCert != "" && o.insecureHTTP:
		return usageErrorf("--insecure-http and --tls-cert exclude each other: drop one")
	case o.tlsCert != "":
		cert, err := web.LoadCertificate(o.tlsCert, o.tlsKey)
		if err != nil {
			return usageErrorf("--tls-cert, --tls-key: %w", err)
		}
		s.cert = cert
	case !o.insecureHTTP && !loopback(s.addr):
		return usageErrorf("--http %s listens beyond this machine in clear text, where API tokens would cross the network unencrypted: "+
			"give --tls-cert FILE and --tls-key FILE to serve HTTPS, or --insecure-http to serve HTTP anyway (behind a TLS proxy, say)", s.addr)
	}
	return nil
}

// loopback reports whether the listen address addr binds loopback only:
// localhost or a loopback IP address.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// reloadOnHangup reads the certificate again on each SIGHUP, until stop.
func (s *httpServer) reloadOnHangup() {
	s.hup = make(chan os.Signal, 1)
	signal.Notify(s.hup, syscall.SIGHUP)
	go func() {
		for range s.hup {
			if err := s.cert.Reload(); err != nil {
				s.c.log.Error(s.c.name+" http: SIGHUP: the certificate stays as it was", "err", err)
				continue
			}
			s.c.log.Info(s.c.name + " http: SIGHUP: certificate reloaded")
		}
	}()
}

// readTokenFile adds the tokens of the file at path, warning when others
// may read it.
func (s *httpServer) readTokenFile(path string) error {
	info, err := os.Stat(path)
	if err != nil {
		return usageErrorf("--token-file: %w", err)
	}
	if info.Mode().Perm()&0o077 != 0 {
		s.c.log.Warn(s.c.name+" http: the token file is readable by others; chmod 600 it", "file", path, "mode", info.Mode().Perm().String())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return usageErrorf("--token-file: %w", err)
	}
	if err := s.tokens.AddText(path, string(b)); err != nil {
		return usageErrorf("--token-file: %w", err)
	}
	return nil
}

// listenAddr turns the value of --http into a listen address: a bare port
// or ":port" binds 127.0.0.1; a host must be given to bind anything else.
func listenAddr(v string) (string, error) {
	if _, err := strconv.Atoi(v); err == nil {
		v = ":" + v
	}
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return "", fmt.Errorf("%q is not host:port: %w", v, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return "", fmt.Errorf("%q: port %q is not a number from 0 to 65535", v, port)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// newMetrics builds the meter provider whose metrics /metrics serves, for
// the server that s serves; a nil s (HTTP off) has none, and its server
// uses OpenTelemetry's global provider.
func (s *httpServer) newMetrics(ctx context.Context) (*httpMetrics, error) {
	if s == nil {
		return nil, nil
	}
	m, err := newHTTPMetrics(ctx, s.c.name)
	if err != nil {
		return nil, fmt.Errorf("start HTTP: %w", err)
	}
	s.metrics = m
	return m, nil
}

// start serves the API and dashboard for client, with the behaviors of
// reg, until stop. It returns once the address is bound.
func (s *httpServer) start(client *impl.Client, reg *spi.Registry) error {
	if s == nil {
		return nil
	}
	log := s.c.log
	cfg := web.Config{
		Client:         client,
		Registry:       reg,
		Tokens:         s.tokens,
		InsecureNoAuth: s.noAuth,
		Logger:         log,
	}
	if s.metrics != nil {
		cfg.Metrics = s.metrics.handler
	}
	if _, ok := reg.Lookup(ingest.BatchBehavior); ok {
		cfg.Routes = append(cfg.Routes, ingest.Routes(ingest.NewAdmin(client))...)
		cfg.Features = append(cfg.Features, ingest.Feature)
	}
	h, err := web.New(cfg)
	if err != nil {
		return fmt.Errorf("start HTTP: %w", err)
	}
	ln, err := s.listen()
	if err != nil {
		return fmt.Errorf("start HTTP: %w", err)
	}
	s.srv = web.NewServer(h, log)
	s.done = make(chan error, 1)
	scheme := "http://"
	if s.cert != nil {
		scheme = "https://"
		s.srv.TLSConfig = s.cert.TLSConfig()
		s.reloadOnHangup()
		go func() { s.done <- s.srv.ServeTLS(ln, "", "") }()
	} else {
		go func() { s.done <- s.srv.Serve(ln) }()
	}

	url := scheme + displayAddr(ln.Addr())
	if s.noAuth {
		log.Warn(s.c.name+" http: serving WITHOUT AUTH (--insecure-no-auth): everyone who can reach the address is admin", "url", url)
	} else {
		log.Info(s.c.name+" http: serving the API and dashboard", "url", url, "tokens", s.tokens.Len())
	}
	if s.devToken != "" {
		fmt.Fprintf(s.c.stdout, "dashboard: %s/#token=%s\n", url, s.devToken)
		fmt.Fprintf(s.c.stdout, "api: curl -H 'Authorization: Bearer %s' %s/api/v1/stats\n", s.devToken, url)
		if s.metrics != nil {
			fmt.Fprintf(s.c.stdout, "metrics: curl -H 'Authorization: Bearer %s' %s/metrics\n", s.devToken, url)
		}
	} else {
		fmt.Fprintf(s.c.stdout, "dashboard: %s/\n", url)
	}
	return nil
}

// listen binds s's address. With fallback, dev tries the port of its
// previous run first (remembered in portFile), then the default address,
// then a free port, and remembers the port it got: a link to the
// dashboard stays good from one run to the next.
func (s *httpServer) listen() (net.Listener, error) {
	if !s.fallback {
		return net.Listen("tcp", s.addr)
	}
	host, _, _ := net.SplitHostPort(s.addr)
	var ln net.Listener
	var err error
	if previous := readPort(s.portFile); previous != 0 {
		ln, err = net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(previous)))
	}
	if ln == nil {
		ln, err = net.Listen("tcp", s.addr)
	}
	if err != nil {
		s.c.log.Warn(s.c.name+" http: the default address is taken; using a free port", "addr", s.addr, "err", err)
		ln, err = net.Listen("tcp", net.JoinHostPort(host, "0"))
	}
	if err != nil {
		return nil, err
	}
	if s.portFile != "" {
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		if err := os.WriteFile(s.portFile, []byte(port+"\n"), 0o644); err != nil {
			s.c.log.Warn(s.c.name+" http: cannot remember the port for the next run", "err", err)
		}
	}
	return ln, nil
}

// useDevState keeps what dev's dashboard link holds from one run to the
// next in dev's data directory dir: the port it serves on, and, unless
// tokens were given, its admin token (made and stored, mode 0600, by the
// first run).
func (s *httpServer) useDevState(dir string) error {
	if s == nil {
		return nil
	}
	if s.fallback {
		s.portFile = filepath.Join(dir, devHTTPPortFile)
	}
	if !s.wantDevToken {
		return nil
	}
	token, err := s.c.devToken(filepath.Join(dir, devTokenFile))
	if err != nil {
		return err
	}
	if err := s.tokens.Add(web.RoleAdmin, token); err != nil {
		return fmt.Errorf("dev token in %s: %w", filepath.Join(dir, devTokenFile), err)
	}
	s.devToken = token
	return nil
}

// devToken returns the admin token stored in the file at path, making
// it mode 0600 when others could read it; it makes and stores a token
// when there is none, or none that is well formed.
func (c *cli) devToken(path string) (string, error) {
	if b, err := os.ReadFile(path); err == nil {
		token := strings.TrimSpace(string(b))
		if devTokenForm.MatchString(token) {
			if info, err := os.Stat(path); err == nil && info.Mode().Perm() != 0o600 {
				if err := os.Chmod(path, 0o600); err != nil {
					return "", fmt.Errorf("make the dev token private: %w", err)
				}
			}
			return token, nil
		}
		c.log.Warn(c.name+" dev: the stored dev token is malformed; making a new one", "file", path)
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("make a dev token: %w", err)
	}
	token := hex.EncodeToString(b)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return "", fmt.Errorf("store the dev token: %w", err)
	}
	_, err = f.WriteString(token + "\n")
	err = errors.Join(err, f.Chmod(0o600), f.Close())
	if err != nil {
		return "", fmt.Errorf("store the dev token: %w", err)
	}
	return token, nil
}

// devTokenForm is the form of the tokens dev makes: 24 random bytes in
// hex.
var devTokenForm = regexp.MustCompile(`^[0-9a-f]{48}$`)

// displayAddr returns a listener's address as a browser should use it:
// the unspecified address becomes localhost.
func displayAddr(a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "localhost"
	}
	return net.JoinHostPort(host, port)
}

// stop stops serving: new connections are refused, open event streams
// end, and requests in flight get a few seconds to finish.
func (s *httpServer) stop() {
	if s == nil || s.srv == nil {
		return
	}
	if s.hup != nil {
		signal.Stop(s.hup)
		close(s.hup)
	}
	ctx, cancel := context.WithTimeout(context.Background(), httpStopTimeout)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		s.c.log.Warn(s.c.name+" http: stop", "err", err)
		_ = s.srv.Close()
	}
	if err := <-s.done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		s.c.log.Warn(s.c.name+" http: server ended", "err", err)
	}
	s.c.log.Info(s.c.name + " http: stopped")
}
