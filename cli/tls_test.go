package cli

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/internal/testcert"
)

// writeCert issues a certificate for 127.0.0.1 and localhost from ca and
// writes it and its key to cert and key.
func writeCert(t *testing.T, ca *testcert.CA, cert, key string) {
	t.Helper()
	c, k, err := ca.Issue("127.0.0.1", "localhost")
	require.NoError(t, err)
	// Written whole and renamed in place, as a certificate renewer does,
	// so that a reload never reads half a file.
	for path, b := range map[string][]byte{cert: c, key: k} {
		require.NoError(t, os.WriteFile(path+".new", b, 0o600))
		require.NoError(t, os.Rename(path+".new", path))
	}
}

// The HTTP server refuses to listen beyond loopback in clear text unless
// told so, and refuses TLS flags that do not go together, with exit
// code 2, before it touches the database.
func TestHTTPRefusesClearTextBeyondLoopback(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, time.Minute)
	dir := t.TempDir()
	ca, err := testcert.NewCA("stint test CA")
	require.NoError(t, err)
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writeCert(t, ca, cert, key)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "garbage.pem"), []byte("not a certificate"), 0o600))
	// No database listens here: the flags are refused before one is needed.
	const db = "postgres://127.0.0.1:1/none?connect_timeout=1"
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"all interfaces", []string{"--http", "0.0.0.0:0"}, "--insecure-http"},
		{"a host name", []string{"--http", "stint.example:8080"}, "clear text"},
		{"an address", []string{"--http", "10.1.2.3:8080"}, "--tls-cert FILE and --tls-key FILE"},
		{"a certificate without its key", []string{"--http", "127.0.0.1:0", "--tls-cert", cert}, "go together"},
		{"a key without its certificate", []string{"--http", "127.0.0.1:0", "--tls-key", key}, "go together"},
		{"TLS and --insecure-http", []string{"--http", "0.0.0.0:0", "--tls-cert", cert, "--tls-key", key, "--insecure-http"}, "exclude each other"},
		{"a missing certificate", []string{"--http", "127.0.0.1:0", "--tls-cert", filepath.Join(dir, "none.pem"), "--tls-key", key}, "none.pem"},
		{"a certificate that is not one", []string{"--http", "127.0.0.1:0", "--tls-cert", filepath.Join(dir, "garbage.pem"), "--tls-key", key}, "garbage.pem"},
		{"a key that is not the certificate's", []string{"--http", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", cert}, "--tls-key"},
		{"TLS flags without --http", []string{"--tls-cert", cert, "--tls-key", key}, "need --http ADDR"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(ctx, append([]string{"server", "--db", db, "--behaviors", "demo.echo", "--insecure-no-auth"}, tc.args...)...)
			require.Equal(t, exitUsage, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
			require.Contains(t, r.stderr, tc.want)
		})
	}
}

// `stint server --http 0.0.0.0:0 --insecure-http` serves plain HTTP.
func TestHTTPInsecureBeyondLoopback(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 3*time.Minute)
	dsn := pgtest.New(t)
	base, stop := serveHTTP(t, ctx, nil, "--db", dsn, "--behaviors", "demo.echo", "--http", "0.0.0.0:0", "--insecure-http", "--insecure-no-auth")
	require.Regexp(t, `^http://localhost:\d+$`, base)
	resp, err := http.Get(base + "/api/v1/stats")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	stop()
}

// `stint server --tls-cert --tls-key` serves HTTPS with the certificate
// and, after a SIGHUP, with the renewed one the files then hold.
func TestHTTPServesTLSAndReloadsOnHangup(t *testing.T) {
	// Not parallel: it sends the test process a SIGHUP, which another
	// test's server would take as its own.
	ctx := testContext(t, 3*time.Minute)
	dsn := pgtest.New(t)
	dir := t.TempDir()
	ca, err := testcert.NewCA("stint test CA")
	require.NoError(t, err)
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writeCert(t, ca, cert, key)
	base, stop := serveHTTP(t, ctx, nil, "--db", dsn, "--behaviors", "demo.echo", "--insecure-no-auth", "--tls-cert", cert, "--tls-key", key)
	require.Regexp(t, `^https://127\.0\.0\.1:\d+$`, base)

	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(ca.CertPEM))
	// served returns the serial number of the certificate a new
	// connection is served.
	served := func() string {
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, DisableKeepAlives: true}}
		resp, err := client.Get(base + "/api/v1/stats")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		return resp.TLS.PeerCertificates[0].SerialNumber.String()
	}
	first := served()

	// A client that does not trust the CA is refused.
	_, err = http.Get(base + "/api/v1/stats")
	require.ErrorContains(t, err, "certificate signed by unknown authority")
	// Plain HTTP on the HTTPS port gets no answer it could mistake.
	resp, err := http.Get("http" + base[len("https"):] + "/api/v1/stats")
	if err == nil {
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	}

	writeCert(t, ca, cert, key)
	require.Equal(t, first, served(), "the certificate changes only on SIGHUP")
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	waitFor(t, time.Minute, "the renewed certificate", func() bool { return served() != first })
	stop()
}
