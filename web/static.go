package web

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"time"
)

// The dashboard: one page and its script and style sheet, embedded in the
// binary. The page loads nothing from elsewhere.
//
//go:embed static
var staticFS embed.FS

// contentSecurityPolicy lets the dashboard load its own files and talk to
// its own API, and nothing else.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// staticFiles serves the embedded dashboard files with strong ETags.
type staticFiles struct {
	files map[string]staticFile
}

type staticFile struct {
	body        []byte
	etag        string
	contentType string
}

// loadStatic reads the embedded files and hashes them.
func loadStatic() (*staticFiles, error) {
	s := &staticFiles{files: map[string]staticFile{}}
	err := fs.WalkDir(staticFS, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := staticFS.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		ct := mime.TypeByExtension(path.Ext(p))
		if ct == "" {
			ct = "application/octet-stream"
		}
		s.files[path.Base(p)] = staticFile{body: body, etag: `"` + hex.EncodeToString(sum[:12]) + `"`, contentType: ct}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load the dashboard files: %w", err)
	}
	if _, ok := s.files["index.html"]; !ok {
		return nil, fmt.Errorf("load the dashboard files: index.html is missing")
	}
	return s, nil
}

// serve serves GET / (the page) and GET /assets/{file}.
func (s *staticFiles) serve(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("file")
	if name == "" {
		name = "index.html"
	}
	f, ok := s.files[name]
	if !ok || (name == "index.html" && r.PathValue("file") != "") {
		http.NotFound(w, r)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", f.contentType)
	hd.Set("ETag", f.etag)
	// Revalidate every time: a new binary may bring new files, and a 304
	// costs almost nothing.
	hd.Set("Cache-Control", "no-cache")
	if name == "index.html" {
		hd.Set("Content-Security-Policy", contentSecurityPolicy)
	}
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(f.body))
}
