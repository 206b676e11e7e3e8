package replication

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// TestDefineWritesRowAndTaskTogether checks that Define writes the
// definition's row and submits its task in one transaction: when the
// submit fails (here, a client that does not know the replication
// behaviors), the row is not written either; when it succeeds, both are
// there.
func TestDefineWritesRowAndTaskTogether(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.makeTables("items", 10)
	db := e.st.Pool()

	blind, err := impl.NewClient(e.st, impl.ClientConfig{Registry: spi.NewRegistry()})
	require.NoError(t, err)
	t.Cleanup(blind.Close)
	_, err = Define(e.ctx, db, blind, Definition{Name: "orphan", Params: e.params("items")})
	require.ErrorIs(t, err, api.ErrUnknownBehavior)
	require.Contains(t, err.Error(), `define replication "orphan": submit its task`)
	_, err = GetDefinition(e.ctx, db, "orphan")
	require.ErrorIs(t, err, ErrNoDefinition, "the failed submit rolled the row back")

	reg := spi.NewRegistry()
	require.NoError(t, Register(reg, testConfig(db)))
	c, err := impl.NewClient(e.st, impl.ClientConfig{Registry: reg})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	id, err := Define(e.ctx, db, c, Definition{Name: "kept", Params: e.params("items")})
	require.NoError(t, err)
	def, err := GetDefinition(e.ctx, db, "kept")
	require.NoError(t, err)
	require.Equal(t, id, def.TaskID)
	task, err := c.Get(e.ctx, id)
	require.NoError(t, err)
	require.Equal(t, api.StatusScheduled, task.Status)
}
