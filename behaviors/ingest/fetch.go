package ingest

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// parallel runs fn for 0..n-1 with at most limit at once. The first error
// cancels the context of the others and is returned.
func parallel(ctx context.Context, limit, n int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sem := make(chan struct{}, max(limit, 1))
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := fn(ctx, i); err != nil {
				once.Do(func() { first = err; cancel() })
			}
		})
	}
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

// headSize returns the size of the file at raw: a HEAD request's
// Content-Length, or a local file's size; -1 when unknown.
func headSize(ctx context.Context, client *http.Client, raw string) (int64, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return -1, err
	}
	if u.Scheme == "file" {
		fi, err := os.Stat(u.Path)
		if err != nil {
			return -1, err
		}
		return fi.Size(), nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, raw, nil)
	if err != nil {
		return -1, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return -1, err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return -1, fmt.Errorf("HEAD %s: %s", raw, resp.Status)
	}
	return resp.ContentLength, nil
}

// newDigest returns the hash of a digest algorithm (one normalizeAlg
// accepts).
func newDigest(alg string) hash.Hash {
	switch alg {
	case "md5":
		return md5.New()
	case "sha1":
		return sha1.New()
	case "sha512":
		return sha512.New()
	default:
		return sha256.New()
	}
}

// errRetry marks a fetch error worth another try.
type errRetry struct{ err error }

func (e *errRetry) Error() string { return e.err.Error() }
func (e *errRetry) Unwrap() error { return e.err }

// retryStatus reports whether an HTTP status is worth another try.
func retryStatus(code int) bool {
	return code >= 500 || code == http.StatusTooManyRequests || code == http.StatusRequestTimeout
}

// withRetries runs try up to cfg.HTTPAttempts times while it fails with
// an *errRetry, pausing with doubling backoff in between.
func withRetries(ctx context.Context, cfg *Config, try func() error) error {
	backoff := cfg.RetryBackoff
	for attempt := 1; ; attempt++ {
		err := try()
		var retry *errRetry
		if err == nil || !errors.As(err, &retry) || attempt >= cfg.HTTPAttempts {
			return err
		}
		if err := spi.Sleep(ctx, backoff); err != nil {
			return err
		}
		backoff *= 2
	}
}

// fetchFile downloads f to dest (through a temporary file, renamed when complete
// and verified), with retries. A digest mismatch fails permanently.
func fetchFile(ctx context.Context, cfg *Config, f File, dest string) (FileResult, error) {
	var res FileResult
	err := withRetries(ctx, cfg, func() error {
		var err error
		res, err = fetchOnce(ctx, cfg.HTTPClient, f, dest)
		return err
	})
	var retry *errRetry
	if errors.As(err, &retry) {
		err = retry.err
	}
	var te *api.TaskError
	if err != nil && !errors.As(err, &te) && ctx.Err() == nil {
		err = api.Permanent("download_failed", "file %s: %v", f.Name, err)
	}
	return res, err
}

func fetchOnce(ctx context.Context, client *http.Client, f File, dest string) (FileResult, error) {
	body, err := openSource(ctx, client, f.URL)
	if err != nil {
		return FileResult{}, err
	}
	defer body.Close()
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return FileResult{}, fmt.Errorf("create directory for %s: %w", f.Name, err)
	}
	out, err := os.CreateTemp(filepath.Dir(dest), ".part-*")
	if err != nil {
		return FileResult{}, fmt.Errorf("create a temporary file for %s: %w", f.Name, err)
	}
	part := out.Name()
	defer os.Remove(part) // a no-op after the rename
	sum := sha256.New()
	writers := []io.Writer{out, sum}
	var given hash.Hash
	if f.DigestAlg != "" && f.DigestAlg != "sha256" {
		given = newDigest(f.DigestAlg)
		writers = append(writers, given)
	}
	n, err := io.Copy(io.MultiWriter(writers...), body)
	if cerr := out.Close(); err == nil && cerr != nil {
		return FileResult{}, fmt.Errorf("write %s: %w", f.Name, cerr)
	}
	if err != nil {
		if ctx.Err() != nil {
			return FileResult{}, context.Cause(ctx)
		}
		return FileResult{}, &errRetry{fmt.Errorf("read %s: %w", f.URL, err)}
	}
	sha := hex.EncodeToString(sum.Sum(nil))
	if f.DigestAlg != "" {
		got := sha
		if given != nil {
			got = hex.EncodeToString(given.Sum(nil))
		}
		if got != f.Digest {
			return FileResult{}, api.Permanent("digest_mismatch", "file %s: %s digest is %s, the manifest says %s",
				f.Name, f.DigestAlg, got, f.Digest)
		}
	}
	if err := os.Rename(part, dest); err != nil {
		return FileResult{}, fmt.Errorf("rename %s: %w", part, err)
	}
	return FileResult{Size: n, SHA256: sha}, nil
}

// openSource opens the body of an http, https or file URL. Errors worth a
// retry (network errors, 5xx, 408, 429) are *errRetry.
func openSource(ctx context.Context, client *http.Client, raw string) (io.ReadCloser, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	if u.Scheme == "file" {
		return os.Open(u.Path)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, raw, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, &errRetry{err}
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		err := fmt.Errorf("GET %s: %s", raw, resp.Status)
		if retryStatus(resp.StatusCode) {
			return nil, &errRetry{err}
		}
		return nil, err
	}
	return resp.Body, nil
}

// postCallback posts body to the callback URL, with retries. Any failure
// is permanent for the job (it goes to Failed at Notify).
func postCallback(ctx context.Context, cfg *Config, callback string, body []byte) error {
	err := withRetries(ctx, cfg, func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, callback, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := cfg.HTTPClient.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return &errRetry{err}
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			err := fmt.Errorf("POST %s: %s", callback, resp.Status)
			if retryStatus(resp.StatusCode) {
				return &errRetry{err}
			}
			return err
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		var retry *errRetry
		if errors.As(err, &retry) {
			err = retry.err
		}
		return api.Permanent("callback_failed", "%v", err)
	}
	return err
}

// writeFileAtomic writes data to path through a temporary file.
func writeFileAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create directory for %s: %w", path, err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(f.Name())
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// copyFileAtomic copies src to dst through a temporary file, replacing
// dst: copying twice leaves one copy.
func copyFileAtomic(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	out, err := os.CreateTemp(filepath.Dir(dst), ".tmp-*")
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	tmp := out.Name()
	defer os.Remove(tmp)
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("store %s: %w", dst, err)
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return fmt.Errorf("store %s: %w", dst, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("store %s: %w", dst, err)
	}
	if err := os.Chmod(tmp, 0o644); err != nil {
		return fmt.Errorf("store %s: %w", dst, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("store %s: %w", dst, err)
	}
	return nil
}
