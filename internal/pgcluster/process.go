package pgcluster

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// stopLocked implements Stop; the caller holds c.mu.
func (c *Cluster) stopLocked() error {
	if !c.running {
		return nil
	}
	if c.child != nil {
		if err := c.stopChild(); err != nil {
			return err
		}
	} else if err := c.stopByPIDFile(); err != nil {
		return err
	}
	c.running = false
	return nil
}

// stopChild stops the server process this process started, escalating to an immediate shutdown and
// then to SIGKILL if it does not exit in time.
func (c *Cluster) stopChild() error {
	cmd, exited := c.child, c.exited
	defer func() { c.child, c.exited = nil, nil }()
	for _, step := range []struct {
		sig     syscall.Signal
		timeout time.Duration
	}{
		{syscall.SIGINT, stopTimeout},       // fast shutdown
		{syscall.SIGQUIT, 10 * time.Second}, // immediate shutdown
		{syscall.SIGKILL, 10 * time.Second},
	} {
		if err := cmd.Process.Signal(step.sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return fmt.Errorf("pgcluster: signal postgres (pid %d): %w", cmd.Process.Pid, err)
		}
		select {
		case <-exited:
			return nil
		case <-time.After(step.timeout):
		}
	}
	return fmt.Errorf("pgcluster: postgres (pid %d) in %s did not exit after SIGKILL", cmd.Process.Pid, c.dataDir)
}

// stopByPIDFile stops a server this process did not start, found through postmaster.pid, and polls
// until it has exited.
func (c *Cluster) stopByPIDFile() error {
	pid, _, ok := readPostmasterPID(c.dataDir)
	if !ok || !postgresAlive(pid) {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGINT); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("pgcluster: signal postgres (pid %d): %w", pid, err)
	}
	deadline := time.Now().Add(stopTimeout)
	for time.Now().Before(deadline) {
		if p, _, ok := readPostmasterPID(c.dataDir); !ok || p != pid || !postgresAlive(pid) {
			return nil
		}
		time.Sleep(50 * time.Millisecond) // polling a condition with a deadline
	}
	return fmt.Errorf("pgcluster: postgres (pid %d) in %s did not shut down within %v", pid, c.dataDir, stopTimeout)
}

// Running reports whether a PostgreSQL server is running in dataDir, according to its postmaster.pid.
func Running(dataDir string) bool {
	pid, _, ok := readPostmasterPID(dataDir)
	return ok && postgresAlive(pid)
}

// readPostmasterPID returns the pid and port recorded in dataDir/postmaster.pid.
func readPostmasterPID(dataDir string) (pid, port int, ok bool) {
	f, err := os.Open(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	var lines []string
	s := bufio.NewScanner(f)
	for s.Scan() && len(lines) < 4 {
		lines = append(lines, strings.TrimSpace(s.Text()))
	}
	if len(lines) < 4 {
		return 0, 0, false
	}
	pid, err1 := strconv.Atoi(lines[0])
	port, err2 := strconv.Atoi(lines[3])
	if err1 != nil || err2 != nil || pid <= 0 {
		return 0, 0, false
	}
	return pid, port, true
}

// postgresAlive reports whether process pid exists and, where /proc tells, is a PostgreSQL server
// rather than an unrelated process that reuses a stale pid.
func postgresAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil {
		name := strings.TrimSpace(string(comm))
		return strings.HasPrefix(name, "postgres") || strings.HasPrefix(name, "postmaster")
	}
	if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		// A zombie has exited; it only waits for its parent to reap it.
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
			return false
		}
	}
	return true
}

// forkRequests carries process starts to a goroutine locked to one OS thread for the life of the
// process. Pdeathsig fires when the thread that forked the child exits, not the process, so children
// must be forked from a thread that never exits.
var (
	forkRequests   chan func()
	forkThreadOnce sync.Once
)

// startOnLockedThread starts cmd from the process-lifetime forking thread.
func startOnLockedThread(cmd *exec.Cmd) error {
	forkThreadOnce.Do(func() {
		forkRequests = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for f := range forkRequests {
				f()
			}
		}()
	})
	errc := make(chan error, 1)
	forkRequests <- func() { errc <- cmd.Start() }
	return <-errc
}
