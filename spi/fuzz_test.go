package spi_test

import (
	"errors"
	"regexp"
	"testing"
	"unicode/utf8"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// FuzzDecode feeds arbitrary bytes to params decoding: it either returns
// params that pass validation or an *api.InvalidError, and never panics.
func FuzzDecode(f *testing.F) {
	for _, seed := range []string{
		`{}`, `{"name":"ok","count":2}`, `{"name":"a","inner":{"url":"http://x"}}`, `{"name":"\u0000"}`,
		`{"name":"a","x":1}`, `[`, `{"name":1e999}`, `{"name":"a"}{}`, "\xff\xfe", `{"inner":{"url":[1,2]}}`,
		`{"name":"` + string(make([]byte, 200)) + `"}`, `{"count":-9223372036854775809}`, `null`,
		"{\"nAme\":\"\xff000\"}", `{"name":"ééééé"}`, `{"name":"a\ud800"}`, `{"name":"\ud83d\ude00"}`, `{"name":"\\ud800"}`,
		`{"name":"a","inner":{"url":"\udc00"}}`, `{"\ud800":1}`,
	} {
		f.Add([]byte(seed))
	}
	reg := spi.NewRegistry()
	spi.MustRegister[params, string](reg, kind{})
	r, _ := reg.Lookup("test.kind")
	f.Fuzz(func(t *testing.T, raw []byte) {
		p, err := r.Decode(raw)
		if err != nil {
			var ie *api.InvalidError
			if !errors.As(err, &ie) || !errors.Is(err, api.ErrInvalid) {
				t.Fatalf("decode %q: error %v is not an InvalidError", raw, err)
			}
			return
		}
		got := p.(params)
		// max=5 counts characters, not bytes.
		if got.Name == "" || utf8.RuneCountInString(got.Name) > 5 || got.Count < 0 {
			t.Fatalf("decode %q: accepted invalid params %+v", raw, got)
		}
	})
}

var taskIDShape = regexp.MustCompile(`^[A-Za-z0-9._:/@+=-]{3,128}$`)

// FuzzCheckTaskID checks that accepted ids have the documented shape.
func FuzzCheckTaskID(f *testing.F) {
	for _, seed := range []string{"abc", "ab", "a b", "x'; DROP TABLE stint_task;--", "ñññ", "a\x00bc", "demo.echo:0123456789abcdef"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, id string) {
		err := spi.CheckTaskID("id", api.TaskID(id))
		if (err == nil) != taskIDShape.MatchString(id) {
			t.Fatalf("id %q: accepted=%v, shape=%v", id, err == nil, taskIDShape.MatchString(id))
		}
		if err != nil && !utf8.ValidString(err.Error()) && utf8.ValidString(id) {
			t.Fatalf("id %q: error message is not valid UTF-8", id)
		}
	})
}
