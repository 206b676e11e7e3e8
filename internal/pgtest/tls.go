package pgtest

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/stinthq/stint/internal/pgcluster"
	"github.com/stinthq/stint/internal/testcert"
)

// NewTLS starts a cluster of the test's own that serves TLS with a
// certificate for 127.0.0.1 and localhost signed by a certificate
// authority of its own, and stops it when the test ends. It returns the
// URL of its postgres database (without sslmode, sslrootcert: the test
// adds them) and the path of a file with the CA's certificate, for
// sslrootcert. The URL has no query. With STINT_TEST_DATABASE_URL set the test binary starts no
// cluster, and the test is skipped.
func NewTLS(t testing.TB) (dsn, caFile string) {
	t.Helper()
	setupOnce.Do(setup)
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	if cluster == nil {
		t.Skipf("pgtest: a TLS cluster is started beside the test binary's own, and %s points the tests at another server", EnvDatabaseURL)
	}
	ca, err := testcert.NewCA("stint pgtest CA")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	cert, key, err := ca.Issue("127.0.0.1", "localhost")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o600); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	dir := TempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: dir, Fast: true,
		Settings: []string{"ssl=on", "ssl_cert_file=server.crt", "ssl_key_file=server.key"},
		Files:    map[string][]byte{"server.crt": cert, "server.key": key}})
	if err != nil {
		t.Fatalf("pgtest: start a TLS cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("pgtest: stop the TLS cluster: %v", err)
		}
	})
	u, err := url.Parse(c.DSN("postgres"))
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	u.RawQuery = ""
	return u.String(), caFile
}
