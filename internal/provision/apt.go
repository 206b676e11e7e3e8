package provision

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Files that keep an install from creating or starting services. Tests point them elsewhere.
var (
	// policyRCD, when it exits 101, forbids maintainer scripts to start services (invoke-rc.d asks it).
	policyRCD = "/usr/sbin/policy-rc.d"
	// createClusterConf tells postgresql-common not to create the distribution's "main" cluster when the
	// server package is installed.
	createClusterConf = "/etc/postgresql-common/createcluster.d/stint-no-main-cluster.conf"
	// aptLists is where apt-get update stores the package lists.
	aptLists = "/var/lib/apt/lists"
)

// install installs the Debian package pkg with apt-get, non-interactively and without starting any
// service, running apt-get update first if there are no package lists or if the install fails without
// them being fresh. The files it adds to keep services from starting are removed afterwards; files of
// the same names that were there before are left alone.
func install(ctx context.Context, pkg string) (err error) {
	undo, err := holdServices(pkg)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, undo()) }()

	updated := false
	if !haveLists() {
		if err := apt(ctx, "update"); err != nil {
			return err
		}
		updated = true
	}
	err = apt(ctx, "install", "-y", "--no-install-recommends", pkg)
	if err != nil && !updated {
		// The lists may be stale (a package version gone from the mirror) or lack the package.
		if uerr := apt(ctx, "update"); uerr != nil {
			return errors.Join(err, uerr)
		}
		err = apt(ctx, "install", "-y", "--no-install-recommends", pkg)
	}
	return err
}

// holdServices writes the files that keep the install of pkg from starting services or creating the
// distribution's PostgreSQL cluster, and returns the function that removes the ones it wrote.
func holdServices(pkg string) (undo func() error, err error) {
	var added []string
	undo = func() error {
		var errs []error
		for _, p := range added {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	add := func(path, content string, mode os.FileMode) error {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
		if errors.Is(err, os.ErrExist) {
			return nil // someone else's: leave it as it is
		}
		if err != nil {
			return err
		}
		added = append(added, path)
		_, werr := f.WriteString(content)
		return errors.Join(werr, f.Close())
	}
	if err := add(policyRCD, "#!/bin/sh\n# Written by stint while it installs a package: start no services.\nexit 101\n", 0o755); err != nil {
		return nil, errors.Join(fmt.Errorf("write %s: %w", policyRCD, err), undo())
	}
	if pkg == "postgresql" {
		conf := "# Written by stint while it installs PostgreSQL: stint runs its own clusters.\ncreate_main_cluster = false\n"
		if err := add(createClusterConf, conf, 0o644); err != nil {
			return nil, errors.Join(fmt.Errorf("write %s: %w", createClusterConf, err), undo())
		}
	}
	return undo, nil
}

// haveLists reports whether apt-get update has stored package lists.
func haveLists() bool {
	m, _ := filepath.Glob(filepath.Join(aptLists, "*_Packages*"))
	return len(m) > 0
}

// apt runs apt-get with args, non-interactively, and returns an error with the tail of its output if it
// fails.
func apt(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, aptGet, append([]string{"-q"}, args...)...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		b := out.Bytes()
		if len(b) > 4096 {
			b = b[len(b)-4096:]
		}
		return fmt.Errorf("apt-get %s: %w\n%s", args[0], err, b)
	}
	return nil
}
