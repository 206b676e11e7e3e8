package pgcluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/stinthq/stint/internal/provision"
)

// AutoFailover is pg_auto_failover for the PostgreSQL server BinDir finds, as a tool that package
// provision can install: the Debian package postgresql-MAJOR-auto-failover, which installs the monitor's
// extension for that server and, through its dependency pg-auto-failover-cli, pg_autoctl. Find reports
// pg_autoctl's path once both are there.
func AutoFailover() (provision.Tool, error) {
	bin, err := BinDir()
	if err != nil {
		return provision.Tool{}, err
	}
	major := filepath.Base(filepath.Dir(bin))
	if _, ok := parseVersion(major); !ok {
		return provision.Tool{}, fmt.Errorf("pg_auto_failover: the server's bin directory %s is not in the Debian layout (%s/MAJOR/bin)", bin, debianLibDir)
	}
	control := filepath.Join(debianShareDir, major, "extension", "pgautofailover.control")
	return provision.Tool{Name: "pg_auto_failover (pg_autoctl)", Package: "postgresql-" + major + "-auto-failover",
		Find: func() (string, error) {
			if _, err := os.Stat(control); err != nil {
				return "", fmt.Errorf("the pgautofailover extension is not installed (%s): %w", control, err)
			}
			return findExecutable("pg_autoctl", filepath.Join(bin, "pg_autoctl"), "/usr/bin/pg_autoctl")
		}}, nil
}

// debianShareDir is where Debian and Ubuntu install each PostgreSQL major version's extensions.
var debianShareDir = "/usr/share/postgresql"

// findExecutable returns the first of paths that is an executable file, else name's path on PATH.
func findExecutable(name string, paths ...string) (string, error) {
	for _, p := range paths {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%s not found at %s or on PATH", name, strings.Join(paths, ", "))
}
