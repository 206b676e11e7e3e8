package pgcluster

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
)

// reachableRoot is where ReachableDataDir places data directories the server user cannot reach. It is
// a variable so that tests can point it elsewhere.
var reachableRoot = "/var/lib/stint-dev"

// ReachableDataDir returns where to keep the data directory that the caller wants at dataDir, whose
// parent directory must exist. That is dataDir itself unless this process runs as root and the
// unprivileged user the server then runs as cannot enter one of dataDir's ancestors (root's home
// directory is mode 0700 on Debian). Then it is a directory under /var/lib/stint-dev named for a hash
// of dataDir's absolute path, so that each dataDir keeps its own cluster from one run to the next; moved
// reports this. Start gives the data directory itself to the server user.
func ReachableDataDir(dataDir string) (dir string, moved bool, err error) {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return "", false, fmt.Errorf("resolve data directory %q: %w", dataDir, err)
	}
	su, err := lookupServerUser()
	if err != nil {
		return "", false, err
	}
	if su == nil || checkSearchable(filepath.Dir(abs), su) == nil {
		return abs, false, nil
	}
	sum := sha256.Sum256([]byte(abs))
	parent := filepath.Join(reachableRoot, hex.EncodeToString(sum[:8]))
	// Searchable by all, like /var/lib itself: the server user must pass through it.
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", false, fmt.Errorf("create %s for the data directory: %w", parent, err)
	}
	if err := checkSearchable(parent, su); err != nil {
		return "", false, fmt.Errorf("%w; and its fallback place %s is not reachable either", checkSearchable(filepath.Dir(abs), su), parent)
	}
	return filepath.Join(parent, filepath.Base(abs)), true, nil
}
