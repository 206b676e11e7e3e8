package cli

import (
	"fmt"
	"runtime"
	"strings"

	"github.com/spf13/cobra"

	"github.com/stinthq/stint/internal/buildinfo"
	"github.com/stinthq/stint/migrations"
)

// versionText says which stint the binary holds: its module version, the
// commit it was built from, the schema level of each migration line it
// needs (the highest migration it embeds), and the Go release.
func versionText() (string, error) {
	info := buildinfo.Read()
	all, err := migrations.All()
	if err != nil {
		return "", fmt.Errorf("read the embedded migrations: %w", err)
	}
	var lines []string
	level := map[string]int{}
	for _, m := range all {
		if _, ok := level[m.Line]; !ok {
			lines = append(lines, m.Line)
		}
		level[m.Line] = max(level[m.Line], m.Version)
	}
	schema := make([]string, len(lines))
	for i, l := range lines {
		schema[i] = fmt.Sprintf("%s %04d", l, level[l])
	}
	commit := orDash(info.Commit)
	if info.Modified {
		commit += " (modified)"
	}
	return fmt.Sprintf("stint %s\ncommit: %s\nschema: %s\ngo: %s\n",
		info.Version, commit, strings.Join(schema, ", "), runtime.Version()), nil
}

// newVersionCmd returns `stint version`.
func (c *cli) newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print stint's version, its commit and the schema it needs",
		Long: `Print the version of stint in this binary (its module version: a release tag,
a pseudo-version naming a commit, or for a build the toolchain did not version,
such as 'go run', the release of CHANGELOG.md its source holds marked +devel:
` + buildinfo.Devel + `), the commit it was built from when the build says, the
schema level it needs (the highest migration of each line, which 'stint
migrate up' applies) and the Go release. --version prints the same; 'stint
nodes ls' shows the version each node runs.`,
		Args: exactArgs(0),
		RunE: func(*cobra.Command, []string) error {
			text, err := versionText()
			if err != nil {
				return err
			}
			fmt.Fprint(c.stdout, text)
			return nil
		},
	}
}
