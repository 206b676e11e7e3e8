package ingest_test

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/ingest"
)

// content returns n deterministic bytes for a file.
func content(seed string, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed[i%len(seed)] ^ byte(i*7)
	}
	return b
}

// TestBatchOfTwentyObjects ingests a batch of 20 objects, some with several
// files, digests of every algorithm, given identifiers and a file URL, on
// two nodes, and checks that storage and inventory hold exactly what the
// manifest listed.
func TestBatchOfTwentyObjects(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	localDir := t.TempDir()
	algs := []string{"md5", "sha1", "sha256", "sha512", ""}

	type wantFile struct {
		name, alg string
		data      []byte
	}
	type wantObject struct {
		local, ident string
		files        []wantFile
	}
	var lines []line
	var objects []wantObject
	for i := range 20 {
		o := wantObject{local: fmt.Sprintf("obj%02d", i)}
		if i%5 == 0 {
			o.ident = fmt.Sprintf("ark:/13030/m5test%02d", i)
		}
		for k := range i%3 + 1 {
			alg := algs[(i+k)%len(algs)]
			name := fmt.Sprintf("file%d.dat", k)
			if k == 2 {
				name = "sub/dir/" + name
			}
			data := content(fmt.Sprintf("%d-%d", i, k), 1000+i*997+k*13)
			l := e.fileLine(o.local, name, alg, data)
			if i == 7 && k == 0 {
				// One file comes from a file URL.
				path := filepath.Join(localDir, "local.dat")
				require.NoError(t, os.WriteFile(path, data, 0o644))
				l.url = "file://" + path
			}
			l.ident = o.ident
			lines = append(lines, l)
			o.files = append(o.files, wantFile{name: name, alg: alg, data: data})
		}
		objects = append(objects, o)
	}

	e.server("node-a")
	e.server("node-b")
	batch := e.submit(manifest(lines...))
	bt := e.await(batch)
	require.Equal(t, api.StatusSuccess, bt.Status, "batch error: %v", bt.Error)
	var res ingest.BatchResult
	require.NoError(t, json.Unmarshal(bt.Result, &res))
	require.Equal(t, ingest.BatchCompleted, res.Status)
	require.Len(t, res.Report.Succeeded, 20)
	require.Empty(t, res.Report.Failed)
	bv := e.batchView(batch)
	require.Equal(t, ingest.BatchCompleted, bv.Status)
	require.Equal(t, map[ingest.JobState]int{ingest.JobCompleted: 20}, bv.Counts)
	require.Equal(t, []string{"Pending>Processing", "Processing>Reporting", "Reporting>Completed"}, history(bv.History))

	// Every job completed through every stage, once.
	wantFiles := map[string][]byte{}
	identifiers := map[string]bool{}
	for i, o := range objects {
		id := ingest.JobID(batch, i)
		p := e.jobProgress(id)
		require.Equal(t, ingest.JobCompleted, p.Status)
		require.Equal(t, ingest.JobNotify, p.LastSuccessfulStatus)
		require.Zero(t, p.RetryCount)
		require.Equal(t, []string{"Pending>Estimating", "Estimating>Provisioning", "Provisioning>Downloading",
			"Downloading>Processing", "Processing>Storing", "Storing>Recording", "Recording>Notify", "Notify>Completed"}, history(p.History))
		if o.ident != "" {
			require.Equal(t, o.ident, p.Identifier)
			require.False(t, p.Minted)
		} else {
			require.True(t, strings.HasPrefix(p.Identifier, "ark:/99999/fk4"), p.Identifier)
			require.True(t, p.Minted)
		}
		require.False(t, identifiers[p.Identifier], "identifier %s used twice", p.Identifier)
		identifiers[p.Identifier] = true
		require.Equal(t, 1, p.Version)
		objDir := strings.NewReplacer(":", "+", "/", "=", ".", ",").Replace(p.Identifier)
		require.Equal(t, filepath.Join(e.storage, objDir, "v1"), p.StoragePath)
		for _, f := range o.files {
			wantFiles[filepath.Join(objDir, "v1", "producer", f.name)] = f.data
		}
		wantFiles[filepath.Join(objDir, "v1", "system", "mrt-erc.txt")] = nil
		wantFiles[filepath.Join(objDir, "v1", "system", "mrt-ingest.json")] = nil

		// Inventory: one object row and one row per file, with digests.
		require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_ingest_object WHERE job_id = $1 AND identifier = $2
			AND version = 1 AND local_id = $3 AND batch_id = $4 AND profile = 'coll' AND file_count = $5`,
			string(id), p.Identifier, o.local, string(batch), len(o.files)))
		for _, f := range o.files {
			var alg, dig *string
			var sha string
			var size int64
			require.NoError(t, e.pool.QueryRow(e.ctx, `SELECT size, sha256, digest_alg, digest FROM stint_ingest_file
				WHERE identifier = $1 AND version = 1 AND name = $2`, p.Identifier, f.name).Scan(&size, &sha, &alg, &dig))
			require.Equal(t, int64(len(f.data)), size)
			require.Equal(t, digest("sha256", f.data), sha)
			if f.alg == "" {
				require.Nil(t, alg)
			} else {
				require.Equal(t, f.alg, *alg)
				require.Equal(t, digest(f.alg, f.data), *dig)
			}
		}
		// Each HTTP file was sized with one HEAD and fetched with one GET.
		for k, f := range o.files {
			if i == 7 && k == 0 {
				continue
			}
			path := "/files/" + o.local + "/" + f.name
			require.Equal(t, 1, e.fs.count("HEAD", path), path)
			require.Equal(t, 1, e.fs.count("GET", path), path)
		}
	}
	totalFiles := 0
	for _, o := range objects {
		totalFiles += len(o.files)
	}
	require.Equal(t, 20, e.count(`SELECT count(*) FROM stint_ingest_object`))
	require.Equal(t, totalFiles, e.count(`SELECT count(*) FROM stint_ingest_file`))
	require.Equal(t, int32(16), e.mints.Load(), "one mint per object without a given identifier")

	// Storage holds exactly the manifest's files (and the metadata).
	got := map[string][]byte{}
	require.NoError(t, filepath.WalkDir(e.storage, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(e.storage, path)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(path)
		got[rel] = data
		return err
	}))
	require.Equal(t, sortedKeys(wantFiles), sortedKeys(got))
	for name, data := range wantFiles {
		if data != nil {
			require.Equal(t, data, got[name], name)
		}
	}
	erc := string(got[filepath.Join(strings.NewReplacer(":", "+", "/", "=").Replace("ark:/13030/m5test00"), "v1", "system", "mrt-erc.txt")])
	require.Contains(t, erc, "where: ark:/13030/m5test00\n")
	require.Contains(t, erc, "who: tester\n")

	// One callback per job; working directories are gone.
	cbs := e.fs.callbacks()
	require.Len(t, cbs, 20)
	for _, cb := range cbs {
		require.Equal(t, ingest.JobCompleted, cb.Status)
		require.Equal(t, batch, cb.BatchID)
		require.NotEmpty(t, cb.Identifier)
	}
	entries, err := os.ReadDir(e.work)
	require.NoError(t, err)
	require.Empty(t, entries, "completed jobs delete their working directories")
}

// history renders transitions as "From>To".
func history(h []ingest.Transition) []string {
	out := make([]string, len(h))
	for i, t := range h {
		out[i] = t.From + ">" + t.To
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
