// Package doccheck holds the tests that keep the documentation true to
// the code: every relative link of the Markdown pages (README.md,
// ARCHITECTURE.md, CHANGELOG.md, docs/*.md) leads to a file and heading
// that exist, every Go snippet of theirs parses, and no package doc holds
// Go code, which belongs in Example functions, where it compiles and runs.
// It has no code of its own.
package doccheck
