package web_test

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/testcert"
	"github.com/stinthq/stint/web"
)

// A certificate is read at load and again at each Reload; a reload that
// fails keeps the certificate served so far, and a load that fails names
// the file.
func TestCertificateReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	ca, err := testcert.NewCA("stint test CA")
	require.NoError(t, err)
	write := func() {
		c, k, err := ca.Issue("localhost")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(certFile, c, 0o600))
		require.NoError(t, os.WriteFile(keyFile, k, 0o600))
	}
	_, err = web.LoadCertificate(certFile, keyFile)
	require.ErrorContains(t, err, certFile, "no files yet")

	write()
	cert, err := web.LoadCertificate(certFile, keyFile)
	require.NoError(t, err)
	cfg := cert.TLSConfig()
	require.GreaterOrEqual(t, cfg.MinVersion, uint16(tls.VersionTLS12))
	served := func() []byte {
		c, err := cfg.GetCertificate(&tls.ClientHelloInfo{ServerName: "localhost"})
		require.NoError(t, err)
		return c.Certificate[0]
	}
	first := served()

	write()
	require.Equal(t, first, served(), "the files are read only on Reload")
	require.NoError(t, cert.Reload())
	second := served()
	require.NotEqual(t, first, second)

	require.NoError(t, os.WriteFile(keyFile, []byte("not a key"), 0o600))
	require.ErrorContains(t, cert.Reload(), keyFile)
	require.Equal(t, second, served(), "a failed reload keeps the certificate")
}
