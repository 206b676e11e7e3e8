package web

import (
	"crypto/tls"
	"fmt"
	"sync/atomic"
)

// Certificate is a server's TLS certificate and key, read from two PEM
// files, which Reload reads again: a renewed certificate is served to the
// connections made after the reload, without a restart.
type Certificate struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
}

// LoadCertificate reads the certificate (with its chain) at certFile and
// its private key at keyFile.
func LoadCertificate(certFile, keyFile string) (*Certificate, error) {
	c := &Certificate{certFile: certFile, keyFile: keyFile}
	if err := c.Reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// Reload reads the files again. On an error the certificate served so far
// stays.
func (c *Certificate) Reload() error {
	pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("load TLS certificate %s and key %s: %w", c.certFile, c.keyFile, err)
	}
	c.cur.Store(&pair)
	return nil
}

// TLSConfig returns a server configuration that serves the certificate
// last loaded, with TLS 1.2 at least.
func (c *Certificate) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.cur.Load(), nil },
	}
}
