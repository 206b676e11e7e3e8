package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/stinthq/stint/internal/provision"
)

// serverBinaries are the programs a directory must hold to be returned by BinDir.
var serverBinaries = []string{"initdb", "pg_ctl", "postgres"}

// debianLibDir is where Debian and Ubuntu install one directory per PostgreSQL major version.
// It is a variable so that tests can point it elsewhere.
var debianLibDir = "/usr/lib/postgresql"

// ErrNoPostgres is wrapped by the error BinDir returns when no PostgreSQL server binaries are installed.
var ErrNoPostgres = errors.New("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found")

// BinDir returns the directory that holds the PostgreSQL server binaries initdb, pg_ctl and postgres.
// It looks on PATH first, then in the directory printed by `pg_config --bindir` (which on Debian may be
// the client-only one, so it is used only if initdb is there), and then in the Debian layout
// /usr/lib/postgresql/<major>/bin, taking the highest major version. When none is found, the error wraps
// ErrNoPostgres and says how to install PostgreSQL.
func BinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		// Prefer the directory the binaries really live in, since PATH may hold symlinks to them.
		if real, err := filepath.EvalSymlinks(p); err == nil && hasServerBinaries(filepath.Dir(real)) {
			return filepath.Dir(real), nil
		}
		if dir, err := filepath.Abs(filepath.Dir(p)); err == nil && hasServerBinaries(dir) {
			return dir, nil
		}
	}
	if pgConfig, err := exec.LookPath("pg_config"); err == nil {
		if out, err := exec.Command(pgConfig, "--bindir").Output(); err == nil {
			dir := strings.TrimSpace(string(out))
			if dir != "" && hasServerBinaries(dir) {
				return dir, nil
			}
		}
	}
	if dir := highestDebianBinDir(debianLibDir); dir != "" {
		return dir, nil
	}
	return "", fmt.Errorf("%w on PATH, via `pg_config --bindir`, or in %s/<version>/bin: "+
		"install the PostgreSQL server (Debian/Ubuntu: `apt-get install postgresql`; "+
		"Fedora: `dnf install postgresql-server`; macOS: `brew install postgresql`) "+
		"or put its bin directory on PATH; for tests you can instead set STINT_TEST_DATABASE_URL "+
		"to the URL of a PostgreSQL server where the user may create databases", ErrNoPostgres, debianLibDir)
}

// Server is the PostgreSQL server as a tool that package provision can install: the distribution's
// postgresql package, found by BinDir.
var Server = provision.Tool{Name: "the PostgreSQL server", Package: "postgresql", Find: func() (string, error) { return BinDir() }}

// EnsureBinDir returns BinDir's directory, first installing the PostgreSQL server with package provision
// if it is missing (as root on Debian or Ubuntu; without creating or starting the distribution's own
// cluster). Where it cannot install, the error wraps both ErrNoPostgres and provision.ErrCannotInstall
// and says how to install PostgreSQL.
func EnsureBinDir(ctx context.Context) (string, error) {
	if dir, err := BinDir(); err == nil {
		return dir, nil
	} else if !errors.Is(err, ErrNoPostgres) {
		return "", err
	}
	dir, err := provision.Ensure(ctx, Server)
	if err != nil {
		if me := (*provision.MissingError)(nil); errors.As(err, &me) {
			if me.Reason == provision.ReasonNotRoot {
				return "", fmt.Errorf("%w%.0w", err, ErrNoPostgres) // %.0w wraps without printing
			}
			// Not Debian or Ubuntu: BinDir's error says where stint looked and how to install
			// PostgreSQL on each system.
			_, notFound := BinDir()
			return "", fmt.Errorf("%w (stint installs it itself only as root on Debian or Ubuntu; %s)%.0w",
				notFound, me.Reason, err) // %.0w wraps err without printing it
		}
		return "", fmt.Errorf("%w: %w", ErrNoPostgres, err)
	}
	return dir, nil
}

// hasServerBinaries reports whether dir holds every program in serverBinaries as an executable file.
func hasServerBinaries(dir string) bool {
	for _, name := range serverBinaries {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return false
		}
	}
	return true
}

// highestDebianBinDir returns root/<version>/bin for the highest version that holds the server binaries,
// or "" if there is none.
func highestDebianBinDir(root string) string {
	entries, err := os.ReadDir(root)
	if err != nil {
		return ""
	}
	type candidate struct {
		version []int
		dir     string
	}
	var candidates []candidate
	for _, e := range entries {
		v, ok := parseVersion(e.Name())
		if !ok {
			continue
		}
		dir := filepath.Join(root, e.Name(), "bin")
		if hasServerBinaries(dir) {
			candidates = append(candidates, candidate{v, dir})
		}
	}
	if len(candidates) == 0 {
		return ""
	}
	sort.Slice(candidates, func(i, j int) bool { return versionLess(candidates[i].version, candidates[j].version) })
	return candidates[len(candidates)-1].dir
}

// parseVersion parses a dotted version such as "15" or "9.6" into its numeric parts.
func parseVersion(s string) ([]int, bool) {
	parts := strings.Split(s, ".")
	v := make([]int, 0, len(parts))
	for _, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return nil, false
		}
		v = append(v, n)
	}
	return v, true
}

// versionLess reports whether version a sorts before version b.
func versionLess(a, b []int) bool {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}
