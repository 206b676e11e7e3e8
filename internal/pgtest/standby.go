package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stinthq/stint/internal/pgcluster"
)

// standbyTimeout bounds copying the cluster and starting a standby on it:
// generous, since the copy holds every database the test binary has open
// and the machine may be busy.
const standbyTimeout = 5 * time.Minute

// NewStandby returns the DSN of a fresh database, as New does, and the DSN
// of the same database on a hot standby of the test binary's cluster that
// streams its WAL: a copy made with pg_basebackup -R after the database was
// created, started on a free port, and stopped when the test ends; c is
// the standby's cluster, for a test that stops it early. The standby is
// the test's own, so the test may pause its replay
// (pg_wal_replay_pause) without disturbing other tests. With
// STINT_TEST_DATABASE_URL set there is no cluster to copy, and the test is
// skipped.
func NewStandby(t testing.TB) (primary, standby string, c *pgcluster.Cluster) {
	t.Helper()
	name := newDatabase(t)
	if cluster == nil {
		t.Skipf("pgtest: a standby needs the test binary's own cluster, and %s points the tests at another server", EnvDatabaseURL)
	}
	dir := TempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), standbyTimeout)
	defer cancel()
	s, err := cluster.StartStandby(ctx, dir)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("pgtest: stop the standby: %v", err)
		}
	})
	if err := pgcluster.WaitReplayed(ctx, adminDSN, s.DSN("postgres")); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return dsnFor(name), s.DSN(name), s
}

// CatchUp waits until the standby at standbyDSN has replayed everything
// committed on the primary at primaryDSN so far; it fails the test after
// a generous deadline.
func CatchUp(t testing.TB, primaryDSN, standbyDSN string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := pgcluster.WaitReplayed(ctx, primaryDSN, standbyDSN); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
}

// PauseReplay stops the standby at standbyDSN from replaying WAL: from the
// next record on, it keeps showing the database as it is now, until
// ResumeReplay or the end of the test.
func PauseReplay(t testing.TB, standbyDSN string) {
	t.Helper()
	standbyExec(t, standbyDSN, `SELECT pg_wal_replay_pause()`)
}

// ResumeReplay lets the standby at standbyDSN replay WAL again and waits
// until it caught up with the primary at primaryDSN.
func ResumeReplay(t testing.TB, primaryDSN, standbyDSN string) {
	t.Helper()
	standbyExec(t, standbyDSN, `SELECT pg_wal_replay_resume()`)
	CatchUp(t, primaryDSN, standbyDSN)
}

func standbyExec(t testing.TB, standbyDSN, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, standbyDSN)
	if err != nil {
		t.Fatalf("pgtest: connect to the standby: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("pgtest: %s: %v", sql, err)
	}
}
