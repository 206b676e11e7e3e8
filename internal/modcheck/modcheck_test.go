package modcheck_test

import (
	"bufio"
	"bytes"
	"go/version"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// go.mod's go line names no later release than the latest that a
// dependency's go line names: a later one (a patch release, say) would be
// forced on every module that requires stint.
func TestGoLineIsTheLowestTheDependenciesAllow(t *testing.T) {
	t.Parallel()
	out, err := exec.CommandContext(t.Context(), "go", "list", "-m", "-f", "{{.Main}} {{.Path}} {{.GoVersion}}", "all").Output()
	require.NoError(t, err)
	var main, highest, by string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 {
			continue // a module with no go line
		}
		v := "go" + f[2]
		switch {
		case f[0] == "true":
			main = v
		case version.Compare(v, highest) > 0:
			highest, by = v, f[1]
		}
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, main, "go list names the main module")
	require.LessOrEqual(t, version.Compare(main, highest), 0,
		"go.mod names %s, later than %s, the latest a dependency needs (%s)", main, highest, by)
}
