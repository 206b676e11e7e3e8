package web

import (
	"errors"
	"net/http/httptest"
	"testing"
	"unicode/utf8"

	"github.com/stinthq/stint/api"
	"github.com/stinthq/stint/spi"
)

// FuzzTaskFilterQuery feeds arbitrary query strings to the task list's
// query parsing: it refuses with a 400 naming a field, or yields a filter
// whose every field the engine accepts.
func FuzzTaskFilterQuery(f *testing.F) {
	for _, seed := range []string{
		"behavior=demo.echo&status=success&limit=10", "group=x%27%20OR%20%271%27%3D%271", "limit=0", "limit=99999999999999999999",
		"after=abc&after=def", "parent=a%00b", "bogus=1", "%zz", "status=removed", "group=%0a", "id=" + string(make([]byte, 200)),
	} {
		f.Add(seed)
	}
	allowed := []string{"id", "behavior", "status", "parent", "group", "after", "limit"}
	f.Fuzz(func(t *testing.T, raw string) {
		r := httptest.NewRequest("GET", "/api/v1/tasks", nil)
		r.URL.RawQuery = raw
		q, err := Query(r, allowed...)
		if err == nil {
			var filter api.Filter
			if filter, err = filterFromQuery(q); err == nil {
				for _, id := range []api.TaskID{filter.ID, filter.ParentID, filter.After} {
					if id != "" && spi.CheckTaskID("id", id) != nil {
						t.Fatalf("query %q: accepted id %q", raw, id)
					}
				}
				if filter.Behavior != "" && spi.CheckBehaviorID(filter.Behavior) != nil {
					t.Fatalf("query %q: accepted behavior %q", raw, filter.Behavior)
				}
				if filter.Limit < 0 || filter.Limit > 1000 || !utf8.ValidString(filter.GroupKey) {
					t.Fatalf("query %q: accepted filter %+v", raw, filter)
				}
				return
			}
		}
		var e *Error
		var ie *api.InvalidError
		if !errors.As(err, &e) && !errors.As(err, &ie) {
			t.Fatalf("query %q: error %v (%T) is neither an API error nor an InvalidError", raw, err, err)
		}
	})
}
