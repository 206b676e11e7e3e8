package buildinfo

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFromReadsStintsVersionWhereverItIs(t *testing.T) {
	t.Parallel()
	rev := "1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d"
	for _, tc := range []struct {
		name   string
		bi     *debug.BuildInfo
		want   Info
		string string
	}{
		{"no build info", nil, Info{Version: Devel}, Devel},
		{"stint built from a tag", &debug.BuildInfo{Main: debug.Module{Path: ModulePath, Version: "v0.6.0"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "false"}}},
			Info{Version: "v0.6.0", Commit: rev}, "v0.6.0 (1a2b3c4d5e6f)"},
		{"stint from a checkout without a stamp", &debug.BuildInfo{Main: debug.Module{Path: ModulePath, Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "true"}}},
			Info{Version: Devel, Commit: rev, Modified: true}, Release + "+devel (1a2b3c4d5e6f, modified)"},
		{"stint at a pseudo-version", &debug.BuildInfo{Main: debug.Module{Path: ModulePath, Version: "v0.6.1-0.20261127224254-1a2b3c4d5e6f+dirty"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "true"}}},
			Info{Version: "v0.6.1-0.20261127224254-1a2b3c4d5e6f+dirty", Commit: rev, Modified: true},
			"v0.6.1-0.20261127224254-1a2b3c4d5e6f+dirty"},
		{"a program of one's own on a tag", &debug.BuildInfo{Main: debug.Module{Path: "example.com/acme", Version: "v1.2.3"},
			Deps:     []*debug.Module{{Path: "github.com/other/x", Version: "v9.0.0"}, {Path: ModulePath, Version: "v0.5.0"}},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "ffffffffffffffffffffffffffffffffffffffff"}}},
			Info{Version: "v0.5.0"}, "v0.5.0"},
		{"a program of one's own on a commit", &debug.BuildInfo{Main: debug.Module{Path: "example.com/acme"},
			Deps: []*debug.Module{{Path: ModulePath, Version: "v0.5.1-0.20261127224254-abcdefabcdef"}}},
			Info{Version: "v0.5.1-0.20261127224254-abcdefabcdef", Commit: "abcdefabcdef"}, "v0.5.1-0.20261127224254-abcdefabcdef"},
		{"a program of one's own with stint replaced", &debug.BuildInfo{Main: debug.Module{Path: "example.com/acme"},
			Deps: []*debug.Module{{Path: ModulePath, Version: "v0.5.0", Replace: &debug.Module{Path: "../stint", Version: ""}}}},
			Info{Version: Devel}, Devel},
		{"a binary without stint", &debug.BuildInfo{Main: debug.Module{Path: "example.com/acme", Version: "v1.0.0"}},
			Info{Version: Devel}, Devel},
	} {
		got := From(tc.bi)
		require.Equal(t, tc.want, got, tc.name)
		require.Equal(t, tc.string, got.String(), tc.name)
	}
}
