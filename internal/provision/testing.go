package provision

import (
	"context"
	"errors"
	"os"
)

// TB is the part of testing.TB that Require uses; it keeps package testing out of the binaries that
// import this package.
type TB interface {
	Helper()
	Skipf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// Require returns the path of tool for a test, installing it like Ensure. If the tool is missing and
// cannot be installed here, the test is skipped with a message naming the tool, unless the environment
// variable CI is set to a true value ("true" or "1"), where every test must run: then the test fails.
// Any other failure to install fails the test.
func Require(t TB, ctx context.Context, tool Tool) string {
	t.Helper()
	p, err := Ensure(ctx, tool)
	if err == nil {
		return p
	}
	if errors.Is(err, ErrCannotInstall) && !InCI() {
		t.Skipf("skipped: needs %s: %v", tool.Name, err)
		return ""
	}
	t.Fatalf("needs %s: %v", tool.Name, err)
	return ""
}

// InCI reports whether the environment variable CI says the tests run in continuous integration
// ("true" or "1"), where a test that cannot get what it needs fails instead of skipping.
func InCI() bool {
	switch os.Getenv("CI") {
	case "true", "TRUE", "True", "1":
		return true
	}
	return false
}
