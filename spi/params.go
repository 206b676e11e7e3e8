package spi

// The decoding and validation of params: strict JSON, the validator's
// struct tags, and messages that name the field.

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"

	"github.com/go-playground/validator/v10"

	"github.com/stinthq/stint/api"
)

var validate = func() *validator.Validate {
	v := validator.New(validator.WithRequiredStructEnabled())
	v.RegisterTagNameFunc(func(f reflect.StructField) string {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			return ""
		case "":
			return f.Name
		}
		return name
	})
	return v
}()

// decodeParams decodes raw strictly into p and validates it.
func decodeParams(raw json.RawMessage, p any) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		raw = json.RawMessage("{}")
	}
	if string(raw) == "{}" && decodesEmptyAsZero(p) {
		// The common case of no params needs no decoder.
		return validateParams(p)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(p); err != nil {
		return jsonError(err)
	}
	if dec.More() {
		return api.Invalid("params", "unexpected data after the JSON value")
	}
	if err := CheckJSONB("params", raw); err != nil {
		return err
	}
	if err := validateParams(p); err != nil {
		return err
	}
	return nil
}

// decodesEmptyAsZero reports whether decoding {} into p leaves it as it
// is: p points to a struct that does not decode itself.
func decodesEmptyAsZero(p any) bool {
	if _, ok := p.(json.Unmarshaler); ok {
		return false
	}
	t := reflect.TypeOf(p)
	return t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct
}

// emptyObject is the JSON of a struct without fields, shared by all the
// results that encode as it: nothing writes to a result.
var emptyObject = json.RawMessage("{}")

// encodesAsEmptyObject reports whether every value of t encodes as {}: t
// is a struct without fields that does not encode itself. Results of such
// types (no-op and side-effect-only behaviors) skip the encoder.
func encodesAsEmptyObject(t reflect.Type) bool {
	if t.Kind() != reflect.Struct || t.NumField() > 0 {
		return false
	}
	for _, m := range []reflect.Type{reflect.TypeFor[json.Marshaler](), reflect.TypeFor[encoding.TextMarshaler]()} {
		if t.Implements(m) {
			return false
		}
	}
	return true
}

// rulesByType caches hasRules: reflect.Type -> bool.
var rulesByType sync.Map

// hasRules reports whether struct type t has a validate tag on a field of
// its own or of a struct it holds (directly or by pointer), which is where
// the validator looks without a dive rule. Validating a struct without
// rules finds nothing, yet took an eighth of a no-op run's Go CPU.
func hasRules(t reflect.Type) bool {
	if has, ok := rulesByType.Load(t); ok {
		return has.(bool)
	}
	has := structHasRules(t, map[reflect.Type]bool{})
	rulesByType.Store(t, has)
	return has
}

func structHasRules(t reflect.Type, seen map[reflect.Type]bool) bool {
	if seen[t] {
		return false
	}
	seen[t] = true
	for f := range t.Fields() {
		if tag := f.Tag.Get("validate"); tag != "" && tag != "-" {
			return true
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct && structHasRules(ft, seen) {
			return true
		}
	}
	return false
}

// jsonError words a decoding error of params in JSON's terms, naming the
// field, without Go's type names.
func jsonError(err error) error {
	// A params type that checks itself in UnmarshalJSON knows best which
	// field is wrong.
	var ie *api.InvalidError
	if errors.As(err, &ie) {
		return ie
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		got := te.Value
		if strings.HasPrefix(got, "number ") {
			got = "the number " + strings.TrimPrefix(got, "number ")
		} else {
			got = withArticle(got)
		}
		if te.Field == "" {
			return api.Invalid("params", "must be %s, got %s", jsonKind(te.Type), got)
		}
		return api.Invalid("params."+te.Field, "must be %s, got %s", jsonKind(te.Type), got)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return api.Invalid("params", "not valid JSON at byte %d: %s", se.Offset, strings.TrimPrefix(se.Error(), "json: "))
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return api.Invalid("params", "not valid JSON: it ends too early")
	}
	if msg := err.Error(); strings.HasPrefix(msg, "json: unknown field ") {
		return &api.InvalidError{Field: "params." + strings.Trim(strings.TrimPrefix(msg, "json: unknown field "), `"`),
			Reason: "unknown field", Err: ErrUnknownField}
	}
	// What is left comes from the params type's own UnmarshalJSON: the JSON
	// was fine, its check was not.
	return api.Invalid("params", "%s", strings.TrimPrefix(err.Error(), "json: "))
}

// jsonKind names what JSON value Go type t decodes from, with its article.
func jsonKind(t reflect.Type) string {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return "a JSON value"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "a JSON object"
	}
	return "a JSON value of another type"
}

// withArticle returns a JSON kind ("array", "object") with its article.
func withArticle(kind string) string {
	switch kind {
	case "":
		return "another value"
	case "array", "object":
		return "an " + kind
	case "bool":
		return "true or false"
	case "null":
		return "null"
	}
	return "a " + kind
}

// ruleReason words a failed validation rule as what the value must be.
func ruleReason(fe validator.FieldError) string {
	param := fe.Param()
	var unit string
	switch fe.Kind() {
	case reflect.String:
		unit = " characters long"
	case reflect.Slice, reflect.Array, reflect.Map:
		unit = " items"
	}
	switch fe.Tag() {
	case "required", "required_if", "required_unless", "required_with", "required_without":
		return "is required"
	case "min", "gte":
		if unit == " characters long" {
			return "must be at least " + param + unit
		}
		if unit != "" {
			return "must have at least " + param + unit
		}
		return "must be at least " + param
	case "max", "lte":
		if unit == " characters long" {
			return "must be at most " + param + unit
		}
		if unit != "" {
			return "must have at most " + param + unit
		}
		return "must be at most " + param
	case "gt":
		return "must be greater than " + param
	case "lt":
		return "must be less than " + param
	case "len":
		if unit == " characters long" {
			return "must be exactly " + param + unit
		}
		if unit != "" {
			return "must have exactly " + param + unit
		}
		return "must be " + param
	case "oneof":
		return "must be one of: " + strings.Join(strings.Fields(param), ", ")
	case "url", "http_url", "uri":
		return "must be a URL"
	case "email":
		return "must be an email address"
	case "uuid", "uuid4":
		return "must be a UUID"
	case "hostname", "hostname_rfc1123":
		return "must be a host name"
	case "excluded_with", "excluded_unless", "excluded_if":
		return "must not be given here"
	case "required_without_all":
		return "is required unless one of the others is given"
	}
	if param != "" {
		return fmt.Sprintf("does not satisfy the rule %s=%s", fe.Tag(), param)
	}
	return "does not satisfy the rule " + fe.Tag()
}

func validateParams(p any) error {
	v := reflect.ValueOf(p)
	for v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct || !hasRules(v.Type()) {
		return nil
	}
	err := validate.Struct(v.Interface())
	var verrs validator.ValidationErrors
	if errors.As(err, &verrs) && len(verrs) > 0 {
		fe := verrs[0]
		// The namespace starts with the struct's type name; the field path
		// that follows uses the JSON names.
		_, path, _ := strings.Cut(fe.Namespace(), ".")
		return api.Invalid("params."+path, "%s", ruleReason(fe))
	}
	if err != nil {
		return api.Invalid("params", "%v", err)
	}
	return nil
}

// ErrUnknownField is the error of params that name a field the params
// type has no place for. It wraps api.ErrInvalid. Met at run time, by a
// node whose release is older than the submitter's, it gives the task
// back for a node that knows the field rather than failing it.
var ErrUnknownField = fmt.Errorf("unknown field: %w", api.ErrInvalid)
