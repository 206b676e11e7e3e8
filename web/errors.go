package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/stinthq/stint/api"
)

// The codes of error responses.
const (
	// CodeInvalid is bad input (400), a request body over the limit (413)
	// or not JSON by its Content-Type (415). Field names the offending
	// input.
	CodeInvalid = "invalid"
	// CodeNotFound is an unknown task, behavior or path (404).
	CodeNotFound = "not_found"
	// CodeMethodNotAllowed is a known path with another method (405).
	CodeMethodNotAllowed = "method_not_allowed"
	// CodeConflict is an action the task's state does not allow, such as
	// holding a running task (409).
	CodeConflict = "conflict"
	// CodeUnauthorized is a missing or unknown token (401).
	CodeUnauthorized = "unauthorized"
	// CodeForbidden is a token whose role is too weak, or a cross-origin
	// browser request (403).
	CodeForbidden = "forbidden"
	// CodeUnavailable is a server at its limit of event streams, or a
	// database that cannot serve the request now: unreachable, in
	// recovery, refusing writes (503). Nothing was changed; try again.
	CodeUnavailable = "unavailable"
	// CodeInternal is a failure of the server or its database (500). The
	// message does not describe it; the server's log does.
	CodeInternal = "internal"
)

// Error is an error response: an HTTP status and what the body says.
// Handlers return it (or any error: see errorFor) and the API writes it as
// {"error": {"code": ..., "message": ..., "field": ...}}.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	// Field names the offending input of an invalid request.
	Field string `json:"field,omitempty"`
}

// Error returns the message.
func (e *Error) Error() string { return e.Message }

// errorBody is the JSON body of an error response.
type errorBody struct {
	Error *Error `json:"error"`
}

// errorFor maps an error returned by a handler to its response: stint's
// sentinel errors to 400, 404, 409 and 503, an *Error to itself, anything
// else to a 500 whose message tells nothing of the cause.
func errorFor(err error) *Error {
	var e *Error
	var inv *api.InvalidError
	switch {
	case errors.As(err, &e):
		return e
	case errors.As(err, &inv):
		return &Error{Status: http.StatusBadRequest, Code: CodeInvalid, Field: inv.Field, Message: inv.Error()}
	case errors.Is(err, api.ErrInvalid):
		return &Error{Status: http.StatusBadRequest, Code: CodeInvalid, Message: err.Error()}
	case errors.Is(err, api.ErrNotFound):
		return &Error{Status: http.StatusNotFound, Code: CodeNotFound, Message: "not found"}
	case errors.Is(err, api.ErrConflict):
		return &Error{Status: http.StatusConflict, Code: CodeConflict, Message: conflictMessage(err)}
	case errors.Is(err, api.ErrReadOnly):
		return &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable,
			Message: "the database accepts no writes now (a standby, or writes turned off); nothing was changed, try again"}
	case errors.Is(err, api.ErrUnavailable):
		return &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable,
			Message: "the database cannot serve the request now; nothing was changed, try again"}
	}
	return &Error{Status: http.StatusInternalServerError, Code: CodeInternal, Message: "internal error; see the server's log"}
}

// conflictMessage returns the message of a conflict error without the
// sentinel's text, e.g. "hold task x: it is running".
func conflictMessage(err error) string {
	msg := strings.TrimSuffix(err.Error(), ": "+api.ErrConflict.Error())
	if msg == "" || msg == err.Error() {
		return "the task's state does not allow this"
	}
	return msg
}

// notFound returns a 404 naming what was not found.
func notFound(format string, args ...any) *Error {
	return &Error{Status: http.StatusNotFound, Code: CodeNotFound, Message: fmt.Sprintf(format, args...)}
}

// invalid returns a 400 naming field.
func invalid(field, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Code: CodeInvalid, Field: field, Message: fmt.Sprintf("invalid %s: %s", field, fmt.Sprintf(format, args...))}
}

// WriteJSON writes v as the JSON body of a response with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	raw, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		raw, _ = json.Marshal(errorBody{&Error{Code: CodeInternal, Message: "encode the response: " + err.Error()}})
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(append(raw, '\n'))
}

// writeError writes e as an error response.
func writeError(w http.ResponseWriter, e *Error) {
	if e.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="stint"`)
	}
	WriteJSON(w, e.Status, errorBody{e})
}

// MaxBody caps the body of a request, a workflow submit's excepted: the
// largest params a behavior accepts by default (1 MiB) and room for the
// rest of a submit, 1088 KiB in all.
const MaxBody = 1<<20 + 64<<10

// MaxWorkflowBody caps the body of a workflow submit (POST
// /api/v1/workflows): 32 MiB, room for api.MaxWorkflowNodes nodes of about
// 300 bytes each.
const MaxWorkflowBody = 32 << 20

// decodeBody decodes the request's JSON body into v: one JSON value, no
// unknown fields, at most MaxBody bytes. Its errors name the field.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	raw, err := readBody(w, r, MaxBody)
	if err != nil {
		return err
	}
	return decodeJSON(raw, v)
}

// readBody reads the request's body whole: of no Content-Type or
// application/json, and at most limit bytes (a 413 that names the limit
// past that, with nothing read beyond it).
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(strings.ToLower(ct), "application/json") {
		return nil, &Error{Status: http.StatusUnsupportedMediaType, Code: CodeInvalid, Field: "Content-Type",
			Message: fmt.Sprintf("invalid Content-Type: %q is not application/json", ct)}
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooLarge *http.MaxBytesError
	switch {
	case err == nil:
		return raw, nil
	case errors.As(err, &tooLarge):
		return nil, &Error{Status: http.StatusRequestEntityTooLarge, Code: CodeInvalid, Field: "body",
			Message: fmt.Sprintf("invalid body: over the limit of %s (%d bytes) of %s %s", sizeText(tooLarge.Limit), tooLarge.Limit, r.Method, r.URL.Path)}
	case errors.Is(err, context.Canceled):
		return nil, err
	}
	return nil, invalid("body", "%v", err)
}

// sizeText writes n bytes in MiB or KiB when they divide it: "32 MiB",
// "1088 KiB", else "n bytes".
func sizeText(n int64) string {
	switch {
	case n > 0 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n > 0 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// decodeJSON decodes one JSON value, with no unknown fields, from raw into
// v. Its errors name the field.
func decodeJSON(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		// Read to the end, so that trailing garbage is found.
		var extra json.RawMessage
		if derr := dec.Decode(&extra); derr != io.EOF {
			err = errors.New("more than one JSON value")
		}
	}
	if err == nil {
		return nil
	}
	var syntax *json.SyntaxError
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.EOF):
		return invalid("body", "empty; want a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return invalid("body", "truncated JSON")
	case errors.As(err, &syntax):
		return invalid("body", "malformed JSON at byte %d: %v", syntax.Offset, err)
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			field = "body"
		}
		return invalid(field, "must be a JSON %s, not %s", jsonKind(typeErr.Type.Kind().String()), typeErr.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return invalid(field, "unknown field")
	}
	return invalid("body", "%v", err)
}

// jsonKind names a Go kind as the JSON type it decodes from.
func jsonKind(kind string) string {
	switch {
	case strings.HasPrefix(kind, "int"), strings.HasPrefix(kind, "uint"), strings.HasPrefix(kind, "float"):
		return "number"
	case kind == "string":
		return "string"
	case kind == "bool":
		return "boolean"
	case kind == "slice", kind == "array":
		return "array"
	}
	return "object"
}
