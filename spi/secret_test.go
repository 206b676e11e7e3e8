package spi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

func TestRedactDSN(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, dsn, want, secret string }{
		{"no password", "host=h user=u dbname=d", "host=h user=u dbname=d", ""},
		{"plain", "host=h password=pw dbname=d", "host=h password=xxxxx dbname=d", "pw"},
		{"quoted with spaces", "host=h user=u password='part one Secret' dbname=d",
			"host=h user=u password=xxxxx dbname=d", "one Secret"},
		{"quoted with escaped quotes", `host=h password='it\'s a \\ secret' dbname=d`,
			"host=h password=xxxxx dbname=d", "a \\"},
		{"spaces around =", "host=h password = 'a b' dbname=d", "host=h password=xxxxx dbname=d", "a b"},
		{"unquoted escaped space", `host=h password=pa\ ss dbname=d`, "host=h password=xxxxx dbname=d", `\ ss`},
		{"unterminated quote", "host=h password='open to the end dbname=d", "host=h password=xxxxx", "the end"},
		{"sslpassword", "host=h sslpassword=keypw sslkey=/k", "host=h sslpassword=xxxxx sslkey=/k", "keypw"},
		{"capitals", "host=h PASSWORD=pw", "host=h PASSWORD=xxxxx", "pw"},
		{"URL without password", "postgres://u@h:5432/d?sslmode=disable", "postgres://u@h:5432/d?sslmode=disable", ""},
		{"URL with password", "postgres://u:pw@h:5432/d", "postgres://u:xxxxx@h:5432/d", "pw"},
		{"URL with @ and ? in the password", "postgresql://u:p@s?s@h/d", "postgresql://u:xxxxx@h/d", "s?s"},
		{"URL query password", "postgres://u@h/d?password=pw&sslmode=disable",
			"postgres://u@h/d?password=xxxxx&sslmode=disable", "pw"},
		{"URL query sslpassword, escaped name", "postgres://h/d?ssl%70assword=pw",
			"postgres://h/d?ssl%70assword=xxxxx", "pw"},
		{"URL without path, query password", "postgres://u:pw@h?password=pw2", "postgres://u:xxxxx@h?password=xxxxx", "pw2"},
		{"https URL with a token", "https://example.com/f?token=tk&x=1#frag", "https://example.com/f?token=xxxxx&x=1#frag", "tk"},
		{"URL in text", "fetch https://u:pw@example.com/f failed", "fetch https://u:xxxxx@example.com/f failed", "pw"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := spi.RedactDSN(tc.dsn)
			require.Equal(t, tc.want, got)
			if tc.secret != "" {
				require.NotContains(t, got, tc.secret)
			}
			require.Equal(t, got, spi.RedactDSN(got), "redacting twice changes nothing")
		})
	}
}

// secretParams hold secrets in every way a params type can mark them.
type secretParams struct {
	Name   string            `json:"name"`
	Token  spi.Secret        `json:"token"`
	Key    string            `json:"key,omitempty" stint:"secret"`
	DB     endpoint          `json:"db"`
	Others []endpoint        `json:"others,omitempty"`
	Vault  map[string]string `json:"vault,omitempty" stint:"secret"`
	Ptr    *spi.Secret       `json:"ptr,omitempty"`
	embedded
}

type endpoint struct {
	DSN string `json:"dsn" stint:"dsn"`
}

type embedded struct {
	Extra spi.Secret `json:"extra,omitempty"`
}

type secretBehavior struct{}

func (secretBehavior) Kind() api.Kind[secretParams, struct{}] {
	return api.Kind[secretParams, struct{}]{ID: "test.secret"}
}
func (secretBehavior) TaskID(ids spi.IDs, _ secretParams) api.TaskID { return ids.Unique() }
func (secretBehavior) Run(context.Context, spi.RunContext, secretParams) (struct{}, error) {
	return struct{}{}, nil
}

// The secrets a params type marks (a Secret, a secret or dsn tag) are
// redacted for readers wherever they are in the params, whatever their
// capitals, while the params decode whole for runs.
func TestRedactParamsBySecretFields(t *testing.T) {
	t.Parallel()
	reg := spi.NewRegistry()
	spi.MustRegister(reg, spi.Behavior[secretParams, struct{}](secretBehavior{}))
	raw := `{"name":"n","TOKEN":"t0ken-1","key":"k3y-2","db":{"dsn":"host=h password='part one Secret'"},` +
		`"others":[{"DSN":"postgres://u:url-pw@h/d"}],"vault":{"a":"v4ult-3"},"ptr":"p0inter-4","extra":"3xtra-5"}`

	r, ok := reg.Lookup("test.secret")
	require.True(t, ok)
	p, err := r.Decode([]byte(raw))
	require.NoError(t, err)
	sp := p.(secretParams)
	require.Equal(t, spi.Secret("t0ken-1"), sp.Token, "a run gets the secret")
	enc, err := json.Marshal(sp)
	require.NoError(t, err)
	require.Contains(t, string(enc), `"token":"t0ken-1"`, "a Secret encodes as its value")
	require.Equal(t, "xxxxx xxxxx", fmt.Sprintf("%v %s", sp.Token, sp.Extra), "printed, a Secret shows no secret")

	task := api.Task{Behavior: "test.secret", Params: json.RawMessage(raw),
		Error: &api.TaskError{Message: "connect to postgres://u:url-pw@h/d: refused"}}
	reg.RedactTask(&task)
	require.Equal(t, "connect to postgres://u:xxxxx@h/d: refused", task.Error.Message)
	got := string(task.Params)
	for _, secret := range []string{"t0ken-1", "k3y-2", "one Secret", "url-pw", "v4ult-3", "p0inter-4", "3xtra-5"} {
		require.NotContains(t, got, secret)
	}
	require.JSONEq(t, `{"name":"n","TOKEN":"xxxxx","key":"xxxxx","db":{"dsn":"host=h password=xxxxx"},`+
		`"others":[{"DSN":"postgres://u:xxxxx@h/d"}],"vault":{"a":"xxxxx"},"ptr":"xxxxx","extra":"xxxxx"}`, got)
}
