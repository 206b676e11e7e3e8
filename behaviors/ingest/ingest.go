// Package ingest holds the built-in behaviors ingest.batch and ingest.job:
// the Merritt ingest queue on stint.
//
// A depositor submits a batch (ingest.batch): a submitter, a profile (the
// collection) and a payload, one file URL or a checkm-style manifest listing
// the files of one or more objects. The params are checked when they are
// decoded, so a bad URL scheme, a malformed manifest line or an unknown
// digest algorithm is refused at submit and stores nothing.
//
// The batch's run spawns one ingest.job per object, with ids derived from
// the batch id and the object's index and the profile as group key, and
// waits for them without holding a worker. When its last job has ended it
// reports (the succeeded and failed job ids) and ends Completed, or Failed
// if any job failed. A Failed batch is re-reported (UpdateReporting) once
// its requeued jobs have ended.
//
// A job carries its object through the stages Estimating (HTTP HEAD),
// Provisioning (free disk space), Downloading (GET with bounded
// parallelism, retries and digest checks), Processing (an identifier minted
// once, a metadata file), Storing (into a storage directory laid out by
// identifier and version), Recording (inventory rows committed together
// with the stage checkpoint) and Notify (the profile's callback). After each
// stage it checkpoints its Merritt state (JobProgress) in the task's
// progress, so a retry, a takeover after a crash or an admin requeue
// resumes after the last successful stage. A failing stage sends the job to
// Failed, where it stays until an admin requeues it (Admin.Requeue).
//
// Processing looks the object's local id up in the inventory: an object
// deposited again under its local id is a new version of the stored object
// and gets its identifier; a manifest that names another identifier for it
// fails the job. Estimating lowers the priority of a large job
// (Config.LargeJobBytes) so that small jobs go first. A Notifier
// (Config.Notifier, e.g. an SMTPNotifier) tells the depositors when their
// batch is queued and when its report is made.
//
// Holds: the group key of batches and jobs is the profile name, so
// Admin.HoldCollection (a stint group hold) keeps the collection's batches
// and jobs from being claimed, and moves its Pending ones to Held; a batch
// or job picked up while its collection is held moves itself to Held.
// ReleaseCollection moves them back to Pending. One submitted during the
// hold is not picked up, so it stays Pending in its progress and is shown
// as Held.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/mail"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// The behavior ids.
const (
	BatchBehavior api.BehaviorID = "ingest.batch"
	JobBehavior   api.BehaviorID = "ingest.job"
)

// Batch is the kind of ingest.batch.
var Batch = api.Kind[BatchParams, BatchResult]{ID: BatchBehavior}

// Job is the kind of ingest.job.
var Job = api.Kind[JobParams, JobResult]{ID: JobBehavior}

// Profile holds the settings of one profile (collection).
type Profile struct {
	// CallbackURL receives a POST with a JSON summary of every job that
	// reaches Notify. Empty: no callback.
	CallbackURL string `json:"callback_url,omitempty"`
	// Notify are the depositors' mail addresses that Config.Notifier
	// tells when a batch of the profile is queued and when its report is
	// made. Empty: no one is told.
	Notify []string `json:"notify,omitempty"`
}

// Config configures the ingest behaviors of a server.
type Config struct {
	// WorkDir holds the jobs' working directories. Required.
	WorkDir string
	// StorageDir is the object store: StorageDir/ID/vN/{producer,system}/.
	// Required.
	StorageDir string
	// Pool is the stint database, where the inventory lives (the recording
	// stage commits its rows together with its checkpoint). Required unless
	// OpenPool is set.
	Pool *pgxpool.Pool
	// OpenPool opens the pool on first use, for processes that build their
	// registry before they open the database. It is called until it
	// succeeds once; its pool is kept.
	OpenPool func(ctx context.Context) (*pgxpool.Pool, error)
	// Tasks lists a batch's jobs. Defaults to the Tasks of the server the
	// behaviors run on, handed to them when it starts.
	Tasks api.Tasks
	// Profiles are the known profiles by name. A profile not listed has
	// no callback.
	Profiles map[string]Profile
	// HTTPClient fetches files and posts callbacks. Defaults to a client
	// with a 30-second response header timeout.
	HTTPClient *http.Client
	// FreeSpace returns the free bytes of the filesystem holding dir.
	// Defaults to statfs(2); tests replace it.
	FreeSpace func(dir string) (uint64, error)
	// ReserveBytes is kept free besides a job's estimate: provisioning
	// waits while free space < estimate + ReserveBytes.
	ReserveBytes uint64
	// ProvisionRecheck is how long a job waits in Provisioning before it
	// checks the free space again. Defaults to 30 seconds.
	ProvisionRecheck time.Duration
	// Parallelism caps the concurrent HTTP requests of one job. Defaults
	// to 4.
	Parallelism int
	// HTTPAttempts is how many times a download or callback is tried.
	// Defaults to 3.
	HTTPAttempts int
	// RetryBackoff is the pause before the second try; it doubles with
	// each further try. Defaults to 1 second.
	RetryBackoff time.Duration
	// Lease is the lease of both behaviors. Defaults to 30 seconds.
	Lease time.Duration
	// JobsPerCollection caps the running jobs per profile across all
	// nodes (stint's GroupConcurrency). Zero: no cap.
	JobsPerCollection int
	// JobsPerNode caps the jobs one node runs at once. Zero: no cap.
	JobsPerNode int
	// BatchWaitMax is the longest a batch sleeps waiting for its jobs
	// before it looks again. Defaults to 10 minutes.
	BatchWaitMax time.Duration
	// ChildPoll is how often a batch looks at its jobs while it waits for
	// requeued ones, which the engine does not count as pending children.
	// Defaults to 5 seconds.
	ChildPoll time.Duration
	// LargeJobBytes is the estimated payload size from which a job is
	// large: estimating then lowers its priority to LargeJobPriority, so
	// that the small jobs waiting behind it (in provisioning, or after a
	// retry) are picked up first. Defaults to 1 GB (10^9 bytes); negative
	// turns the rule off.
	LargeJobBytes int64
	// LargeJobPriority is the priority of a large job, 0 to 32767, lower
	// first. A job that already has a lower priority (a higher number)
	// keeps it. Defaults to 10 (the default priority is 5).
	LargeJobPriority int
	// Notifier tells depositors when their batch is queued and when its
	// report is made (see NewSMTPNotifier). A failed notification is
	// logged and recorded in the batch's progress; it does not fail the
	// batch. Nil, the default, sends nothing.
	Notifier Notifier
	// Mint returns a new identifier. Defaults to a local minter of
	// ark:/99999/fk4... identifiers.
	Mint func(ctx context.Context) (string, error)
	// Logger receives the behaviors' logs. Defaults to slog.Default().
	Logger *slog.Logger
}

// The defaults of the large-job rule.
const (
	DefaultLargeJobBytes    = 1_000_000_000
	DefaultLargeJobPriority = 10
)

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			ResponseHeaderTimeout: 30 * time.Second,
			IdleConnTimeout:       90 * time.Second,
			MaxIdleConnsPerHost:   16,
		}}
	}
	if c.FreeSpace == nil {
		c.FreeSpace = StatfsFree
	}
	if c.ProvisionRecheck <= 0 {
		c.ProvisionRecheck = 30 * time.Second
	}
	if c.Parallelism <= 0 {
		c.Parallelism = 4
	}
	if c.HTTPAttempts <= 0 {
		c.HTTPAttempts = 3
	}
	if c.RetryBackoff <= 0 {
		c.RetryBackoff = time.Second
	}
	if c.Lease <= 0 {
		c.Lease = 30 * time.Second
	}
	if c.BatchWaitMax <= 0 {
		c.BatchWaitMax = 10 * time.Minute
	}
	if c.ChildPoll <= 0 {
		c.ChildPoll = 5 * time.Second
	}
	if c.LargeJobBytes == 0 {
		c.LargeJobBytes = DefaultLargeJobBytes
	}
	if c.LargeJobPriority == 0 {
		c.LargeJobPriority = DefaultLargeJobPriority
	}
	if c.Mint == nil {
		c.Mint = MintLocal
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// StatfsFree returns the bytes available to unprivileged users on the
// filesystem holding dir (statfs(2)).
func StatfsFree(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return st.Bavail * uint64(st.Bsize), nil
}

// env is what both behaviors share: the configuration and the lazily
// connected database.
type env struct {
	cfg Config
	log *slog.Logger

	mu    sync.Mutex
	pool  *pgxpool.Pool
	tasks api.Tasks
}

// db returns the pool and the task API, opening the pool on first use.
func (e *env) db(ctx context.Context) (*pgxpool.Pool, api.Tasks, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.tasks == nil {
		return nil, nil, errors.New("ingest: no Tasks: set Config.Tasks or run the behaviors on a started server")
	}
	if e.pool == nil {
		pool, err := e.cfg.OpenPool(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("ingest: open the database: %w", err)
		}
		e.pool = pool
	}
	return e.pool, e.tasks, nil
}

// collectionHeld reports whether a profile's collection is held: whether
// its group key is. A Tasks that cannot list held groups holds none.
func (e *env) collectionHeld(ctx context.Context, profile string) (bool, error) {
	_, tasks, err := e.db(ctx)
	if err != nil {
		return false, err
	}
	h, ok := tasks.(interface {
		HeldGroups(ctx context.Context) ([]string, error)
	})
	if !ok {
		return false, nil
	}
	keys, err := h.HeldGroups(ctx)
	if err != nil {
		return false, fmt.Errorf("ingest: list the held collections: %w", err)
	}
	return slices.Contains(keys, profile), nil
}

// start takes the server's Tasks when none was configured.
func (e *env) start(tasks api.Tasks) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.tasks == nil {
		e.tasks = tasks
	}
}

// Register adds ingest.batch and ingest.job to reg, configured to run on
// a server. It checks the configuration; the directories are created when
// a job first needs them.
func Register(reg *spi.Registry, cfg Config) error {
	if cfg.WorkDir == "" || cfg.StorageDir == "" {
		return errors.New("register ingest: Config.WorkDir and Config.StorageDir are required")
	}
	if cfg.Pool == nil && cfg.OpenPool == nil {
		return errors.New("register ingest: Config.Pool (or Config.OpenPool) is required")
	}
	for name, p := range cfg.Profiles {
		if p.CallbackURL != "" {
			if err := checkURL(p.CallbackURL); err != nil || strings.HasPrefix(strings.ToLower(p.CallbackURL), "file:") {
				return fmt.Errorf("register ingest: profile %s: callback %q: want an http or https URL", name, p.CallbackURL)
			}
		}
		for _, a := range p.Notify {
			if _, err := mail.ParseAddress(a); err != nil {
				return fmt.Errorf("register ingest: profile %s: notify address %q: %w", name, a, err)
			}
		}
	}
	if cfg.LargeJobPriority < 0 || cfg.LargeJobPriority > 32767 {
		return fmt.Errorf("register ingest: Config.LargeJobPriority %d: want 0 to 32767", cfg.LargeJobPriority)
	}
	var err error
	if cfg.WorkDir, err = filepath.Abs(cfg.WorkDir); err != nil {
		return fmt.Errorf("register ingest: work dir: %w", err)
	}
	if cfg.StorageDir, err = filepath.Abs(cfg.StorageDir); err != nil {
		return fmt.Errorf("register ingest: storage dir: %w", err)
	}
	cfg = cfg.withDefaults()
	e := &env{cfg: cfg, log: cfg.Logger, pool: cfg.Pool, tasks: cfg.Tasks}
	return register(reg, e)
}

// RegisterForSubmit adds ingest.batch and ingest.job to reg for a process
// that only submits and inspects them: their runs fail, as the process has
// no configuration to run them.
func RegisterForSubmit(reg *spi.Registry) error {
	return register(reg, nil)
}

func register(reg *spi.Registry, e *env) error {
	if err := spi.Register(reg, spi.Behavior[BatchParams, BatchResult](&batchBehavior{starter{e}, e})); err != nil {
		return fmt.Errorf("register ingest: %w", err)
	}
	if err := spi.Register(reg, spi.Behavior[JobParams, JobResult](&jobBehavior{starter{e}, e})); err != nil {
		return fmt.Errorf("register ingest: %w", err)
	}
	return nil
}

// errNotConfigured fails runs in a process registered for submits only.
var errNotConfigured = api.Permanent("not_configured", "ingest behaviors are registered for submits only in this process")

// retention is how long finished batches and jobs are kept: as long as
// failed tasks are by default, so that a Failed batch awaiting requeues
// still finds its completed jobs.
const retention = 30 * 24 * time.Hour

// policy returns the policy shared by both behaviors: a submit of an
// existing id changes nothing (a batch's re-spawn of its jobs is a no-op).
func (e *env) policy() spi.Policy {
	p := spi.Policy{Dedup: spi.DedupShare, Retention: retention, FailureRetention: retention}
	if e != nil {
		p.Lease = e.cfg.Lease
	}
	return p
}

// starter hands the server's Tasks to the env; both behaviors embed it.
type starter struct{ env *env }

// Start implements spi.Starter: it keeps the server's Tasks for listing a
// batch's jobs, unless Config.Tasks was set.
func (s starter) Start(_ context.Context, tasks api.Tasks) error {
	if s.env != nil {
		s.env.start(tasks)
	}
	return nil
}
