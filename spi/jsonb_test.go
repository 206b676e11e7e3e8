package spi_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

func TestCheckJSONBNamesTheMember(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ raw, field, reason string }{
		{`{"a":[1,{"b c":"\u0000"}]}`, `p.a[1]["b c"]`, "NUL"},
		{`{"a":{"\ud800x":1}}`, `p.a`, `lone UTF-16 surrogate \ud800 (an object key)`},
		{`[1e131072]`, `p[0]`, "digits before the decimal point"},
		{`{"x":-0.5e-16383}`, `p.x`, "digits after the decimal point"},
		{`{"x":1e-99999999999999999999}`, `p.x`, "exponent"},
	} {
		err := spi.CheckJSONB("p", []byte(tc.raw))
		var ie *api.InvalidError
		require.ErrorAs(t, err, &ie, tc.raw)
		require.Equal(t, tc.field, ie.Field, tc.raw)
		require.Contains(t, ie.Error(), tc.reason, tc.raw)
	}
	for _, raw := range []string{`{"a":"\ud800\udc00","b":"\\u0000","c":1e131071,"d":0e9999,"e":[[[]]]}`, `"x"`, `null`, `-0.0`} {
		require.NoError(t, spi.CheckJSONB("p", []byte(raw)), raw)
	}
}
