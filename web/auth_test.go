package web_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/web"
)

func TestTokens(t *testing.T) {
	t.Parallel()
	var tokens web.Tokens
	require.NoError(t, tokens.AddText("file", `
# operators
admin:aaaaaaaaaaaaaaaaaaaa

read:rrrrrrrrrrrrrrrrrrrr, submit:ssssssssssssssssssss
`))
	require.Equal(t, 3, tokens.Len())
	require.Equal(t, web.RoleAdmin, tokens.Lookup("aaaaaaaaaaaaaaaaaaaa"))
	require.Equal(t, web.RoleRead, tokens.Lookup("rrrrrrrrrrrrrrrrrrrr"))
	require.Equal(t, web.RoleSubmit, tokens.Lookup("ssssssssssssssssssss"))
	require.Equal(t, web.RoleNone, tokens.Lookup("aaaaaaaaaaaaaaaaaaab"))
	require.Equal(t, web.RoleNone, tokens.Lookup(""))
	require.Equal(t, web.RoleNone, (*web.Tokens)(nil).Lookup("aaaaaaaaaaaaaaaaaaaa"))

	for _, c := range []struct{ text, want string }{
		{"admin", "line 1: want ROLE:TOKEN"},
		{"root:aaaaaaaaaaaaaaaaaaaa", `line 1: unknown role "root"`},
		{"\nread:short", "line 2: read token is 5 characters: tokens must be at least 16"},
		{"read:aaaaaaaaaaaaaaaaaaaa", "given twice"},
		{"read:aaaaaaaaaaaaaaaaaaa\x01", "printable ASCII"},
	} {
		err := tokens.AddText("file", c.text)
		require.ErrorContains(t, err, c.want, c.text)
		require.NotContains(t, err.Error(), "aaaaaaaaaaaaaaaaaaa", "errors never show a token")
	}
	require.Equal(t, 3, tokens.Len())
}

func TestRoles(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"read", "submit", "admin"} {
		r, err := web.ParseRole(name)
		require.NoError(t, err)
		require.Equal(t, name, r.String())
	}
	require.True(t, web.RoleRead < web.RoleSubmit && web.RoleSubmit < web.RoleAdmin)
	_, err := web.ParseRole("Admin")
	require.Error(t, err)
	require.True(t, strings.Contains(web.RoleNone.String(), "none"))
}
