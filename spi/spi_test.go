package spi_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

func TestDeterministicIDs(t *testing.T) {
	t.Parallel()
	ids := spi.NewIDs("demo.echo")
	a := ids.Deterministic("x", 1)
	require.Equal(t, a, ids.Deterministic("x", 1))
	require.NotEqual(t, a, ids.Deterministic("x", 2))
	require.NotEqual(t, ids.Deterministic("ab", "c"), ids.Deterministic("a", "bc"), "parts are delimited")
	require.NotEqual(t, a, spi.NewIDs("demo.other").Deterministic("x", 1), "the behavior is part of the id")
	require.NoError(t, spi.CheckTaskID("id", a))
	u := ids.Unique()
	require.NoError(t, spi.CheckTaskID("id", u))
	require.NotEqual(t, u, ids.Unique())
}

// TestUniqueIDs checks that unique ids are UUIDv7s near the current time,
// strictly ordered within the process, across many refills of their
// random bytes and many chunks of their text.
func TestUniqueIDs(t *testing.T) {
	t.Parallel()
	ids := spi.NewIDs("demo.echo")
	before := time.Now().UnixMilli()
	var prev string
	var all []string
	for i := range 3000 {
		id := string(ids.Unique())
		u, err := uuid.Parse(id)
		require.NoError(t, err, "id %d", i)
		require.Equal(t, u.String(), id, "the text of a UUID")
		require.Equal(t, uuid.Version(7), u.Version(), "id %s", id)
		require.Equal(t, uuid.RFC4122, u.Variant(), "id %s", id)
		require.Greater(t, id, prev, "ids are ordered")
		sec, _ := u.Time().UnixTime()
		require.InDelta(t, before/1000, sec, 5, "id %s is of now", id)
		prev = id
		all = append(all, id)
	}
	require.IsIncreasing(t, all, "ids keep their text as more are made")
}

// idKind derives its task ids with the function id.
type idKind struct {
	name api.BehaviorID
	id   func(spi.IDs) api.TaskID
}

func (k idKind) Kind() api.Kind[struct{}, string]                            { return api.Kind[struct{}, string]{ID: k.name} }
func (k idKind) TaskID(ids spi.IDs, _ struct{}) api.TaskID                   { return k.id(ids) }
func (idKind) Run(context.Context, spi.RunContext, struct{}) (string, error) { return "", nil }

// TestNewTaskIDTellsANewID checks that only the id IDs.Unique made for
// the call counts as new: the store inserts such a task without looking
// for a stored one.
func TestNewTaskIDTellsANewID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		id     func(spi.IDs) api.TaskID
		unique bool
	}{
		{"unique", func(ids spi.IDs) api.TaskID { return ids.Unique() }, true},
		{"deterministic", func(ids spi.IDs) api.TaskID { return ids.Deterministic("x") }, false},
		{"fixed", func(spi.IDs) api.TaskID { return "fixed-id" }, false},
		{"derived from a unique one", func(ids spi.IDs) api.TaskID { return "p-" + ids.Unique() }, false},
		{"an earlier unique one", func(ids spi.IDs) api.TaskID { id := ids.Unique(); ids.Unique(); return id }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			reg := spi.NewRegistry()
			spi.MustRegister[struct{}, string](reg, idKind{"test.ids", tc.id})
			r, ok := reg.Lookup("test.ids")
			require.True(t, ok)
			id, unique := r.NewTaskID(struct{}{})
			require.NotEmpty(t, id)
			require.Equal(t, tc.unique, unique)
		})
	}
}

func TestCheckIDs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"abc", true}, {"a.b:c/d@e+f=g-h_i", true}, {"ab", false}, {"", false},
		{string(make([]byte, 129)), false}, {"a b c", false}, {"a'b;c", false}, {"añb", false}, {"a\x00bc", false},
	} {
		err := spi.CheckTaskID("id", api.TaskID(tc.id))
		require.Equal(t, tc.ok, err == nil, "id %q: %v", tc.id, err)
		if err != nil {
			require.ErrorIs(t, err, api.ErrInvalid)
		}
	}
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"demo.echo", true}, {"ingest.job", true}, {"ab", false}, {"Demo.echo", false}, {"1abc", false}, {"a_b-c.d", true},
	} {
		err := spi.CheckBehaviorID(api.BehaviorID(tc.id))
		require.Equal(t, tc.ok, err == nil, "behavior %q: %v", tc.id, err)
	}
}

func TestBackoffDoublesWithJitterAndCap(t *testing.T) {
	t.Parallel()
	for n := 1; n <= 40; n++ {
		d := spi.Backoff(time.Second, time.Hour, n)
		full := min(time.Second<<min(n-1, 20), time.Hour)
		require.GreaterOrEqual(t, d, full*3/4, "failure %d", n)
		require.LessOrEqual(t, d, full, "failure %d", n)
	}
}

type params struct {
	Name  string `json:"name" validate:"required,max=5"`
	Count int    `json:"count" validate:"gte=0"`
	Inner struct {
		URL string `json:"url" validate:"omitempty,url"`
	} `json:"inner"`
}

type kind struct{}

func (kind) Kind() api.Kind[params, string]          { return api.Kind[params, string]{ID: "test.kind"} }
func (kind) TaskID(ids spi.IDs, p params) api.TaskID { return ids.Deterministic(p.Name) }
func (kind) Policy() spi.Policy                      { return spi.Policy{MaxAttempts: 2, MaxParamsBytes: 100} }
func (kind) Run(context.Context, spi.RunContext, params) (string, error) {
	return "", errors.New("boom")
}

func TestDecodeNamesTheField(t *testing.T) {
	t.Parallel()
	reg := spi.NewRegistry()
	spi.MustRegister[params, string](reg, kind{})
	require.Error(t, spi.Register[params, string](reg, kind{}), "a second registration is refused")
	r, ok := reg.Lookup("test.kind")
	require.True(t, ok)
	for _, tc := range []struct{ raw, field string }{
		{`{}`, "params.name"},
		{`{"name":"toolong"}`, "params.name"},
		{`{"name":"a","count":-1}`, "params.count"},
		{`{"name":"a","inner":{"url":"not a url"}}`, "params.inner.url"},
		{`{"name":1}`, "params.name"},
		{`{"name":"a","x":1}`, "params.x"},
		{`[1]`, "params"},
		{`{"name":"a"}{}`, "params"},
		{`{"name":"` + string(make([]byte, 100)) + `"}`, "params"},
	} {
		_, err := r.Decode([]byte(tc.raw))
		var ie *api.InvalidError
		require.ErrorAs(t, err, &ie, tc.raw)
		require.Equal(t, tc.field, ie.Field, "%s: %v", tc.raw, err)
	}
	p, err := r.Decode([]byte(`{"name":"ok","count":2}`))
	require.NoError(t, err)
	require.Equal(t, "ok", p.(params).Name)
}

// checked validates itself while decoding.
type checked struct{ Manifest string }

func (c *checked) UnmarshalJSON(b []byte) error {
	if string(b) != `{"manifest":"ok"}` {
		return api.Invalid("params.manifest", "line 2: bad digest")
	}
	c.Manifest = "ok"
	return nil
}

type checkedKind struct{}

func (checkedKind) Kind() api.Kind[checked, string] {
	return api.Kind[checked, string]{ID: "test.checked"}
}
func (checkedKind) TaskID(ids spi.IDs, _ checked) api.TaskID                     { return ids.Unique() }
func (checkedKind) Run(context.Context, spi.RunContext, checked) (string, error) { return "", nil }

func TestDecodeKeepsTheFieldOfAParamsTypesOwnError(t *testing.T) {
	t.Parallel()
	reg := spi.NewRegistry()
	spi.MustRegister[checked, string](reg, checkedKind{})
	r, _ := reg.Lookup("test.checked")
	_, err := r.Decode([]byte(`{"manifest":"bad"}`))
	var ie *api.InvalidError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "params.manifest", ie.Field)
	require.Equal(t, "line 2: bad digest", ie.Reason)
	_, err = r.Decode([]byte(`{"manifest":"ok"}`))
	require.NoError(t, err)
}

// paramsKind registers params type P under id.
type paramsKind[P any] struct{ id api.BehaviorID }

func (k paramsKind[P]) Kind() api.Kind[P, string]                            { return api.Kind[P, string]{ID: k.id} }
func (paramsKind[P]) TaskID(ids spi.IDs, _ P) api.TaskID                     { return ids.Unique() }
func (paramsKind[P]) Run(context.Context, spi.RunContext, P) (string, error) { return "", nil }

// deep holds its rules behind a pointer; list refers to itself.
type deep struct {
	Next *struct {
		Level *struct {
			Name string `json:"name" validate:"required"`
		} `json:"level"`
	} `json:"next"`
}

type list struct {
	Value int   `json:"value"`
	Next  *list `json:"next"`
}

// Params of {} skip the JSON decoder, and structs without rules skip the
// validator: neither may change what is accepted.
func TestDecodeShortcutsKeepTheRules(t *testing.T) {
	t.Parallel()
	reg := spi.NewRegistry()
	spi.MustRegister[deep, string](reg, paramsKind[deep]{"test.deep"})
	spi.MustRegister[list, string](reg, paramsKind[list]{"test.list"})
	spi.MustRegister[struct{}, string](reg, paramsKind[struct{}]{"test.empty"})
	spi.MustRegister[map[string]int, string](reg, paramsKind[map[string]int]{"test.map"})
	spi.MustRegister[checked, string](reg, checkedKind{})
	for _, tc := range []struct {
		behavior api.BehaviorID
		raw      string
		field    string // "" when the params are valid
	}{
		{"test.deep", `{}`, ""},
		{"test.deep", `{"next":{"level":{}}}`, "params.next.level.name"},
		{"test.deep", `{"next":{"level":{"name":"x"}}}`, ""},
		{"test.list", `{}`, ""},
		{"test.list", ` {} `, ""},
		{"test.list", `{"value":1,"next":{"value":2}}`, ""},
		{"test.list", `{"x":1}`, "params.x"},
		{"test.empty", `{}`, ""},
		{"test.empty", ``, ""},
		{"test.empty", `{"x":1}`, "params.x"},
		{"test.empty", `[]`, "params"},
		{"test.map", `{}`, ""},
		{"test.checked", `{}`, "params.manifest"}, // its own UnmarshalJSON refuses {}
	} {
		r, ok := reg.Lookup(tc.behavior)
		require.True(t, ok)
		p, err := r.Decode([]byte(tc.raw))
		if tc.field == "" {
			require.NoError(t, err, "%s %s", tc.behavior, tc.raw)
			continue
		}
		var ie *api.InvalidError
		require.ErrorAs(t, err, &ie, "%s %s: got %v", tc.behavior, tc.raw, p)
		require.Equal(t, tc.field, ie.Field, "%s %s", tc.behavior, tc.raw)
	}
	m, err := func() (any, error) { r, _ := reg.Lookup("test.map"); return r.Decode([]byte(`{}`)) }()
	require.NoError(t, err)
	require.NotNil(t, m.(map[string]int), "{} decodes to an empty map, not nil")
}

// selfEncoded and textEncoded are results without fields that encode
// themselves.
type selfEncoded struct{}

func (selfEncoded) MarshalJSON() ([]byte, error) { return []byte(`"self"`), nil }

type textEncoded struct{}

func (textEncoded) MarshalText() ([]byte, error) { return []byte("text"), nil }

// resultKind returns the zero R from every run.
type resultKind[R any] struct{ id api.BehaviorID }

func (k resultKind[R]) Kind() api.Kind[struct{}, R]             { return api.Kind[struct{}, R]{ID: k.id} }
func (resultKind[R]) TaskID(ids spi.IDs, _ struct{}) api.TaskID { return ids.Unique() }
func (resultKind[R]) Run(context.Context, spi.RunContext, struct{}) (R, error) {
	var r R
	return r, nil
}

// Results without fields skip the encoder unless they encode themselves.
func TestEmptyResultsEncodeAsTheEncoderWould(t *testing.T) {
	t.Parallel()
	reg := spi.NewRegistry()
	spi.MustRegister[struct{}, struct{}](reg, resultKind[struct{}]{"test.r.empty"})
	spi.MustRegister[struct{}, selfEncoded](reg, resultKind[selfEncoded]{"test.r.self"})
	spi.MustRegister[struct{}, textEncoded](reg, resultKind[textEncoded]{"test.r.text"})
	spi.MustRegister[struct{}, struct{ N int }](reg, resultKind[struct{ N int }]{"test.r.field"})
	for id, want := range map[api.BehaviorID]string{
		"test.r.empty": `{}`,
		"test.r.self":  `"self"`,
		"test.r.text":  `"text"`,
		"test.r.field": `{"N":0}`,
	} {
		r, ok := reg.Lookup(id)
		require.True(t, ok)
		out := r.Execute(context.Background(), nil, struct{}{}, 0)
		require.Nil(t, out.Err, id)
		require.JSONEq(t, want, string(out.Result), id)
	}
}

func TestSleepEndsWithItsContext(t *testing.T) {
	t.Parallel()
	require.NoError(t, spi.Sleep(context.Background(), time.Millisecond))
	cause := errors.New("removed")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	require.ErrorIs(t, spi.Sleep(ctx, time.Hour), cause, "a cancelled context ends the wait with its cause")
}

// worded has fields of each JSON kind and the common rules.
type worded struct {
	Text  string   `json:"text" validate:"required,max=10"`
	Delay int      `json:"delay_ms" validate:"gte=0,lte=60000"`
	Tags  []string `json:"tags" validate:"max=2"`
	Mode  string   `json:"mode" validate:"omitempty,oneof=fast slow"`
	On    bool     `json:"on"`
	Ratio float64  `json:"ratio"`
	Inner struct {
		N uint `json:"n"`
	} `json:"inner"`
}

// TestDecodeMessagesSayWhatIsWrong checks the whole message of each kind
// of bad params: in JSON's and the rules' terms, without Go type names or
// validator tags.
func TestDecodeMessagesSayWhatIsWrong(t *testing.T) {
	t.Parallel()
	reg := spi.NewRegistry()
	spi.MustRegister[worded, string](reg, paramsKind[worded]{id: "test.worded"})
	r, _ := reg.Lookup("test.worded")
	for _, tc := range []struct{ raw, msg string }{
		{`{}`, "invalid params.text: is required"},
		{`{"text":"01234567890"}`, "invalid params.text: must be at most 10 characters long"},
		{`{"text":"a","delay_ms":60001}`, "invalid params.delay_ms: must be at most 60000"},
		{`{"text":"a","delay_ms":-1}`, "invalid params.delay_ms: must be at least 0"},
		{`{"text":"a","tags":["x","y","z"]}`, "invalid params.tags: must have at most 2 items"},
		{`{"text":"a","mode":"medium"}`, "invalid params.mode: must be one of: fast, slow"},
		{`{"text":["a"]}`, "invalid params.text: must be a string, got an array"},
		{`{"text":"a","delay_ms":"5"}`, "invalid params.delay_ms: must be an integer, got a string"},
		{`{"text":"a","delay_ms":1.5}`, "invalid params.delay_ms: must be an integer, got the number 1.5"},
		{`{"text":"a","on":"yes"}`, "invalid params.on: must be true or false, got a string"},
		{`{"text":"a","ratio":{}}`, "invalid params.ratio: must be a number, got an object"},
		{`{"text":"a","tags":"x"}`, "invalid params.tags: must be an array, got a string"},
		{`{"text":"a","inner":{"n":-1}}`, "invalid params.inner.n: must be a non-negative integer, got the number -1"},
		{`{"text":"a","inner":3}`, "invalid params.inner: must be a JSON object, got a number"},
		{`[1]`, "invalid params: must be a JSON object, got an array"},
		{`"a"`, "invalid params: must be a JSON object, got a string"},
		{`{"text":"a","x":1}`, "invalid params.x: unknown field"},
		{`{"text":`, "invalid params: not valid JSON: it ends too early"},
		{`{"text":"a"}{}`, "invalid params: unexpected data after the JSON value"},
		{`{"text" "a"}`, "invalid params: not valid JSON at byte 9: invalid character '\"' after object key"},
	} {
		_, err := r.Decode([]byte(tc.raw))
		require.EqualError(t, err, tc.msg, tc.raw)
		require.ErrorIs(t, err, api.ErrInvalid, tc.raw)
	}
}

func TestRedactParamsHidesPasswords(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ raw, want string }{
		{`{"text":"hi"}`, `{"text":"hi"}`},
		{`{"dsn":"postgres://u:pw@h:5432/db?sslmode=disable"}`, `{"dsn":"postgres://u:xxxxx@h:5432/db?sslmode=disable"}`},
		{`{"dsn":"postgres://u@h/db?password=pw&sslmode=disable"}`, `{"dsn":"postgres://u@h/db?password=xxxxx&sslmode=disable"}`},
		{`{"dsn":"host=h password=pw dbname=d"}`, `{"dsn":"host=h password=xxxxx dbname=d"}`},
		{`{"dsn":"host=h password='p w' dbname=d"}`, `{"dsn":"host=h password=xxxxx dbname=d"}`},
		{`{"a":{"b":["https://x:y@example.com/"]}}`, `{"a":{"b":["https://x:xxxxx@example.com/"]}}`},
		{`{"db_password":"pw","api_secret":"s","n":1}`, `{"api_secret":"xxxxx","db_password":"xxxxx","n":1}`},
		{`{"url":"https://example.com/a?b=c"}`, `{"url":"https://example.com/a?b=c"}`},
		{`not json`, `not json`},
	} {
		got := (*spi.Registry)(nil).RedactParams("test.kind", []byte(tc.raw))
		require.Equal(t, tc.want, string(got), tc.raw)
	}
}
