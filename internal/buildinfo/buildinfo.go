// Package buildinfo reads which version of stint a binary was built with,
// from the build information the Go toolchain embeds in every binary.
package buildinfo

import (
	"regexp"
	"runtime/debug"
	"strings"
)

// ModulePath is stint's module path.
const ModulePath = "github.com/stinthq/stint"

// Release is the newest release of stint whose changes this source holds:
// the version of the newest release heading of CHANGELOG.md, which a test
// checks. The commit of a release sets it to the new version.
const Release = "v0.4.0"

// Devel is the version of a build that the toolchain could not version
// (go run, a build without a VCS stamp, as in tests, or with
// -buildvcs=false): the release its source holds, marked as holding
// what was added since, "v0.4.0+devel".
const Devel = Release + "+devel"

// Info says which stint a binary holds.
type Info struct {
	// Version is stint's module version: a release tag such as v0.6.0, a
	// pseudo-version naming a commit, or Devel.
	Version string
	// Commit is the VCS revision stint was built from, empty when the
	// build does not say (a dependency at a tagged version, a test binary).
	Commit string
	// Modified reports that the checkout stint was built from had
	// uncommitted changes.
	Modified bool
}

// Read returns the Info of the running binary; its Version is Devel when
// the binary carries no build information.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: Devel}
	}
	return From(bi)
}

// pseudoCommit matches the commit at the end of a pseudo-version
// (v0.0.0-20261127224254-1a2b3c4d5e6f or v0.5.1-0.20261127224254-1a2b3c4d5e6f,
// with an optional +dirty).
var pseudoCommit = regexp.MustCompile(`[-.]\d{14}-([0-9a-f]{12})(\+.*)?$`)

// From returns the Info that bi records for stint: the main module's when
// stint is the main module (cmd/stint), else that of the dependency on
// stint (a program of one's own calling cli.Main), following a replace
// directive. A binary that does not hold stint at all has Version Devel.
func From(bi *debug.BuildInfo) Info {
	info := Info{Version: Devel}
	if bi == nil {
		return info
	}
	mod := &bi.Main
	if mod.Path != ModulePath {
		mod = nil
		for _, d := range bi.Deps {
			if d.Path == ModulePath {
				mod = d
				if d.Replace != nil {
					mod = d.Replace
				}
				break
			}
		}
	}
	if mod == nil {
		return info
	}
	if v := mod.Version; v != "" && v != "(devel)" {
		info.Version = v
	}
	if mod == &bi.Main {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Commit = s.Value
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	if m := pseudoCommit.FindStringSubmatch(info.Version); m != nil && info.Commit == "" {
		info.Commit = m[1]
		info.Modified = m[2] == "+dirty"
	}
	return info
}

// String names the version in one word or a few, as the nodes table keeps
// it: the version, then the commit's first 12 digits when the version
// does not name it already, and "modified" for a checkout with changes:
// "v0.6.0", "v0.4.0+devel (1a2b3c4d5e6f, modified)".
func (i Info) String() string {
	short := i.Commit
	if len(short) > 12 {
		short = short[:12]
	}
	var extra []string
	if short != "" && !strings.Contains(i.Version, short) {
		extra = append(extra, short)
	}
	if i.Modified && !strings.HasSuffix(i.Version, "+dirty") {
		extra = append(extra, "modified")
	}
	if len(extra) == 0 {
		return i.Version
	}
	return i.Version + " (" + strings.Join(extra, ", ") + ")"
}
