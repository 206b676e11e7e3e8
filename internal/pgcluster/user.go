package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// serverUser is the unprivileged account the server runs as when this process runs as root.
type serverUser struct {
	name     string
	uid, gid uint32
}

// lookupServerUser returns the account to run PostgreSQL as, or nil when this process is not root.
func lookupServerUser() (*serverUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	var errs []error
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		uid, err := strconv.ParseUint(u.Uid, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("parse uid %q of user %s: %w", u.Uid, name, err)
		}
		gid, err := strconv.ParseUint(u.Gid, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("parse gid %q of user %s: %w", u.Gid, name, err)
		}
		return &serverUser{name: name, uid: uint32(uid), gid: uint32(gid)}, nil
	}
	return nil, fmt.Errorf("running as root, and PostgreSQL refuses to run as root, but there is no unprivileged user to run it as: %w",
		errors.Join(errs...))
}

// command returns a command for the server binary name that runs as the server user, in the data
// directory, with an environment free of libpq variables.
func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, name), args...)
	cmd.Dir = c.dataDir
	cmd.Env = serverEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	if c.user != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: c.user.uid, Gid: c.user.gid, Groups: []uint32{}}
	}
	return cmd
}

// serverEnv returns this process's environment without PG* variables, which could otherwise change how
// initdb and the server behave, and with a C locale for predictable messages.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C")
}

// checkSearchable returns an error if u cannot traverse dir and each of its ancestors. The server user
// runs without supplementary groups, so only its primary group counts.
func checkSearchable(dir string, u *serverUser) error {
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("inspect %s: %w", p, err)
		}
		perm := fi.Mode().Perm()
		ok := perm&0o001 != 0
		if st, isStat := fi.Sys().(*syscall.Stat_t); isStat {
			ok = ok || (st.Uid == u.uid && perm&0o100 != 0) || (st.Gid == u.gid && perm&0o010 != 0)
		}
		if !ok {
			return fmt.Errorf("PostgreSQL runs as user %s (since this process is root), which cannot enter %s (mode %v); "+
				"put the data directory under a directory that user can search, e.g. one made with os.MkdirTemp and chowned to it",
				u.name, p, perm)
		}
		if parent := filepath.Dir(p); parent == p {
			return nil
		}
	}
}
