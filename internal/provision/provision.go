// Package provision installs the external programs stint's development command and test suite need
// (the PostgreSQL server, PgBouncer, Chromium) when they are missing, so that `stint dev` and
// `go test ./...` work on a fresh machine with only Go.
//
// It installs only where that is safe to do unattended: as root on Debian or Ubuntu, with the
// distribution's package, through apt-get, non-interactively. While it installs, a policy-rc.d that
// forbids starting services is in place (so that the packages' own daemons, such as the distribution's
// PostgreSQL cluster or PgBouncer, do not start), and postgresql-common is told not to create its
// default cluster: stint starts its own clusters. Anywhere else Ensure returns an error wrapping
// ErrCannotInstall that says precisely what to install.
//
// Many processes (every test binary of `go test ./...`) may call Ensure at once: installs are
// serialized across processes by an exclusive lock on a file in os.TempDir, and each process looks
// for the program again once it holds the lock, so a package is installed once.
package provision

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// ErrCannotInstall is wrapped by the error Ensure returns when a tool is missing and this process
// cannot install it (it is not root, or the system is not Debian or Ubuntu). That error is a
// *MissingError.
var ErrCannotInstall = errors.New("cannot install it here")

// MissingError reports a tool that is missing and that this process cannot install.
type MissingError struct {
	// Tool is the missing tool.
	Tool Tool
	// Reason says why this process cannot install it, e.g. "this process is not root".
	Reason string
}

// ReasonNotRoot is the Reason of a MissingError on Debian or Ubuntu when this process is not root.
const ReasonNotRoot = "this process is not root"

// Error says what is missing and the command that installs it, and why stint did not run it.
func (e *MissingError) Error() string {
	if e.Reason == ReasonNotRoot {
		return fmt.Sprintf("%s is not installed: run `sudo apt-get install %s`, or run this as root to have stint install it",
			e.Tool.Name, e.Tool.Package)
	}
	return fmt.Sprintf("%s is not installed, and stint installs it itself only as root on Debian or Ubuntu (%s): "+
		"install the %s package or its equivalent for your system", e.Tool.Name, e.Reason, e.Tool.Package)
}

// Is reports whether target is ErrCannotInstall.
func (e *MissingError) Is(target error) bool { return target == ErrCannotInstall }

// Tool describes a program and the Debian package that provides it.
type Tool struct {
	// Name names the tool in messages, e.g. "PgBouncer".
	Name string
	// Package is the Debian and Ubuntu package that installs it.
	Package string
	// Find returns the tool's path, or an error if it is not installed.
	Find func() (string, error)
}

// PgBouncer is the connection pooler, found on PATH or at /usr/sbin/pgbouncer.
var PgBouncer = Tool{Name: "PgBouncer", Package: "pgbouncer", Find: func() (string, error) {
	return findProgram([]string{"pgbouncer"}, []string{"/usr/sbin/pgbouncer"})
}}

// Chromium is the browser the dashboard's tests drive headless, found at /usr/bin/chromium or on PATH
// as chromium or chromium-browser.
var Chromium = Tool{Name: "Chromium", Package: "chromium", Find: func() (string, error) {
	return findProgram([]string{"chromium", "chromium-browser"}, []string{"/usr/bin/chromium"})
}}

// findProgram returns the first of paths that is an executable file, else the first of names found on
// PATH.
func findProgram(names, paths []string) (string, error) {
	for _, p := range paths {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found on PATH or at %s", strings.Join(names, " or "), strings.Join(paths, ", "))
}

// Ensure returns the path tool.Find reports, installing tool.Package first if the tool is missing and
// this process may install it (see the package documentation). It writes one line to stderr before an
// install, which takes a minute or so. If the tool is missing and cannot be installed here, the error
// is a *MissingError (it wraps ErrCannotInstall) and names the command that installs it.
func Ensure(ctx context.Context, tool Tool) (string, error) {
	if p, err := tool.Find(); err == nil {
		return p, nil
	}
	if reason := cannotInstall(); reason != "" {
		return "", &MissingError{Tool: tool, Reason: reason}
	}
	unlock, err := lock(ctx)
	if err != nil {
		return "", err
	}
	defer unlock()
	// Another process may have installed it while this one waited for the lock.
	if p, err := tool.Find(); err == nil {
		return p, nil
	}
	fmt.Fprintf(os.Stderr, "stint: %s is not installed; installing the %s package with apt-get (as root, non-interactive)\n",
		tool.Name, tool.Package)
	if err := runInstall(ctx, tool.Package); err != nil {
		return "", fmt.Errorf("install %s: %w", tool.Name, err)
	}
	p, err := tool.Find()
	if err != nil {
		return "", fmt.Errorf("installed the %s package, but %s is still not found: %w", tool.Package, tool.Name, err)
	}
	return p, nil
}

// Checks that tests replace.
var (
	geteuid = os.Geteuid
	// aptGet is the apt-get program; its presence together with /etc/debian_version marks Debian and
	// its derivatives, Ubuntu included.
	aptGet        = "/usr/bin/apt-get"
	debianVersion = "/etc/debian_version"
	lockFile      = filepath.Join(os.TempDir(), "stint-provision.lock")
	runInstall    = install
)

// cannotInstall returns why this process cannot install packages, or "" if it can.
func cannotInstall() string {
	if _, err := os.Stat(debianVersion); err != nil {
		return "this is not Debian or Ubuntu"
	}
	if _, err := os.Stat(aptGet); err != nil {
		return "apt-get is not installed"
	}
	if geteuid() != 0 {
		return ReasonNotRoot
	}
	return ""
}

// lock takes the exclusive lock that serializes installs across processes and returns its release.
func lock(ctx context.Context) (func(), error) {
	f, err := os.OpenFile(lockFile, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open the install lock %s: %w", lockFile, err)
	}
	done := make(chan error, 1)
	go func() { done <- syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }()
	select {
	case err := <-done:
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", lockFile, err)
		}
		return func() { f.Close() }, nil
	case <-ctx.Done():
		// Closing the file does not interrupt flock; the goroutine ends once the holder releases it.
		go func() { <-done; f.Close() }()
		return nil, fmt.Errorf("wait for another process's install: %w", ctx.Err())
	}
}
