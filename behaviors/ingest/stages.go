package ingest

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// Working directory layout.
func (j *jobRun) producerDir() string { return filepath.Join(j.prog.WorkDir, "producer") }
func (j *jobRun) systemDir() string   { return filepath.Join(j.prog.WorkDir, "system") }

// estimate sizes the payload with HEAD requests. It never fails: a size it
// cannot learn is the manifest's, or 0.
func (j *jobRun) estimate(ctx context.Context) error {
	files := j.params.Object.Files
	sizes := make([]int64, len(files))
	parallel(ctx, j.cfg.Parallelism, len(files), func(ctx context.Context, i int) error {
		size, err := headSize(ctx, j.cfg.HTTPClient, files[i].URL)
		switch {
		case err == nil && size >= 0:
			sizes[i] = size
		case files[i].Size != nil:
			sizes[i] = *files[i].Size
		}
		if err != nil {
			j.env.log.Debug("ingest: size unknown", "job", j.id, "url", files[i].URL, "err", err)
		}
		return nil
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var total int64
	for _, s := range sizes {
		total += s
	}
	j.prog.SpaceNeeded = total
	if err := j.prioritize(ctx); err != nil {
		if errors.Is(err, api.ErrHalt) || ctx.Err() != nil {
			return err
		}
		// Estimating does not fail: the job goes on at its priority.
		j.env.log.Warn("ingest: cannot lower the priority of a large job", "job", j.id, "err", err)
	}
	return nil
}

// prioritize lowers the priority of a large job (LargeJobBytes and up) to
// LargeJobPriority, unless it is lower already. The running claim goes
// on; the priority orders the job's later pickups.
func (j *jobRun) prioritize(ctx context.Context) error {
	if j.cfg.LargeJobBytes < 0 || j.prog.SpaceNeeded < j.cfg.LargeJobBytes {
		return nil
	}
	_, tasks, err := j.env.db(ctx)
	if err != nil {
		return err
	}
	t, err := tasks.Get(ctx, j.id)
	if err != nil {
		return fmt.Errorf("read the priority of %s: %w", j.id, err)
	}
	if t.Priority >= j.cfg.LargeJobPriority {
		return nil
	}
	if err := j.rc.SetPriority(ctx, j.cfg.LargeJobPriority); err != nil {
		return fmt.Errorf("lower the priority of a large job: %w", err)
	}
	j.env.log.Info("ingest: large job: priority lowered", "job", j.id, "space_needed", j.prog.SpaceNeeded,
		"from", t.Priority, "to", j.cfg.LargeJobPriority)
	return nil
}

// provision checks that the working directory's filesystem has room for the
// estimate. Without room the job waits in Provisioning: it snoozes and
// checks again. It never fails.
func (j *jobRun) provision(ctx context.Context) error {
	need := uint64(max(j.prog.SpaceNeeded, 0)) + j.cfg.ReserveBytes
	var free uint64
	err := os.MkdirAll(j.cfg.WorkDir, 0o755)
	if err == nil {
		free, err = j.cfg.FreeSpace(j.cfg.WorkDir)
	}
	if err == nil && free >= need {
		return nil
	}
	note := fmt.Sprintf("waiting for disk space: %d bytes needed, %d free", need, free)
	if err != nil {
		note = fmt.Sprintf("waiting: cannot learn the free disk space: %v", err)
	}
	j.prog.Note = note
	if err := j.checkpoint(ctx); err != nil {
		return err
	}
	j.env.log.Info("ingest: job waits in provisioning", "job", j.id, "note", note)
	return spi.Snooze(j.cfg.ProvisionRecheck)
}

// download fetches every file into the working directory with bounded
// parallelism and retries, verifying digests. Files downloaded by an
// earlier run and still present are kept.
func (j *jobRun) download(ctx context.Context) error {
	if err := os.MkdirAll(j.producerDir(), 0o755); err != nil {
		return fmt.Errorf("create working directory: %w", err)
	}
	if j.prog.Downloaded == nil {
		j.prog.Downloaded = map[string]FileResult{}
	}
	files := j.params.Object.Files
	err := parallel(ctx, j.cfg.Parallelism, len(files), func(ctx context.Context, i int) error {
		f := files[i]
		dest := filepath.Join(j.producerDir(), filepath.FromSlash(f.Name))
		j.mu.Lock()
		done, ok := j.prog.Downloaded[f.Name]
		j.mu.Unlock()
		if ok {
			if fi, err := os.Stat(dest); err == nil && fi.Size() == done.Size {
				return nil
			}
		}
		res, err := fetchFile(ctx, j.cfg, f, dest)
		if err != nil {
			return err
		}
		j.mu.Lock()
		j.prog.Downloaded[f.Name] = res
		err = j.rc.Checkpoint(ctx, j.prog)
		j.mu.Unlock()
		return err
	})
	if err != nil {
		return err
	}
	var total int64
	for _, f := range files {
		total += j.prog.Downloaded[f.Name].Size
	}
	j.prog.SpaceNeeded = total
	return nil
}

// process assigns the identifier (see identify; checkpointed at once, so
// that a retry never mints again) and writes the metadata files.
func (j *jobRun) process(ctx context.Context) error {
	if j.prog.Identifier == "" {
		if err := j.identify(ctx); err != nil {
			return err
		}
		if err := j.checkpoint(ctx); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(j.systemDir(), 0o755); err != nil {
		return fmt.Errorf("create working directory: %w", err)
	}
	p := j.params
	who := p.Creator
	if who == "" {
		who = p.Submitter
	}
	what := p.Title
	if what == "" {
		what = p.Object.LocalID
	}
	erc := fmt.Sprintf("erc:\nwho: %s\nwhat: %s\nwhen: %s\nwhere: %s\n", ercValue(who), ercValue(what),
		ercValue(p.Date), j.prog.Identifier)
	if p.Object.LocalID != "" {
		erc += "where: " + ercValue(p.Object.LocalID) + "\n"
	}
	if err := writeFileAtomic(filepath.Join(j.systemDir(), "mrt-erc.txt"), []byte(erc)); err != nil {
		return err
	}
	meta, err := json.MarshalIndent(j.summary(), "", "  ")
	if err != nil {
		return fmt.Errorf("encode metadata: %w", err)
	}
	return writeFileAtomic(filepath.Join(j.systemDir(), "mrt-ingest.json"), meta)
}

// identify sets the object's identifier. An object with a local id that
// the inventory holds already (for the same profile) is a new version of
// that object: it gets the stored identifier, and a manifest that gives
// another one fails the job (local_id_mismatch), as the two name different
// objects. Otherwise the manifest's identifier is taken, or a new one is
// minted.
func (j *jobRun) identify(ctx context.Context) error {
	obj := j.params.Object
	var stored string
	if obj.LocalID != "" {
		pool, _, err := j.env.db(ctx)
		if err != nil {
			return err
		}
		if stored, err = lookupLocalID(ctx, pool, j.params.Profile, obj.LocalID); err != nil {
			return err
		}
	}
	switch {
	case stored != "" && obj.Identifier != "" && obj.Identifier != stored:
		return api.Permanent("local_id_mismatch",
			"local id %q of profile %s is stored as %s, but the manifest gives the identifier %s",
			obj.LocalID, j.params.Profile, stored, obj.Identifier)
	case stored != "":
		j.prog.Identifier, j.prog.Reused = stored, true
	case obj.Identifier != "":
		j.prog.Identifier = obj.Identifier
	default:
		id, err := j.cfg.Mint(ctx)
		if err != nil {
			return api.Permanent("mint_failed", "mint an identifier: %v", err)
		}
		if err := checkIdentifier(id); err != nil {
			return api.Permanent("mint_failed", "minted %v", err)
		}
		j.prog.Identifier, j.prog.Minted = id, true
	}
	return nil
}

// lookupLocalID returns the identifier the inventory holds for a local id
// of a profile (that of its latest version), or "" when it holds none.
func lookupLocalID(ctx context.Context, pool *pgxpool.Pool, profile, localID string) (string, error) {
	var id string
	err := pool.QueryRow(ctx, `
		SELECT identifier FROM stint_ingest_object
		WHERE profile = $1 AND local_id = $2
		ORDER BY created_at DESC, version DESC LIMIT 1`, profile, localID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("look up local id %q of profile %s: %w", localID, profile, err)
	}
	return id, nil
}

// ercValue keeps an ERC value on one line.
func ercValue(s string) string {
	if s == "" {
		return "(:unas)"
	}
	return strings.NewReplacer("\n", " ", "\r", " ").Replace(s)
}

// Summary describes a job's object: the metadata file and the callback
// body.
type Summary struct {
	JobID      api.TaskID    `json:"job_id"`
	BatchID    api.TaskID    `json:"batch_id"`
	Profile    string        `json:"profile"`
	Submitter  string        `json:"submitter"`
	LocalID    string        `json:"local_id,omitempty"`
	Identifier string        `json:"identifier"`
	Version    int           `json:"version,omitempty"`
	Status     JobState      `json:"status"`
	RetryCount int           `json:"retry_count"`
	Files      []SummaryFile `json:"files"`
}

// SummaryFile is one file of a Summary.
type SummaryFile struct {
	Name      string `json:"name"`
	Size      int64  `json:"size"`
	SHA256    string `json:"sha256"`
	DigestAlg string `json:"digest_alg,omitempty"`
	Digest    string `json:"digest,omitempty"`
	URL       string `json:"url"`
}

func (j *jobRun) summary() Summary {
	s := Summary{JobID: j.id, BatchID: j.params.BatchID, Profile: j.params.Profile, Submitter: j.params.Submitter,
		LocalID: j.params.Object.LocalID, Identifier: j.prog.Identifier, Version: j.prog.Version,
		Status: j.prog.state(), RetryCount: j.prog.RetryCount}
	for _, f := range j.params.Object.Files {
		d := j.prog.Downloaded[f.Name]
		s.Files = append(s.Files, SummaryFile{Name: f.Name, Size: d.Size, SHA256: d.SHA256,
			DigestAlg: f.DigestAlg, Digest: f.Digest, URL: f.URL})
	}
	return s
}

// store copies the object into storage as a new version. The version is
// claimed (its directory created) and checkpointed before the first file
// is copied, so a retried stage overwrites the same version instead of
// storing the files again.
func (j *jobRun) store(ctx context.Context) error {
	objDir := filepath.Join(j.cfg.StorageDir, storageName(j.prog.Identifier))
	if j.prog.Version == 0 {
		pool, _, err := j.env.db(ctx)
		if err != nil {
			return err
		}
		v, err := claimVersion(ctx, pool, objDir, j.prog.Identifier)
		if err != nil {
			return err
		}
		j.prog.Version = v
		j.prog.StoragePath = filepath.Join(objDir, fmt.Sprintf("v%d", v))
		if err := j.checkpoint(ctx); err != nil {
			return err
		}
	}
	for _, f := range j.params.Object.Files {
		src := filepath.Join(j.producerDir(), filepath.FromSlash(f.Name))
		dst := filepath.Join(j.prog.StoragePath, "producer", filepath.FromSlash(f.Name))
		if err := copyFileAtomic(src, dst); err != nil {
			return err
		}
	}
	for _, name := range []string{"mrt-erc.txt", "mrt-ingest.json"} {
		if err := copyFileAtomic(filepath.Join(j.systemDir(), name), filepath.Join(j.prog.StoragePath, "system", name)); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// claimVersion picks the next version of an object, after those in storage
// and in the inventory, and claims it by creating its directory.
func claimVersion(ctx context.Context, pool *pgxpool.Pool, objDir, identifier string) (int, error) {
	var recorded int
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM stint_ingest_object WHERE identifier = $1`,
		identifier).Scan(&recorded); err != nil {
		return 0, fmt.Errorf("read the inventory's versions of %s: %w", identifier, err)
	}
	if err := os.MkdirAll(objDir, 0o755); err != nil {
		return 0, fmt.Errorf("create the object's storage directory: %w", err)
	}
	v := max(recorded, lastStoredVersion(objDir)) + 1
	for ; ; v++ {
		err := os.Mkdir(filepath.Join(objDir, fmt.Sprintf("v%d", v)), 0o755)
		if err == nil {
			return v, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return 0, fmt.Errorf("claim version %d of %s: %w", v, identifier, err)
		}
	}
}

// lastStoredVersion returns the highest vN directory in objDir, or 0.
func lastStoredVersion(objDir string) int {
	entries, _ := os.ReadDir(objDir)
	last := 0
	for _, e := range entries {
		var v int
		if _, err := fmt.Sscanf(e.Name(), "v%d", &v); err == nil && e.IsDir() && v > last {
			last = v
		}
	}
	return last
}

// storageName maps an identifier to a directory name as pairtree does
// (':' -> '+', '/' -> '=', '.' -> ','): identifiers hold none of the
// replacements, so distinct identifiers get distinct names.
func storageName(identifier string) string {
	return strings.NewReplacer(":", "+", "/", "=", ".", ",").Replace(identifier)
}

// record writes the inventory rows of the object and its files, and moves
// the job on to Notify, in one transaction: either both commit or neither.
func (j *jobRun) record(ctx context.Context) error {
	pool, _, err := j.env.db(ctx)
	if err != nil {
		return err
	}
	next := j.prog
	next.History = slices.Clone(j.prog.History)
	if err := next.Transition(JobNotify, time.Now().UTC()); err != nil {
		return api.Permanent("bad_state", "%v", err)
	}
	sum := j.summary()
	var total int64
	names := make([]string, len(sum.Files))
	sizes := make([]int64, len(sum.Files))
	shas, algs, digests, urls, paths := make([]string, len(sum.Files)), make([]*string, len(sum.Files)),
		make([]*string, len(sum.Files)), make([]string, len(sum.Files)), make([]string, len(sum.Files))
	for i, f := range sum.Files {
		total += f.Size
		names[i], sizes[i], shas[i], urls[i] = f.Name, f.Size, f.SHA256, f.URL
		paths[i] = filepath.Join(j.prog.StoragePath, "producer", filepath.FromSlash(f.Name))
		if f.DigestAlg != "" {
			algs[i], digests[i] = &sum.Files[i].DigestAlg, &sum.Files[i].Digest
		}
	}
	var localID *string
	if sum.LocalID != "" {
		localID = &sum.LocalID
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var mine bool
		err := tx.QueryRow(ctx, `
			INSERT INTO stint_ingest_object (identifier, version, job_id, batch_id, profile, submitter, local_id,
			    file_count, total_bytes, storage_path)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
			ON CONFLICT (identifier, version) DO UPDATE SET job_id = EXCLUDED.job_id
			WHERE stint_ingest_object.job_id = EXCLUDED.job_id
			RETURNING true`,
			sum.Identifier, j.prog.Version, string(j.id), string(sum.BatchID), sum.Profile, sum.Submitter, localID,
			len(sum.Files), total, j.prog.StoragePath).Scan(&mine)
		if errors.Is(err, pgx.ErrNoRows) {
			return api.Permanent("inventory_conflict", "version %d of %s is recorded for another job", j.prog.Version, sum.Identifier)
		}
		if err != nil {
			return fmt.Errorf("record object %s v%d: %w", sum.Identifier, j.prog.Version, err)
		}
		if _, err := tx.Exec(ctx, `
			INSERT INTO stint_ingest_file (identifier, version, name, size, sha256, digest_alg, digest, source_url, storage_path)
			SELECT $1, $2, f.name, f.size, f.sha256, f.alg, f.digest, f.url, f.path
			FROM unnest($3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[])
			    AS f(name, size, sha256, alg, digest, url, path)
			ON CONFLICT (identifier, version, name) DO NOTHING`,
			sum.Identifier, j.prog.Version, names, sizes, shas, algs, digests, urls, paths); err != nil {
			return fmt.Errorf("record files of %s v%d: %w", sum.Identifier, j.prog.Version, err)
		}
		return j.rc.CheckpointTx(ctx, tx, next)
	})
	if err != nil {
		return err
	}
	j.mu.Lock()
	j.prog = next
	j.mu.Unlock()
	return nil
}

// notify posts the job's summary to the profile's callback URL, if any. A
// callback that fails after the retries fails the job here.
func (j *jobRun) notify(ctx context.Context) error {
	prof := j.cfg.Profiles[j.params.Profile]
	if prof.CallbackURL == "" {
		return nil
	}
	sum := j.summary()
	sum.Status = JobCompleted
	body, err := json.Marshal(sum)
	if err != nil {
		return fmt.Errorf("encode callback: %w", err)
	}
	return postCallback(ctx, j.cfg, prof.CallbackURL, body)
}

// MintLocal mints a new identifier locally: ark:/99999/fk4 followed by 12
// random base32 characters. 99999/fk4 is the ARK test shoulder.
func MintLocal(context.Context) (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("mint: %w", err)
	}
	s := strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
	return "ark:/99999/fk4" + s[:12], nil
}
