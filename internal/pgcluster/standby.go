package pgcluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// StartStandby makes a hot standby of c in dataDir and starts it: it copies
// c with pg_basebackup -R (which writes standby.signal and the
// primary_conninfo that makes the copy stream c's WAL), starts the copy on
// a free port, and waits until it accepts connections, which a standby does
// once it has replayed to a consistent state. dataDir must be missing or
// empty, and reachable by the server user (see ReachableDataDir). The
// standby has c's settings (Fast among them). It streams through a
// replication slot of its own on c, which its Stop drops. The
// wait is bounded by ctx and by DefaultStartTimeout.
func (c *Cluster) StartStandby(ctx context.Context, dataDir string) (*Cluster, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	slot, err := c.createSlot(ctx)
	if err != nil {
		return nil, err
	}
	dataDir, err = c.baseBackup(ctx, dataDir, "--write-recovery-conf", "--slot="+slot)
	if err != nil {
		_ = c.dropSlot(slot)
		return nil, err
	}
	standby, err := Start(ctx, Options{DataDir: dataDir, Fast: c.fast, Log: c.log})
	if err != nil {
		_ = c.dropSlot(slot)
		return nil, fmt.Errorf("pgcluster: start the standby: %w", err)
	}
	standby.primary, standby.slot = c, slot
	return standby, nil
}

// BaseBackup takes a physical base backup of c into dir with
// pg_basebackup while c runs, as an operator takes one to restore from:
// the data files, and the WAL written while they were copied, streamed
// through a temporary replication slot. Start on dir starts the restored
// cluster, which recovers to the backup's end point and then accepts
// writes as a new primary. BaseBackup returns that end point (the
// End-LSN of the backup's manifest): every transaction that committed
// before it is in the backup. dir must be missing or empty, and reachable
// by the server user (see ReachableDataDir). The backup is bounded by ctx
// and by DefaultStartTimeout.
func (c *Cluster) BaseBackup(ctx context.Context, dir string) (end string, err error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	dir, err = c.baseBackup(ctx, dir)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(dir, "backup_manifest"))
	if err != nil {
		return "", fmt.Errorf("pgcluster: read the backup's manifest: %w", err)
	}
	var manifest struct {
		WALRanges []struct {
			EndLSN string `json:"End-LSN"`
		} `json:"WAL-Ranges"`
	}
	if err := json.Unmarshal(b, &manifest); err != nil {
		return "", fmt.Errorf("pgcluster: parse the backup's manifest: %w", err)
	}
	if len(manifest.WALRanges) == 0 {
		return "", errors.New("pgcluster: the backup's manifest has no WAL range")
	}
	return manifest.WALRanges[len(manifest.WALRanges)-1].EndLSN, nil
}

// baseBackup copies c into dataDir (made absolute, which it returns) with
// pg_basebackup and the further args, as the server user, streaming the
// WAL written meanwhile and asking for an immediate checkpoint.
func (c *Cluster) baseBackup(ctx context.Context, dataDir string, args ...string) (string, error) {
	dataDir, err := filepath.Abs(dataDir)
	if err != nil {
		return "", fmt.Errorf("pgcluster: resolve backup directory %q: %w", dataDir, err)
	}
	if entries, err := os.ReadDir(dataDir); err == nil && len(entries) > 0 {
		return "", fmt.Errorf("pgcluster: backup directory %s is not empty", dataDir)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("pgcluster: inspect backup directory: %w", err)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", fmt.Errorf("pgcluster: create backup directory: %w", err)
	}
	if c.user != nil {
		if err := checkSearchable(filepath.Dir(dataDir), c.user); err != nil {
			return "", fmt.Errorf("pgcluster: %w", err)
		}
		if err := os.Chown(dataDir, int(c.user.uid), int(c.user.gid)); err != nil {
			return "", fmt.Errorf("pgcluster: give backup directory %s to user %s: %w", dataDir, c.user.name, err)
		}
	}
	var out bytes.Buffer
	cmd := c.command(ctx, "pg_basebackup", append([]string{
		"--pgdata=" + dataDir,
		"--host=127.0.0.1",
		"--port=" + strconv.Itoa(c.port),
		"--username=postgres",
		"--no-password",
		"--wal-method=stream",
		"--checkpoint=fast",
		"--no-sync",
	}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("pgcluster: pg_basebackup of 127.0.0.1:%d into %s failed: %w\n%s", c.port, dataDir, err, tail(out.Bytes(), 4096))
	}
	return dataDir, nil
}

// createSlot creates a physical replication slot on c that reserves WAL at
// once, and returns its name. The copy and then the standby stream through
// it, so c keeps the WAL they have not received yet: without it, the
// checkpoints that other sessions cause (CREATE DATABASE makes one) may
// remove a segment before the copy has streamed it.
func (c *Cluster) createSlot(ctx context.Context) (string, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("pgcluster: name a replication slot: %w", err)
	}
	slot := "stint_standby_" + hex.EncodeToString(b[:])
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		return "", fmt.Errorf("pgcluster: create replication slot: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `SELECT pg_create_physical_replication_slot($1, true)`, slot); err != nil {
		return "", fmt.Errorf("pgcluster: create replication slot: %w", err)
	}
	return slot, nil
}

// dropSlot drops the replication slot of a standby of c, which must not be
// streaming through it any more.
func (c *Cluster) dropSlot(slot string) error {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: drop replication slot %s: %w", slot, err)
	}
	defer conn.Close(ctx)
	for {
		// The primary's WAL sender may take a moment to notice that the
		// standby is gone and let go of the slot.
		_, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: drop replication slot %s: %w", slot, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// WaitReplayed waits until the standby at standbyDSN has replayed all the
// WAL the primary at primaryDSN had inserted when it was called (its
// insert position rather than its write position, since with
// synchronous_commit off a commit may not be written yet): from then on,
// the standby shows every transaction that had committed on the primary.
// standbyDSN may name any database of the standby. It polls every 20
// milliseconds until ctx ends.
func WaitReplayed(ctx context.Context, primaryDSN, standbyDSN string) error {
	primary, err := pgx.Connect(ctx, primaryDSN)
	if err != nil {
		return fmt.Errorf("wait for replay: connect to the primary: %w", err)
	}
	defer primary.Close(context.WithoutCancel(ctx))
	var target string
	if err := primary.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&target); err != nil {
		return fmt.Errorf("wait for replay: read the primary's WAL position: %w", err)
	}
	standby, err := pgx.Connect(ctx, standbyDSN)
	if err != nil {
		return fmt.Errorf("wait for replay: connect to the standby: %w", err)
	}
	defer standby.Close(context.WithoutCancel(ctx))
	for {
		var done bool
		if err := standby.QueryRow(ctx, `SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)`, target).Scan(&done); err != nil {
			return fmt.Errorf("wait for replay: read the standby's replay position: %w", err)
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for replay: the standby has not replayed up to %s: %w", target, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Kill kills the server with SIGKILL, as a crash of its machine would: no
// shutdown, no checkpoint; its backends exit when they notice. A later
// Restart starts it again (with crash recovery). It works only on a server
// this process started.
func (c *Cluster) Kill() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.child == nil {
		return fmt.Errorf("pgcluster: kill %s: the server was not started by this process", c.dataDir)
	}
	if err := c.child.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("pgcluster: kill postgres (pid %d): %w", c.child.Process.Pid, err)
	}
	<-c.exited
	c.child, c.exited, c.running = nil, nil, false
	return nil
}

// Promote makes a standby a primary (pg_promote) and waits until it
// accepts writes. It then no longer streams from its old primary, which
// may be gone (a failover), so Stop leaves the old primary's replication
// slot alone.
func (c *Cluster) Promote(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: promote: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var done bool
	if err := conn.QueryRow(ctx, `SELECT pg_promote(wait => true, wait_seconds => 60)`).Scan(&done); err != nil {
		return fmt.Errorf("pgcluster: promote: %w", err)
	}
	if !done {
		return errors.New("pgcluster: promote: the standby did not leave recovery within 60 seconds")
	}
	c.mu.Lock()
	c.primary, c.slot = nil, ""
	c.mu.Unlock()
	return nil
}
