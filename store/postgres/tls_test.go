package postgres_test

import (
	"context"
	"net/url"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/pgtest"
	"github.com/stinthq/stint/internal/testcert"
	"github.com/stinthq/stint/store/postgres"
)

// A store connects to a server with sslmode=verify-full when sslrootcert
// is the CA that signed the server's certificate, over TLS, and is refused
// with an error that says what to check when it is another CA.
func TestOpenVerifiesTheServersCertificate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, caFile := pgtest.NewTLS(t)
	with := func(host string, q url.Values) string {
		u, err := url.Parse(dsn)
		require.NoError(t, err)
		u.Host = host + ":" + u.Port()
		u.RawQuery = q.Encode()
		return u.String()
	}
	u, err := url.Parse(dsn)
	require.NoError(t, err)

	st, err := postgres.Open(ctx, with("localhost", url.Values{"sslmode": {"verify-full"}, "sslrootcert": {caFile}}), postgres.Migrate())
	require.NoError(t, err)
	var ssl bool
	require.NoError(t, st.Pool().QueryRow(ctx, `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl))
	require.True(t, ssl, "the session is over TLS")
	st.Close()

	other, err := testcert.NewCA("another CA")
	require.NoError(t, err)
	otherFile := t.TempDir() + "/other.pem"
	require.NoError(t, os.WriteFile(otherFile, other.CertPEM, 0o600))
	_, err = postgres.Open(ctx, with(u.Hostname(), url.Values{"sslmode": {"verify-full"}, "sslrootcert": {otherFile}}))
	require.ErrorContains(t, err, "the server's certificate is not signed by a CA that sslrootcert")
	require.ErrorContains(t, err, "certificate signed by unknown authority")
	t.Logf("a wrong CA: %v", err)
}
