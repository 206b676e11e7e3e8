package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// NodeKind is chaos.node, the workflow nodes' behavior.
var NodeKind = api.Kind[WorkParams, string]{ID: "chaos.node"}

// wfNode is chaos.node, the workflow nodes' behavior. Its effect is a row
// in chaos_effect, written in the transaction of a fenced checkpoint that
// records the effect's run: a run that finds that checkpoint (a run after
// one that wrote its effect and was cut before its end was recorded)
// returns without writing it again, so each node's effect is written
// exactly once, however often its run is cut.
type wfNode struct{ Work }

func (wfNode) Kind() api.Kind[WorkParams, string] { return NodeKind }

func (w wfNode) Run(ctx context.Context, rc spi.RunContext, p WorkParams) (string, error) {
	var done string
	if ok, err := rc.Progress(&done); err != nil {
		return "", err
	} else if ok {
		return done, nil
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	run := hex.EncodeToString(b)
	select {
	case <-ctx.Done():
		return "", context.Cause(ctx)
	case <-time.After(time.Duration(p.SleepMS) * time.Millisecond):
	}
	err := pgx.BeginFunc(ctx, w.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO chaos_effect (task_id, run_id, at) VALUES ($1, $2, clock_timestamp())`, string(rc.TaskID()), run); err != nil {
			return err
		}
		return rc.CheckpointTx(ctx, tx, run)
	})
	if err != nil {
		return "", api.Retryable("effect", "write effect: %v", err)
	}
	return run, nil
}

// CreateEffects creates chaos_effect, the workflow nodes' effects.
func CreateEffects(t *testing.T, ctx context.Context, pool *pgxpool.Pool) {
	_, err := pool.Exec(ctx, `CREATE TABLE chaos_effect (task_id text NOT NULL, run_id text NOT NULL, at timestamptz NOT NULL)`)
	require.NoError(t, err)
}
