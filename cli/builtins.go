package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/mail"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stinthq/stint/behaviors/cleanup"
	"github.com/stinthq/stint/behaviors/demo"
	"github.com/stinthq/stint/behaviors/ingest"
	"github.com/stinthq/stint/behaviors/replication"
	"github.com/stinthq/stint/spi"
	"github.com/stinthq/stint/store"
	"github.com/stinthq/stint/store/postgres"
)

// Environment variables that configure the ingest behaviors of a server.
const (
	// envIngestDir is the directory of the ingest working directories
	// (DIR/work) and object storage (DIR/storage).
	envIngestDir = "STINT_INGEST_DIR"
	// envIngestProfiles is a JSON file of profiles:
	// {"NAME": {"callback_url": "https://..."}}.
	envIngestProfiles = "STINT_INGEST_PROFILES"
	// envIngestSMTP turns on the depositors' notifications by mail:
	// smtp://[user:password@]host:port?from=ADDRESS. Unset: none.
	envIngestSMTP = "STINT_INGEST_SMTP"
	// envIngestLargeBytes and envIngestLargePriority set the large-job
	// rule: a job estimated at the size or more gets the priority.
	envIngestLargeBytes    = "STINT_INGEST_LARGE_JOB_BYTES"
	envIngestLargePriority = "STINT_INGEST_LARGE_JOB_PRIORITY"
)

// builtins wires stint's built-in behaviors (demo, ingest, replication,
// cleanup) for one run of the command line. The ingest, replication and
// cleanup behaviors work on the stint database beyond the task API. A
// server's registry hands them its store; a registry for submitting and
// inspecting only is built before the command opens its database, so they
// open the database the command opened on first use (which a client never
// does: it runs nothing). close releases what they opened.
type builtins struct {
	log *slog.Logger

	mu sync.Mutex
	// dsn is the database the command opened, recorded by openStore.
	dsn string
	// ingestDir, ingestPool and ingestProfiles are set by `stint dev`
	// before it builds its server's registry; empty, the environment's
	// settings apply.
	ingestDir      string
	ingestPool     *pgxpool.Pool
	ingestProfiles map[string]ingest.Profile
	// stores are the stores opened on first use, by URL.
	stores map[string]*postgres.Store
}

// setDatabase records the database the command opened.
func (b *builtins) setDatabase(dsn string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dsn = dsn
}

// setIngest configures the ingest behaviors of the registries built after
// it: their directory, inventory pool and profiles.
func (b *builtins) setIngest(dir string, pool *pgxpool.Pool, profiles map[string]ingest.Profile) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ingestDir, b.ingestPool, b.ingestProfiles = dir, pool, profiles
}

// registry returns a registry of the built-in behaviors and those of
// extra, wired to st (nil for a registry that runs nothing). A behavior of
// extra with a built-in's id is an error.
func (b *builtins) registry(st *postgres.Store, extra *spi.Registry) (*spi.Registry, error) {
	reg := spi.NewRegistry()
	for _, register := range []func(*spi.Registry) error{
		demo.Register,
		func(reg *spi.Registry) error { return b.registerIngest(reg, st) },
		func(reg *spi.Registry) error { return b.registerReplication(reg, st) },
		func(reg *spi.Registry) error { return b.registerCleanup(reg, st) },
	} {
		if err := register(reg); err != nil {
			return nil, fmt.Errorf("register the built-in behaviors: %w", err)
		}
	}
	if extra != nil {
		if err := reg.Merge(extra); err != nil {
			return nil, fmt.Errorf("register the program's behaviors: %w", err)
		}
	}
	return reg, nil
}

// openStore returns the store of the database the command opened, opening
// it on first use.
func (b *builtins) openStore(ctx context.Context) (*postgres.Store, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	dsn := b.dsn
	if dsn == "" && b.ingestPool != nil {
		dsn = b.ingestPool.Config().ConnString()
	}
	if dsn == "" {
		dsn = os.Getenv(envDatabaseURL)
	}
	if dsn == "" {
		return nil, fmt.Errorf("no stint database for the built-in behaviors: pass --db or set %s", envDatabaseURL)
	}
	if st := b.stores[dsn]; st != nil {
		return st, nil
	}
	st, err := postgres.Open(ctx, dsn, postgres.MaxConns(4), postgres.PollOnly())
	if err != nil {
		return nil, fmt.Errorf("open the stint database for the built-in behaviors: %w", err)
	}
	if b.stores == nil {
		b.stores = map[string]*postgres.Store{}
	}
	b.stores[dsn] = st
	return st, nil
}

// close closes the stores opened on first use.
func (b *builtins) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for dsn, st := range b.stores {
		st.Close()
		delete(b.stores, dsn)
	}
}

// openPool returns the pool of st, or of the store opened on first use.
func (b *builtins) openPool(st *postgres.Store) func(context.Context) (*pgxpool.Pool, error) {
	return func(ctx context.Context) (*pgxpool.Pool, error) {
		if st != nil {
			return st.Pool(), nil
		}
		st, err := b.openStore(ctx)
		if err != nil {
			return nil, err
		}
		return st.Pool(), nil
	}
}

// registerIngest registers ingest.batch and ingest.job. The inventory lives
// in the stint database: dev's pool, st's, or the one opened on first use.
func (b *builtins) registerIngest(reg *spi.Registry, st *postgres.Store) error {
	b.mu.Lock()
	dir, pool, profiles := b.ingestDir, b.ingestPool, b.ingestProfiles
	b.mu.Unlock()
	if st != nil {
		pool = st.Pool()
	}
	if dir == "" {
		dir = os.Getenv(envIngestDir)
	}
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "stint-ingest")
	}
	if profiles == nil {
		profiles = readIngestProfiles(b.log)
	}
	cfg := ingest.Config{
		WorkDir:    filepath.Join(dir, "work"),
		StorageDir: filepath.Join(dir, "storage"),
		Pool:       pool,
		Profiles:   profiles,
		Logger:     b.log,
		OpenPool:   b.openPool(nil),
	}
	if st != nil {
		// Only a server runs the behaviors: a bad setting fails its start,
		// not every command.
		if err := readIngestSettings(&cfg); err != nil {
			return err
		}
	}
	return ingest.Register(reg, cfg)
}

// readIngestSettings sets the notifier and the large-job rule of cfg from
// the environment. A bad value is an error naming its variable.
func readIngestSettings(cfg *ingest.Config) error {
	if raw := os.Getenv(envIngestSMTP); raw != "" {
		sc, err := ingest.ParseSMTPURL(raw)
		if err != nil {
			return fmt.Errorf("$%s: %w", envIngestSMTP, err)
		}
		n, err := ingest.NewSMTPNotifier(sc)
		if err != nil {
			return fmt.Errorf("$%s: %w", envIngestSMTP, err)
		}
		cfg.Notifier = n
	}
	if raw := os.Getenv(envIngestLargeBytes); raw != "" {
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return fmt.Errorf("$%s: %q is not a number of bytes (negative: off)", envIngestLargeBytes, raw)
		}
		cfg.LargeJobBytes = n
	}
	if raw := os.Getenv(envIngestLargePriority); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil || n < 0 || n > 32767 {
			return fmt.Errorf("$%s: %q is not a priority from 0 to 32767", envIngestLargePriority, raw)
		}
		cfg.LargeJobPriority = n
	}
	return nil
}

// readIngestProfiles reads $STINT_INGEST_PROFILES. A file that cannot be
// used is logged and ignored: building a registry must not fail on it.
func readIngestProfiles(log *slog.Logger) map[string]ingest.Profile {
	path := os.Getenv(envIngestProfiles)
	if path == "" {
		return nil
	}
	raw, err := os.ReadFile(path)
	var profiles map[string]ingest.Profile
	if err == nil {
		err = json.Unmarshal(raw, &profiles)
	}
	if err != nil {
		log.Error("stint: ignoring the ingest profiles: callbacks are off", "file", path, "err", err)
		return nil
	}
	for name, p := range profiles {
		if u := strings.ToLower(p.CallbackURL); u != "" && !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			log.Error("stint: ignoring an ingest profile: its callback is not an http(s) URL", "profile", name)
			delete(profiles, name)
		}
		if p, ok := profiles[name]; ok {
			p.Notify = slices.DeleteFunc(p.Notify, func(a string) bool {
				_, err := mail.ParseAddress(a)
				if err != nil {
					log.Error("stint: ignoring an ingest profile's notify address", "profile", name, "address", a, "err", err)
				}
				return err != nil
			})
			profiles[name] = p
		}
	}
	return profiles
}

// registerReplication registers replication and replication.continuous,
// working on st, or on the store opened on first use.
func (b *builtins) registerReplication(reg *spi.Registry, st *postgres.Store) error {
	return replication.Register(reg, replication.Config{OpenDB: b.openPool(st), Logger: b.log})
}

// registerCleanup registers the cleanup behavior for the behaviors of reg,
// working on st, or on the store opened on first use.
func (b *builtins) registerCleanup(reg *spi.Registry, st *postgres.Store) error {
	if st == nil {
		return cleanup.Register(reg, lazyStore{b}, cleanup.Config{})
	}
	return cleanup.Register(reg, st, cleanup.Config{})
}

// lazyStore is the cleanup behavior's store in a registry that runs
// nothing: the store opened on first use.
type lazyStore struct{ b *builtins }

// DeleteFinished deletes a batch of old finished tasks; see store.Store.
func (l lazyStore) DeleteFinished(ctx context.Context, p store.DeleteFinishedParams) (int, error) {
	st, err := l.b.openStore(ctx)
	if err != nil {
		return 0, err
	}
	return st.DeleteFinished(ctx, p)
}

// DeleteExpired deletes a batch of tasks past their own retention; see
// store.Store.
func (l lazyStore) DeleteExpired(ctx context.Context, limit int) (map[string]int, error) {
	st, err := l.b.openStore(ctx)
	if err != nil {
		return nil, err
	}
	return st.DeleteExpired(ctx, limit)
}

// Maintain drops dead feed consumers and nodes and trims the feed; see
// store.Store.
func (l lazyStore) Maintain(ctx context.Context, p store.MaintainParams) (store.MaintainResult, error) {
	st, err := l.b.openStore(ctx)
	if err != nil {
		return store.MaintainResult{}, err
	}
	return st.Maintain(ctx, p)
}
