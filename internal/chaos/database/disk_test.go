package database

import (
	"context"
	"errors"
	"fmt"
	"github.com/stinthq/stint/internal/chaos"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/internal/pgtest"
)

// smallDisk is the size of the file system the full-disk test fills: the
// database with the workload's tasks takes about 30 MB in the short mode,
// and the long mode's 20,000 tasks need more room once the disk is freed.
func smallDisk() int {
	if *chaos.Long {
		return 512 << 20
	}
	return 64 << 20
}

// mountSmallDisk mounts a tmpfs of smallDisk() bytes, owned by the account
// that owns dataDir (the server's), on a new directory the server can
// reach, and unmounts it when the test ends. It skips the test when this
// process may not mount (it needs CAP_SYS_ADMIN, as the silent-loss test
// needs CAP_NET_ADMIN); any other failure to mount fails it under CI=true.
func mountSmallDisk(t *testing.T, dataDir string) string {
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(dataDir, &st))
	dir := pgtest.TempDir(t)
	opts := fmt.Sprintf("size=%d,uid=%d,gid=%d,mode=0700", smallDisk(), st.Uid, st.Gid)
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, opts); err != nil {
		if os.Getenv("CI") == "true" && !errors.Is(err, syscall.EPERM) {
			t.Fatalf("mount a tmpfs on %s: %v", dir, err)
		}
		t.Skipf("mount a tmpfs (mount -t tmpfs -o %s tmpfs DIR) is not permitted here: %v", opts, err)
	}
	t.Cleanup(func() {
		// The server's processes may hold files of the dropped tablespace
		// open for a while (each closes them when it next handles the
		// drop's barrier): a busy file system is detached instead, and
		// goes once the last of them is closed.
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := syscall.Unmount(dir, 0)
			if err == nil {
				return
			}
			if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
				if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
					t.Errorf("unmount %s: %v", dir, err)
				}
				return
			}
			time.Sleep(100 * time.Millisecond) // waiting for the server to close the files, bounded by the deadline
		}
	})
	return dir
}

// fill writes zeros to path until its file system is full.
func fill(t *testing.T, path string) {
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			require.True(t, errors.Is(err, syscall.ENOSPC), "fill %s: %v", path, err)
			return
		}
	}
}

// TestFullDisk fills the file system of the workload's database (its
// tablespace) while the workload runs: submits fail with
// api.ErrUnavailable naming the cause, the nodes log the incident, and
// once the space is freed everything resumes with nothing acknowledged
// lost.
func TestFullDisk(t *testing.T) {
	cl := pgtest.Cluster()
	if cl == nil {
		t.Skip("the cluster is not this test binary's (STINT_TEST_DATABASE_URL is set): its disk is not this machine's to fill")
	}
	dir := mountSmallDisk(t, cl.DataDir())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, pgtest.AdminDSN())
	require.NoError(t, err)
	defer admin.Close(context.Background())
	space := fmt.Sprintf("chaos_small_%d", os.Getpid())
	_, err = admin.Exec(ctx, fmt.Sprintf(`CREATE TABLESPACE %s LOCATION '%s'`, space, dir))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		admin, err := pgx.Connect(ctx, pgtest.AdminDSN())
		require.NoError(t, err)
		defer admin.Close(ctx)
		_, err = admin.Exec(ctx, `DROP TABLESPACE `+space)
		require.NoError(t, err)
	})
	// The test's database, moved to the small file system before anyone
	// connects to it.
	dsn := pgtest.New(t)
	_, err = admin.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s SET TABLESPACE %s`,
		pgx.Identifier{filepath.Base(chaos.MustURL(t, dsn).Path)}.Sanitize(), space))
	require.NoError(t, err)

	c := chaos.NewClusterAt(t, dsn)
	c.StartAll()
	filler := filepath.Join(dir, "filler")
	var refused error
	c.Incident("full disk", chaos.IncidentFor(5*time.Second), func() {
		// Tasks that fall due while the disk is full: every node's claims
		// write (the claimed tasks, their leases, the change feed).
		var reqs []api.SubmitRequest
		for n := range 1000 {
			reqs = append(reqs, api.SubmitRequest{Behavior: chaos.WorkKind.ID, Params: fmt.Appendf(nil, `{"n":%d}`, 3_000_000+n), Delay: 1500 * time.Millisecond})
		}
		subs, err := c.Client.SubmitMany(c.Ctx, reqs)
		require.NoError(t, err)
		for _, s := range subs {
			c.Extra = append(c.Extra, s.ID)
		}
		fill(t, filler)
		require.Eventually(t, func() bool {
			var sub api.Submission
			sub, refused = c.Client.Submit(c.Ctx, api.SubmitRequest{Behavior: chaos.WorkKind.ID, Params: fmt.Appendf(nil, `{"n":%d}`, 2_000_000+len(c.Extra))})
			if refused == nil && !slices.Contains(c.Extra, sub.ID) {
				c.Extra = append(c.Extra, sub.ID) // stored in a page with room left
			}
			return refused != nil
		}, time.Minute, 20*time.Millisecond, "a submit should be refused")
	}, func() { require.NoError(t, os.Remove(filler)) }, impl.CauseDiskFull)
	var used int64
	require.NoError(t, admin.QueryRow(c.Ctx, `SELECT pg_tablespace_size($1)`, space).Scan(&used))
	t.Logf("the database took %d MB of the %d MB file system", used>>20, smallDisk()>>20)
	require.ErrorIs(t, refused, api.ErrUnavailable)
	require.ErrorContains(t, refused, "disk_full")
	require.ErrorContains(t, refused, "disk is full")
	t.Logf("the refused submit's error: %v", refused)
}
