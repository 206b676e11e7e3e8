package provision

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeSystem points the package's view of the system at files under a fresh directory: a Debian
// system where this process is root, with an install function that counts its calls and makes the
// tool appear.
func fakeSystem(t *testing.T) (tool Tool, installs *atomic.Int32) {
	dir := t.TempDir()
	for _, p := range []string{"debian_version", "apt-get"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, p), nil, 0o755))
	}
	old := []string{debianVersion, aptGet, lockFile}
	oldEuid, oldInstall := geteuid, runInstall
	debianVersion, aptGet, lockFile = filepath.Join(dir, "debian_version"), filepath.Join(dir, "apt-get"), filepath.Join(dir, "lock")
	geteuid = func() int { return 0 }
	t.Cleanup(func() {
		debianVersion, aptGet, lockFile = old[0], old[1], old[2]
		geteuid, runInstall = oldEuid, oldInstall
	})

	bin := filepath.Join(dir, "tool")
	installs = &atomic.Int32{}
	runInstall = func(_ context.Context, pkg string) error {
		if pkg != "tool-pkg" {
			return fmt.Errorf("asked to install %q", pkg)
		}
		// Another caller inside Ensure at the same time would see the tool before it exists.
		if installs.Add(1) != 1 {
			return errors.New("installed twice")
		}
		return os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755)
	}
	tool = Tool{Name: "Tool", Package: "tool-pkg", Find: func() (string, error) {
		return findProgram(nil, []string{bin})
	}}
	return tool, installs
}

func TestEnsureInstallsOnceForConcurrentCallers(t *testing.T) {
	tool, installs := fakeSystem(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { _, errs[i] = Ensure(ctx, tool) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int32(1), installs.Load())
}

func TestEnsureCannotInstall(t *testing.T) {
	const elsewhere = "Tool is not installed, and stint installs it itself only as root on Debian or Ubuntu (%s): " +
		"install the tool-pkg package or its equivalent for your system"
	cases := []struct {
		name  string
		setup func()
		msg   string
	}{
		{"not root", func() { geteuid = func() int { return 1000 } },
			"Tool is not installed: run `sudo apt-get install tool-pkg`, or run this as root to have stint install it"},
		{"not Debian", func() { debianVersion = "/nonexistent/debian_version" }, fmt.Sprintf(elsewhere, "this is not Debian or Ubuntu")},
		{"no apt-get", func() { aptGet = "/nonexistent/apt-get" }, fmt.Sprintf(elsewhere, "apt-get is not installed")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tool, installs := fakeSystem(t)
			c.setup()
			_, err := Ensure(context.Background(), tool)
			require.ErrorIs(t, err, ErrCannotInstall)
			require.EqualError(t, err, c.msg)
			require.Zero(t, installs.Load())
		})
	}
}

// fakeTB records what Require does with a test.
type fakeTB struct{ skipped, failed string }

func (*fakeTB) Helper()                             {}
func (f *fakeTB) Skipf(format string, args ...any)  { f.skipped = fmt.Sprintf(format, args...) }
func (f *fakeTB) Fatalf(format string, args ...any) { f.failed = fmt.Sprintf(format, args...) }

func TestRequireSkipsOutsideCIAndFailsInCI(t *testing.T) {
	tool, _ := fakeSystem(t)
	geteuid = func() int { return 1000 }

	t.Setenv("CI", "")
	var tb fakeTB
	Require(&tb, context.Background(), tool)
	require.Contains(t, tb.skipped, "needs Tool: Tool is not installed")
	require.Empty(t, tb.failed)

	t.Setenv("CI", "true")
	tb = fakeTB{}
	Require(&tb, context.Background(), tool)
	require.Contains(t, tb.failed, "needs Tool: Tool is not installed")
	require.Empty(t, tb.skipped)

	// Installed: the path, whatever CI says.
	geteuid = func() int { return 0 }
	tb = fakeTB{}
	p := Require(&tb, context.Background(), tool)
	require.FileExists(t, p)
	require.Equal(t, fakeTB{}, tb)
}

func TestHoldServicesRemovesOnlyWhatItAdded(t *testing.T) {
	dir := t.TempDir()
	oldPolicy, oldConf := policyRCD, createClusterConf
	t.Cleanup(func() { policyRCD, createClusterConf = oldPolicy, oldConf })
	policyRCD = filepath.Join(dir, "usr/sbin/policy-rc.d")
	createClusterConf = filepath.Join(dir, "etc/postgresql-common/createcluster.d/stint.conf")

	undo, err := holdServices("postgresql")
	require.NoError(t, err)
	b, err := os.ReadFile(policyRCD)
	require.NoError(t, err)
	require.Contains(t, string(b), "exit 101")
	b, err = os.ReadFile(createClusterConf)
	require.NoError(t, err)
	require.Contains(t, string(b), "create_main_cluster = false")
	require.NoError(t, undo())
	require.NoFileExists(t, policyRCD)
	require.NoFileExists(t, createClusterConf)

	// A policy-rc.d that was there before stays, unchanged; other packages get no cluster setting.
	require.NoError(t, os.WriteFile(policyRCD, []byte("#!/bin/sh\nexit 0\n"), 0o755))
	undo, err = holdServices("pgbouncer")
	require.NoError(t, err)
	require.NoFileExists(t, createClusterConf)
	require.NoError(t, undo())
	b, err = os.ReadFile(policyRCD)
	require.NoError(t, err)
	require.Equal(t, "#!/bin/sh\nexit 0\n", string(b))
}
