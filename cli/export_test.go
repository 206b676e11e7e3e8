package cli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// RunProgram runs the test binary at path (this one, or a link to it under
// another name) as a program calling Main (see TestMain) with args and no
// database in its environment, and returns what it printed and its exit
// code.
func RunProgram(t *testing.T, path string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = append(os.Environ(), "STINT_CLI_TEST_MAIN=1", "STINT_DATABASE_URL=")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil {
		require.ErrorAs(t, err, &exit, "stderr: %s", errOut.String())
		code = exit.ExitCode()
	}
	return out.String(), errOut.String(), code
}
