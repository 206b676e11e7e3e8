package ingest_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/behaviors/ingest"
)

func TestParseManifest(t *testing.T) {
	t.Parallel()
	sha := strings.Repeat("ab", 32)
	objs, err := ingest.ParseManifest(`#%checkm_0.7
# a comment

http://h/a.txt | SHA-256 | ` + strings.ToUpper(sha) + ` | 12 | a.txt | obj1 |
https://h/dir/b.bin | | | | | obj1 | ark:/13030/m5abc
file:///srv/c.txt
http://h/d.txt | md5 | ` + strings.Repeat("0", 32) + ` | | sub/d.txt
#%eof
`)
	require.NoError(t, err)
	require.Len(t, objs, 3)
	require.Equal(t, "obj1", objs[0].LocalID)
	require.Equal(t, "ark:/13030/m5abc", objs[0].Identifier, "the primary identifier of any line of the object")
	require.Len(t, objs[0].Files, 2)
	require.Equal(t, ingest.File{URL: "http://h/a.txt", Name: "a.txt", DigestAlg: "sha256", Digest: sha, Size: ptr(int64(12))}, objs[0].Files[0])
	require.Equal(t, "b.bin", objs[0].Files[1].Name, "the name defaults to the URL's last segment")
	require.Equal(t, []ingest.File{{URL: "file:///srv/c.txt", Name: "c.txt"}}, objs[1].Files)
	require.Equal(t, "sub/d.txt", objs[2].Files[0].Name)
	require.Equal(t, "md5", objs[2].Files[0].DigestAlg)

	// A #%fields line reorders the columns.
	objs, err = ingest.ParseManifest("#%fields | nfo:fileName | nfo:fileLastModified | nfo:fileUrl\nx.txt | 2020-01-01 | http://h/y\n")
	require.NoError(t, err)
	require.Equal(t, "x.txt", objs[0].Files[0].Name)
	require.Equal(t, "http://h/y", objs[0].Files[0].URL)
}

func TestParseManifestErrorsNameTheLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		manifest, want string
	}{
		{"http://h/a | sha256 | abc", "manifest line 1: sha256 digest \"abc\": want 64 hex digits"},
		{"# header\n\nftp://h/a", "manifest line 3: URL \"ftp://h/a\": scheme \"ftp\" is not allowed (want http, https or file)"},
		{"http://h/a\nhttp://h/b | crc32 | 1234", "manifest line 2: unknown digest algorithm \"crc32\" (want md5, sha1, sha256 or sha512)"},
		{"http://h/a | | | -3", "manifest line 1: size \"-3\": want a number of bytes"},
		{"http://h/a | | | | | | | | |", "manifest line 1: 10 columns, want at most 7"},
		{"relative/path", "manifest line 1: URL \"relative/path\": not absolute"},
		{"file://host/x", "manifest line 1: URL \"file://host/x\": a file URL names no host"},
		{"http://h/a | | | | ../etc/passwd", "manifest line 1: file name \"../etc/passwd\": . and .. are not allowed"},
		{"http://h/a | | | | a | o\nhttp://h/b | | | | a | o", "manifest line 2: file name \"a\" appears twice in one object"},
		{"http://h/a | | | | a | o | ark:/1/x\nhttp://h/b | | | | b | o | ark:/1/y", "manifest line 2: primary identifier \"ark:/1/y\" differs"},
		{"http://h/a | md5", "manifest line 1: digest algorithm \"md5\" given without a digest"},
		{"#%fields | nfo:fileUrl | nfo:color\nhttp://h/a", "manifest line 1: #%fields: unknown field \"nfo:color\""},
		{"# only comments\n", "manifest: no file lines"},
		{" | sha256 | x", "manifest line 1: no file URL"},
	} {
		_, err := ingest.ParseManifest(tc.manifest)
		require.ErrorContains(t, err, tc.want, "manifest %q", tc.manifest)
	}
}

// TestSubmitRejectsBadPayload checks that a bad batch is refused by Submit
// with an *api.InvalidError and stores nothing.
func TestSubmitRejectsBadPayload(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, tc := range []struct {
		params, want string
	}{
		{`{"submitter":"s","profile":"coll","payload_url":"ftp://h/a"}`, `scheme "ftp" is not allowed`},
		{`{"submitter":"s","profile":"coll","manifest":"http://h/a\nhttp://h/b | whirlpool | 00"}`, `manifest line 2: unknown digest algorithm "whirlpool"`},
		{`{"submitter":"s","profile":"coll","manifest":"http://h/a | | | many"}`, `manifest line 1: size "many"`},
		{`{"submitter":"s","profile":"coll"}`, `payload_url or manifest: one of them is required`},
		{`{"submitter":"s","profile":"coll","payload_url":"http://h/a","manifest":"http://h/b"}`, `give one of them, not both`},
		{`{"submitter":"s","profile":"no spaces","payload_url":"http://h/a"}`, `profile "no spaces"`},
		{`{"submitter":"s","profile":"coll","payload_url":"http://h/a","extra":1}`, `extra`},
		{`{"profile":"coll","payload_url":"http://h/a"}`, `params.submitter`},
		{`{"submitter":"s","profile":"coll","payload_url":"http://h/a","priority":-1}`, `params.priority`},
	} {
		_, err := e.client.Submit(e.ctx, api.SubmitRequest{Behavior: ingest.BatchBehavior, Params: json.RawMessage(tc.params)})
		var inv *api.InvalidError
		require.True(t, errors.As(err, &inv), "params %s: want an *api.InvalidError, got %v", tc.params, err)
		require.ErrorIs(t, err, api.ErrInvalid)
		require.ErrorContains(t, err, tc.want, "params %s", tc.params)
	}
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task`), "a refused submit stores nothing")

	// The typed API refuses it the same way.
	_, err := api.Submit(e.ctx, e.client, ingest.Batch, ingest.BatchParams{Submitter: "s", Profile: "coll",
		Manifest: "http://h/a | sha512 | 1234"})
	require.ErrorIs(t, err, api.ErrInvalid)
	require.ErrorContains(t, err, "manifest line 1: sha512 digest")
	require.Zero(t, e.count(`SELECT count(*) FROM stint_task`))

	// A good one is stored.
	_, err = api.Submit(e.ctx, e.client, ingest.Batch, ingest.BatchParams{Submitter: "s", Profile: "coll", PayloadURL: "https://h/a.txt"})
	require.NoError(t, err)
	require.Equal(t, 1, e.count(`SELECT count(*) FROM stint_task`))
}

func ptr[T any](v T) *T { return &v }
