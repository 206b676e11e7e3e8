package web_test

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/stretchr/testify/require"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/web"
)

// openAPIDoc is openapi.json decoded.
type openAPIDoc struct {
	Paths      map[string]map[string]map[string]any `json:"paths"`
	Components struct {
		Schemas map[string]any `json:"schemas"`
	} `json:"components"`
}

// readOpenAPI reads openapi.json.
func readOpenAPI(t *testing.T) openAPIDoc {
	t.Helper()
	raw, err := os.ReadFile("openapi.json")
	require.NoError(t, err)
	var doc openAPIDoc
	require.NoError(t, json.Unmarshal(raw, &doc))
	return doc
}

// Every operation has an operationId: camelCase, and unique.
func TestOpenAPIOperationIDs(t *testing.T) {
	t.Parallel()
	doc := readOpenAPI(t)
	seen := map[string]string{}
	var problems []string
	for path, item := range doc.Paths {
		for method, op := range item {
			k := strings.ToUpper(method) + " " + path
			id, _ := op["operationId"].(string)
			switch {
			case id == "":
				problems = append(problems, k+": no operationId")
			case !isCamelCase(id):
				problems = append(problems, fmt.Sprintf("%s: operationId %q is not camelCase", k, id))
			case seen[id] != "":
				problems = append(problems, fmt.Sprintf("%s: operationId %q is %s's too", k, id, seen[id]))
			}
			seen[id] = k
		}
	}
	slices.Sort(problems)
	require.Empty(t, problems)
}

// isCamelCase reports whether s is a lower-case letter followed by letters
// and digits.
func isCamelCase(s string) bool {
	for i, r := range s {
		if (i == 0 && !unicode.IsLower(r)) || !(unicode.IsLetter(r) || unicode.IsDigit(r)) || r > unicode.MaxASCII {
			return false
		}
	}
	return s != ""
}

// Every field the server sends is in the document's schema of the answer,
// with the JSON type it has: each answer's Go type is filled in every
// field, encoded as the server encodes it, and walked against its schema.
func TestOpenAPISchemasHoldEveryFieldSent(t *testing.T) {
	t.Parallel()
	doc := readOpenAPI(t)
	inputOnly := func(v any) any { // clears the fields set only on input
		switch l := v.(type) {
		case api.ConcurrencyLimit:
			l.Force = false
			return l
		case api.ConcurrencyInfo:
			l.Force = false
			return l
		case web.LimitsResponse:
			for i := range l.Concurrency {
				l.Concurrency[i].Force = false
			}
			return l
		}
		return v
	}
	component := func(name string) any { return map[string]any{"$ref": "#/components/schemas/" + name} }
	answer := func(method, path string) any {
		op := doc.Paths[path][method]
		require.NotNil(t, op, "%s %s", method, path)
		content := op["responses"].(map[string]any)["200"].(map[string]any)["content"].(map[string]any)
		return content["application/json"].(map[string]any)["schema"]
	}
	cases := []struct {
		name   string
		schema any
		v      any
	}{
		{"Task", component("Task"), api.Task{}},
		{"TaskPage", component("TaskPage"), api.Page{}},
		{"TaskError", component("TaskError"), api.TaskError{}},
		{"Wait", component("Wait"), api.Wait{}},
		{"Submission", component("Submission"), api.Submission{}},
		{"SignalResponse", component("SignalResponse"), web.SignalResponse{}},
		{"SubmitAnswer", component("SubmitAnswer"), web.SubmitAnswer{Submission: &api.Submission{}}},
		{"SubmitAnswer with an error", component("SubmitAnswer"), web.SubmitAnswer{Error: &web.Error{}}},
		{"Event", component("Event"), api.Event{}},
		{"Workflow", component("Workflow"), api.Workflow{}},
		{"WorkflowSummary", component("WorkflowSummary"), api.WorkflowSummary{}},
		{"WorkflowPage", component("WorkflowPage"), api.WorkflowPage{}},
		{"WorkflowSubmission", component("WorkflowSubmission"), api.WorkflowSubmission{}},
		{"RateLimit", component("RateLimit"), api.RateLimit{}},
		{"RateLimitInfo", component("RateLimitInfo"), api.RateLimitInfo{}},
		{"ConcurrencyLimit", component("ConcurrencyLimit"), api.ConcurrencyLimit{}},
		{"ConcurrencyInfo", component("ConcurrencyInfo"), api.ConcurrencyInfo{}},
		{"QueueStats", component("QueueStats"), web.QueueStats{}},
		{"Stats", component("Stats"), web.StatsResponse{}},
		{"History", component("History"), web.HistoryResponse{}},
		{"GET /limits", answer("get", "/limits"), web.LimitsResponse{}},
		{"GET /nodes", answer("get", "/nodes"), web.NodesResponse{}},
		{"GET /schedules", answer("get", "/schedules"), web.SchedulesResponse{}},
		{"GET /changes", answer("get", "/changes"), web.ChangesResponse{}},
		{"the body of POST /workflows", component("WorkflowBody"), web.WorkflowBody{}},
		{"the body of POST /tasks", component("SubmitBody"), web.SubmitBody{}},
		{"the body of POST /tasks/{id}/rewind", component("RewindBody"), web.RewindBody{}},
		{"the body of POST /tasks/{id}/fork", component("ForkBody"), web.ForkBody{}},
	}
	var problems []string
	for _, c := range cases {
		v := reflect.New(reflect.TypeOf(c.v)).Elem()
		v.Set(reflect.ValueOf(c.v))
		fill(v, 0)
		raw, err := json.Marshal(inputOnly(v.Interface()))
		require.NoError(t, err, c.name)
		var sent any
		require.NoError(t, json.Unmarshal(raw, &sent))
		doc.walk(c.schema, sent, c.name, &problems)
	}
	slices.Sort(problems)
	require.Empty(t, problems)
}

// fill sets every field of v that is zero to a value that is not: the
// JSON of the result has every field its type may send. A Wait gets a
// reason of a behavior (so that it names one), free-form JSON an empty
// object, maps of free-form values no entry.
func fill(v reflect.Value, depth int) {
	if depth > 8 {
		return
	}
	switch v.Interface().(type) {
	case time.Time:
		if v.Interface().(time.Time).IsZero() {
			v.Set(reflect.ValueOf(time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)))
		}
		return
	case json.RawMessage:
		v.Set(reflect.ValueOf(json.RawMessage(`{}`)))
		return
	case api.Wait:
		v.FieldByName("Reason").SetString(api.WaitPaused)
	}
	switch v.Kind() {
	case reflect.String:
		if v.String() == "" {
			v.SetString("x")
		}
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if v.Int() == 0 {
			v.SetInt(int64(time.Second))
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1.5)
	case reflect.Pointer:
		if v.IsNil() && v.Type() == reflect.TypeFor[*web.WorkflowBody]() && depth > 2 {
			return // a sub-workflow's sub-workflow: the type recurs
		}
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		fill(v.Elem(), depth+1)
	case reflect.Slice:
		if v.Len() == 0 {
			v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		}
		for i := range v.Len() {
			fill(v.Index(i), depth+1)
		}
	case reflect.Map:
		if v.IsNil() {
			v.Set(reflect.MakeMap(v.Type()))
		}
		if v.Type().Elem().Kind() == reflect.Interface {
			return
		}
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, depth+1)
		fill(e, depth+1)
		v.SetMapIndex(k, e)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), depth+1)
			}
		}
	}
}

// walk checks value, as the server sends it, against schema: its JSON type
// is the schema's, and every key of an object is a property of the schema
// (or matches its additionalProperties). An object under a schema that
// describes no property is free-form, and must be empty here (see fill).
func (d openAPIDoc) walk(schema, value any, at string, problems *[]string) {
	s, _ := schema.(map[string]any)
	if ref, ok := s["$ref"].(string); ok {
		d.walk(d.Components.Schemas[strings.TrimPrefix(ref, "#/components/schemas/")], value, at, problems)
		return
	}
	if subs, ok := s["allOf"].([]any); ok {
		merged := map[string]any{"type": "object", "properties": map[string]any{}}
		for _, sub := range subs {
			ss := d.resolve(sub)
			if _, ok := ss["allOf"]; ok {
				*problems = append(*problems, at+": nested allOf")
				return
			}
			for k, p := range mapOf(ss["properties"]) {
				merged["properties"].(map[string]any)[k] = p
			}
			if len(subs) == 1 {
				merged = ss
			}
		}
		d.walk(merged, value, at, problems)
		return
	}
	if alts, ok := s["oneOf"].([]any); ok {
		for _, alt := range alts {
			var p []string
			d.walk(alt, value, at, &p)
			if len(p) == 0 {
				return
			}
		}
		*problems = append(*problems, fmt.Sprintf("%s: %v matches none of oneOf", at, value))
		return
	}
	if !typeAllows(s["type"], value) {
		*problems = append(*problems, fmt.Sprintf("%s: %T %v where the schema says %v", at, value, value, s["type"]))
		return
	}
	switch v := value.(type) {
	case []any:
		for i, e := range v {
			d.walk(s["items"], e, fmt.Sprintf("%s[%d]", at, i), problems)
		}
	case map[string]any:
		props := mapOf(s["properties"])
		extra, hasExtra := s["additionalProperties"]
		if props == nil && !hasExtra {
			if len(v) > 0 && len(s) > 0 {
				*problems = append(*problems, fmt.Sprintf("%s: an object whose schema describes no property", at))
			}
			return
		}
		for k, e := range v {
			if p, ok := props[k]; ok {
				d.walk(p, e, at+"."+k, problems)
			} else if hasExtra {
				d.walk(extra, e, at+"."+k, problems)
			} else {
				*problems = append(*problems, fmt.Sprintf("%s.%s: sent, not in the schema", at, k))
			}
		}
	}
}

// resolve follows a schema's $ref.
func (d openAPIDoc) resolve(schema any) map[string]any {
	s := mapOf(schema)
	if ref, ok := s["$ref"].(string); ok {
		return d.resolve(d.Components.Schemas[strings.TrimPrefix(ref, "#/components/schemas/")])
	}
	return s
}

// mapOf returns v as a JSON object, nil if it is none.
func mapOf(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// typeAllows reports whether a schema's type (absent, a name or a list of
// names) allows value's JSON type.
func typeAllows(typ, value any) bool {
	var names []string
	switch t := typ.(type) {
	case nil:
		return true
	case string:
		names = []string{t}
	case []any:
		for _, n := range t {
			names = append(names, fmt.Sprint(n))
		}
	}
	var want []string
	switch v := value.(type) {
	case nil:
		want = []string{"null"}
	case bool:
		want = []string{"boolean"}
	case float64:
		want = []string{"number"}
		if v == float64(int64(v)) {
			want = append(want, "integer")
		}
	case string:
		want = []string{"string"}
	case []any:
		want = []string{"array"}
	case map[string]any:
		want = []string{"object"}
	}
	for _, w := range want {
		if slices.Contains(names, w) {
			return true
		}
	}
	return false
}
