package impl_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/impl"
	"github.com/stinthq/stint/spi"
)

// anyParams take any JSON in Data, as params with free-form parts do.
type anyParams struct {
	Key  string          `json:"key"`
	Data json.RawMessage `json:"data,omitempty"`
}

var anyKind = api.Kind[anyParams, json.RawMessage]{ID: "test.any"}

// anyBehavior returns Data as its result; with the key "error" it fails
// with Data's text as its message, with "progress" it checkpoints Data
// first and fails with the checkpoint's error, if any.
type anyBehavior struct{}

func (anyBehavior) Kind() api.Kind[anyParams, json.RawMessage] { return anyKind }
func (anyBehavior) TaskID(ids spi.IDs, p anyParams) api.TaskID { return ids.Deterministic(p.Key) }
func (anyBehavior) Run(ctx context.Context, rc spi.RunContext, p anyParams) (json.RawMessage, error) {
	var text string
	_ = json.Unmarshal(p.Data, &text)
	switch p.Key {
	case "error":
		return nil, api.Permanent("bad\x00code", "failed with %s", strings.ReplaceAll(text, "NUL", "\x00"))
	case "nul-result":
		return json.RawMessage(`{"text":"a\u0000b"}`), nil
	case "surrogate-result":
		return json.RawMessage(`["\udfff"]`), nil
	case "progress":
		if err := rc.Checkpoint(ctx, map[string]string{"text": "a\x00b"}); err != nil {
			return nil, api.Permanent("checkpoint", "%v", err)
		}
	}
	return json.RawMessage(`{"ok":true}`), nil
}

// Params that Go's encoding/json accepts but PostgreSQL's jsonb refuses are
// an *api.InvalidError naming the member, and nothing is stored; the same
// values just within PostgreSQL's limits are stored. Each refused input is
// first shown refused by PostgreSQL itself, so the table is the real list
// (but for nesting, which stint limits below PostgreSQL's default).
func TestParamsJSONBRefusesAreInvalid(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reg := spi.NewRegistry()
	spi.MustRegister(reg, spi.Behavior[anyParams, json.RawMessage](anyBehavior{}))
	c := e.server("node", time.Minute, func(cfg *impl.ServerConfig) { cfg.Registry = reg })

	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	for _, tc := range []struct {
		name, data, field string // field is empty for data that is stored
	}{
		{"lone high surrogate", `"\ud800"`, "params.data"},
		{"lone low surrogate", `{"text":"x\udfffy"}`, "params.data.text"},
		{"high surrogate then another", `["ok","\ud800\ud800"]`, "params.data[1]"},
		{"high surrogate then text", `"\udbffabc"`, "params.data"},
		{"surrogate in a key", `{"\udc00":1}`, "params.data"},
		{"NUL", `{"a b":"\u0000"}`, `params.data["a b"]`},
		{"NUL in a key", `{"\u0000":1}`, "params.data"},
		{"number over numeric's integer digits", `1e131072`, "params.data"},
		{"number over numeric's scale", `1e-16384`, "params.data"},
		{"long fraction", `0.` + strings.Repeat("0", 16383) + `1`, "params.data"},
		{"zero with a huge exponent", `0e2000000000`, "params.data"},
		{"nested too deep", deep(spi.MaxJSONDepth + 1), "params.data" + strings.Repeat("[0]", spi.MaxJSONDepth-1)},
		{"surrogate pair", `"\ud83d\ude00"`, ""},
		{"escaped backslash before u", `"\\ud800"`, ""},
		{"numeric's largest", `1e131071`, ""},
		{"numeric's smallest scale", `-1e-16383`, ""},
		{"zero with a large exponent", `0e1000000`, ""},
		{"deepest allowed", deep(spi.MaxJSONDepth - 1), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			params := `{"key":"k-` + strings.ReplaceAll(tc.name, " ", "-") + `","data":` + tc.data + `}`
			_, pgErr := e.pool.Exec(e.ctx, `SELECT $1::text::jsonb`, params)
			sub, err := c.Submit(e.ctx, api.SubmitRequest{Behavior: anyKind.ID, Params: json.RawMessage(params)})
			if tc.field == "" {
				require.NoError(t, pgErr)
				require.NoError(t, err)
				_, err := c.Get(e.ctx, sub.ID)
				require.NoError(t, err)
				return
			}
			if !strings.HasPrefix(tc.name, "nested") {
				// Nesting is refused at a depth that depends on the
				// server's max_stack_depth: stint's limit is far below
				// the default's.
				require.Error(t, pgErr, "PostgreSQL refuses it")
			}
			require.True(t, json.Valid([]byte(params)), "Go accepts it")
			var ie *api.InvalidError
			require.ErrorAs(t, err, &ie)
			require.Equal(t, tc.field, ie.Field, "%v", err)
		})
	}
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task WHERE params->>'key' NOT IN
		('k-surrogate-pair', 'k-escaped-backslash-before-u', 'k-numeric''s-largest', 'k-numeric''s-smallest-scale',
		 'k-zero-with-a-large-exponent', 'k-deepest-allowed')`), "nothing refused is stored")
}

// What a run writes that PostgreSQL's jsonb refuses does not fail the
// run's finish again and again: a result makes the task fail for good
// (bad_result), an error is stored with its NUL characters replaced, a
// checkpoint is an error of Checkpoint.
func TestRunOutputsJSONBRefusesAreHandled(t *testing.T) {
	t.Parallel()
	e := setup(t)
	reg := spi.NewRegistry()
	spi.MustRegister(reg, spi.Behavior[anyParams, json.RawMessage](anyBehavior{}))
	srv := e.server("node", time.Minute, func(cfg *impl.ServerConfig) { cfg.Registry = reg })
	await := func(key, data string) api.Task {
		t.Helper()
		f, err := api.Submit(e.ctx, srv, anyKind, anyParams{Key: key, Data: json.RawMessage(data)})
		require.NoError(t, err)
		_, err = f.Await(e.ctx)
		var te *api.TaskError
		if err != nil && !errors.As(err, &te) {
			require.NoError(t, err)
		}
		task, err := srv.Get(e.ctx, f.ID())
		require.NoError(t, err)
		return task
	}
	for _, key := range []string{"nul-result", "surrogate-result"} {
		task := await(key, "")
		require.Equal(t, api.StatusFailure, task.Status, key)
		require.Equal(t, "bad_result", task.Error.Code, key)
		require.Contains(t, task.Error.Message, "invalid result", key)
	}
	task := await("error", `"a NUL here"`)
	require.Equal(t, api.StatusFailure, task.Status)
	require.Equal(t, "bad\uFFFDcode", task.Error.Code)
	require.Equal(t, "failed with a \uFFFD here", task.Error.Message)

	task = await("progress", "")
	require.Equal(t, api.StatusFailure, task.Status)
	require.Equal(t, "checkpoint", task.Error.Code)
	require.Contains(t, task.Error.Message, "invalid progress.text: contains a NUL character")

	ok := await("fine", "")
	require.Equal(t, api.StatusSuccess, ok.Status, "the node records other finishes meanwhile")
}
