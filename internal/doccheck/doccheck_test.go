package doccheck_test

import (
	"bufio"
	"fmt"
	"go/doc/comment"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/internal/buildinfo"
)

// root is the repository's root, from this package's directory.
const root = "../.."

// markdownPages returns the Markdown pages checked, relative to root.
func markdownPages(t *testing.T) []string {
	t.Helper()
	pages := []string{"README.md", "ARCHITECTURE.md", "CHANGELOG.md"}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	require.NotEmpty(t, docs)
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		require.NoError(t, err)
		pages = append(pages, rel)
	}
	return pages
}

// page is a Markdown page split into its prose lines and its fenced code
// blocks.
type page struct {
	prose    []string // the lines outside code blocks, numbered from 1 by index+1
	snippets []snippet
	anchors  map[string]bool // the anchors of its headings
}

// snippet is a fenced code block.
type snippet struct {
	lang string
	line int // of its opening fence
	code string
}

// readPage reads and splits a Markdown page.
func readPage(t *testing.T, path string) page {
	t.Helper()
	f, err := os.Open(filepath.Join(root, path))
	require.NoError(t, err)
	defer f.Close()
	p := page{anchors: map[string]bool{}}
	seen := map[string]int{}
	var open *snippet
	var body []string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		fence := strings.HasPrefix(strings.TrimSpace(line), "```")
		switch {
		case open == nil && fence:
			open = &snippet{lang: strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "```")), line: n}
			body = nil
			p.prose = append(p.prose, "")
		case open != nil && fence:
			open.code = strings.Join(body, "\n")
			p.snippets = append(p.snippets, *open)
			open = nil
			p.prose = append(p.prose, "")
		case open != nil:
			body = append(body, line)
			p.prose = append(p.prose, "")
		default:
			p.prose = append(p.prose, line)
			if h, ok := strings.CutPrefix(line, "#"); ok {
				a := anchor(strings.TrimLeft(h, "#"))
				if k := seen[a]; k > 0 {
					p.anchors[fmt.Sprintf("%s-%d", a, k)] = true
				} else {
					p.anchors[a] = true
				}
				seen[a]++
			}
		}
	}
	require.NoError(t, sc.Err())
	require.Nil(t, open, "%s: a code block opened and never closed", path)
	return p
}

// anchor returns the anchor GitHub gives a heading: lower case, letters,
// digits, spaces turned to hyphens, hyphens and underscores kept, the
// rest dropped.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// linkPattern matches an inline Markdown link or image and captures its
// target.
var linkPattern = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// Every relative link of the Markdown pages leads to a file that exists,
// and a link with an anchor into a Markdown page to one of its headings.
func TestMarkdownLinksResolve(t *testing.T) {
	t.Parallel()
	pages := map[string]page{}
	get := func(path string) page {
		p, ok := pages[path]
		if !ok {
			p = readPage(t, path)
			pages[path] = p
		}
		return p
	}
	var broken []string
	links := 0
	for _, path := range markdownPages(t) {
		for i, line := range get(path).prose {
			for _, m := range linkPattern.FindAllStringSubmatch(stripCodeSpans(line), -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				file, frag, _ := strings.Cut(target, "#")
				resolved := path
				if file != "" {
					resolved = filepath.Join(filepath.Dir(path), file)
					if _, err := os.Stat(filepath.Join(root, resolved)); err != nil {
						broken = append(broken, fmt.Sprintf("%s:%d: %s: no such file", path, i+1, target))
						continue
					}
				}
				if frag != "" && strings.HasSuffix(resolved, ".md") && !get(resolved).anchors[frag] {
					broken = append(broken, fmt.Sprintf("%s:%d: %s: no heading #%s in %s", path, i+1, target, frag, resolved))
				}
			}
		}
	}
	require.NotZero(t, links, "the pages link to each other")
	require.Empty(t, broken, "broken links")
}

// stripCodeSpans blanks the `code spans` of a line, which hold no links.
func stripCodeSpans(line string) string {
	parts := strings.Split(line, "`")
	for i := 1; i < len(parts); i += 2 {
		parts[i] = ""
	}
	return strings.Join(parts, "`")
}

// Every Go snippet of the Markdown pages parses: as a file, as
// declarations, or as the statements of a function body.
func TestMarkdownGoSnippetsParse(t *testing.T) {
	t.Parallel()
	var bad []string
	snippets := 0
	for _, path := range markdownPages(t) {
		for _, s := range readPage(t, path).snippets {
			if s.lang != "go" {
				continue
			}
			snippets++
			if err := parseGo(s.code); err != nil {
				bad = append(bad, fmt.Sprintf("%s:%d: %v", path, s.line, err))
			}
		}
	}
	require.NotZero(t, snippets)
	require.Empty(t, bad, "Go snippets that do not parse")
}

// parseGo parses code as a Go file, as declarations or as statements, and
// returns the error of the last try when none parses.
func parseGo(code string) error {
	var err error
	for _, src := range []string{code, "package p\n" + code, "package p\nfunc _() {\n" + code + "\n}"} {
		if _, err = parser.ParseFile(token.NewFileSet(), "snippet.go", src, parser.SkipObjectResolution); err == nil {
			return nil
		}
	}
	return err
}

// No package doc holds Go code: a snippet there is never compiled, and
// names that do not exist went unnoticed in one; examples compile and run.
// Code blocks that are not Go (endpoint tables, JSON, shell) stay.
func TestPackageDocsHoldNoGoCode(t *testing.T) {
	t.Parallel()
	var p comment.Parser
	var bad []string
	files := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		files++
		if f.Doc == nil {
			return nil
		}
		for _, block := range p.Parse(f.Doc.Text()).Content {
			if code, ok := block.(*comment.Code); ok && parseGo(code.Text) == nil {
				bad = append(bad, fmt.Sprintf("%s: %q", path, firstLine(code.Text)))
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.NotZero(t, files)
	require.Empty(t, bad, "package docs with Go code: move it into an Example function")
}

// firstLine returns s up to its first newline.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// releaseHeading is the heading of a release in CHANGELOG.md.
var releaseHeading = regexp.MustCompile(`^## (Unreleased|v\d+\.\d+\.\d+ \(\d{4}-\d{2}-\d{2}\))$`)

// CHANGELOG.md has one heading per release, each opening with its
// Breaking list (entries, or "None" and why) and then its Changes; between
// entries there are only blank lines. The newest release is the one the
// code says it holds (buildinfo.Release), which binaries report.
func TestChangelogReleases(t *testing.T) {
	t.Parallel()
	p := readPage(t, "CHANGELOG.md")
	var problems []string
	releases := map[string]bool{}
	release, section := "", ""
	for i, line := range p.prose {
		n := i + 1
		switch {
		case strings.HasPrefix(line, "## "):
			if !releaseHeading.MatchString(line) {
				problems = append(problems, fmt.Sprintf("%d: %q is not \"## Unreleased\" or \"## vX.Y.Z (YYYY-MM-DD)\"", n, line))
			}
			if releases[line] {
				problems = append(problems, fmt.Sprintf("%d: %q a second time", n, line))
			}
			if release != "" && section != "Changes" {
				problems = append(problems, fmt.Sprintf("%d: %s has no Changes section", n, release))
			}
			releases[line], release, section = true, line, ""
		case line == "### Breaking":
			if release == "" || section != "" {
				problems = append(problems, fmt.Sprintf("%d: Breaking is not the first section of its release", n))
			}
			section = "Breaking"
		case line == "### Changes":
			if section != "Breaking" {
				problems = append(problems, fmt.Sprintf("%d: Changes does not follow Breaking", n))
			}
			section = "Changes"
		case release == "" || line == "":
			// The preamble, and blank lines.
		case section == "":
			problems = append(problems, fmt.Sprintf("%d: %q before the release's Breaking list", n, line))
		case strings.HasPrefix(line, "- "), strings.HasPrefix(line, "  "):
		case section == "Breaking" && strings.HasPrefix(line, "None"):
		default:
			problems = append(problems, fmt.Sprintf("%d: %q is not part of an entry", n, line))
		}
	}
	if release != "" && section != "Changes" {
		problems = append(problems, fmt.Sprintf("%s has no Changes section", release))
	}
	require.NotEmpty(t, releases)
	require.Empty(t, problems, "CHANGELOG.md")
	newest := ""
	for _, line := range p.prose {
		if m := releaseHeading.FindStringSubmatch(line); m != nil && m[1] != "Unreleased" {
			newest, _, _ = strings.Cut(m[1], " ")
			break
		}
	}
	require.Equal(t, newest, buildinfo.Release, "internal/buildinfo.Release is the newest release of CHANGELOG.md")
}

// sectionPointer matches a pointer to a section in prose: the README's
// "Upgrading", ARCHITECTURE.md's "Claim" or docs/database.md's "PgBouncer".
var sectionPointer = regexp.MustCompile(`\b(README|ARCHITECTURE|CHANGELOG|docs/[a-z-]+)(?:\.md)?'s "([^"]+)"`)

// Every pointer in prose to a page's section by its title ("see the
// README's "Upgrading"") names a heading of that page: a section that
// moved to another page leaves none behind. (Links are checked by
// TestMarkdownLinksResolve.)
func TestSectionPointersResolve(t *testing.T) {
	t.Parallel()
	var broken []string
	for _, path := range markdownPages(t) {
		for i, line := range readPage(t, path).prose {
			for _, m := range sectionPointer.FindAllStringSubmatch(stripCodeSpans(line), -1) {
				target := m[1] + ".md"
				if _, err := os.Stat(filepath.Join(root, target)); err != nil {
					broken = append(broken, fmt.Sprintf("%s:%d: %s: no such page", path, i+1, m[0]))
					continue
				}
				if !readPage(t, target).anchors[anchor(m[2])] {
					broken = append(broken, fmt.Sprintf("%s:%d: %s: no such heading in %s", path, i+1, m[0], target))
				}
			}
		}
	}
	require.Empty(t, broken, "pointers to sections that are not there")
}
