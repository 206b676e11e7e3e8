package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/ingest"
)

// ingestDemo is the demo batch of stint dev: a few objects served by a
// file server on 127.0.0.1 that dev starts itself, with a callback.
type ingestDemo struct {
	srv      *http.Server
	base     string
	files    map[string][]byte // read-only once the server runs
	manifest string
	err      error
}

// demoProfile is the profile of the demo batch.
const demoProfile = "demo"

// demoBatch is the id of the demo batch, which dev submits when it is not
// there: once, until the cleanup deletes it.
const demoBatch api.TaskID = "stint-dev-demo-batch"

// prepareIngestDemo starts the demo's file server and configures the
// ingest behaviors of dev: storage under dataDir/ingest, the inventory in
// pool, and the demo profile's callback. Call it before building the
// registry.
func (c *cli) prepareIngestDemo(dataDir string, pool *pgxpool.Pool) *ingestDemo {
	d := &ingestDemo{files: map[string][]byte{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	profiles := map[string]ingest.Profile{}
	if err != nil {
		d.err = fmt.Errorf("start the demo file server: %w", err)
	} else {
		d.base = "http://" + ln.Addr().String()
		profiles[demoProfile] = ingest.Profile{CallbackURL: d.base + "/callback"}
		d.manifest = d.makeFiles()
		d.srv = &http.Server{Handler: http.HandlerFunc(d.serve), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = d.srv.Serve(ln) }()
	}
	c.builtins.setIngest(filepath.Join(dataDir, "ingest"), pool, profiles)
	return d
}

// makeFiles makes the demo's files (three objects, one of two files) and
// returns their manifest.
func (d *ingestDemo) makeFiles() string {
	var lines []string
	for i, obj := range []struct {
		local string
		files []string
	}{
		{"demo-letter", []string{"letter.txt"}},
		{"demo-photos", []string{"photo-1.txt", "photo-2.txt"}},
		{"demo-notes", []string{"notes.txt"}},
	} {
		for _, name := range obj.files {
			data := []byte(fmt.Sprintf("stint dev demo object %d, file %s\n", i+1, name))
			path := "/" + obj.local + "/" + name
			d.files[path] = data
			sum := sha256.Sum256(data)
			lines = append(lines, fmt.Sprintf("%s%s | sha256 | %s | %d | %s | %s", d.base, path,
				hex.EncodeToString(sum[:]), len(data), name, obj.local))
		}
	}
	return "#%checkm_0.7\n" + strings.Join(lines, "\n") + "\n"
}

// serve serves the demo files and accepts callbacks.
func (d *ingestDemo) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/callback" {
		_, _ = io.Copy(io.Discard, r.Body)
		return
	}
	data, ok := d.files[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	http.ServeContent(w, r, r.URL.Path, time.Time{}, strings.NewReader(string(data)))
}

// run submits the demo batch, waits for its report and logs it; it stops
// the file server when ctx ends.
func (d *ingestDemo) run(ctx context.Context, c *cli, tasks api.Tasks) {
	defer func() {
		if d.srv != nil {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = d.srv.Shutdown(sctx)
		}
	}()
	if d.err != nil {
		c.log.Error(c.name+" dev: no demo batch", "err", d.err)
		return
	}
	switch _, err := tasks.Get(ctx, demoBatch); {
	case err == nil:
		c.log.Info(c.name+" dev: the demo batch of an earlier run is there: see '"+c.name+" batches show "+string(demoBatch)+"'", "id", demoBatch)
		return
	case !errors.Is(err, api.ErrNotFound):
		if ctx.Err() == nil {
			c.log.Error(c.name+" dev: look for the demo batch", "err", err)
		}
		return
	}
	f, err := ingest.SubmitBatch(ctx, tasks, ingest.BatchParams{Submitter: "stint dev", Profile: demoProfile,
		Title: "stint dev demo", Manifest: d.manifest}, api.WithID(demoBatch))
	if err != nil {
		if ctx.Err() == nil {
			c.log.Error(c.name+" dev: submit the demo batch", "err", err)
		}
		return
	}
	c.log.Info(c.name+" dev: submitted a demo ingest batch", "behavior", ingest.BatchBehavior, "id", f.ID(), "objects", 3)
	res, err := f.Await(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.log.Error(c.name+" dev: the demo batch failed", "id", f.ID(), "err", err)
		}
		return
	}
	c.log.Info(c.name+" dev: the demo batch completed: see '"+c.name+" batches show "+string(f.ID())+"'",
		"id", f.ID(), "status", res.Status, "succeeded", len(res.Report.Succeeded), "failed", len(res.Report.Failed))
}
