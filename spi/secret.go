package spi

import (
	"reflect"
	"strings"
)

// Secret is a string param that only runs see. It encodes to JSON as the
// string it holds, so it is stored as submitted and a run decodes it whole;
// every reader of the task (the HTTP API and its admin actions, the
// dashboard, the CLI) sees "xxxxx" in its place, because the registry finds
// the fields of this type in a behavior's params type when it is
// registered. Printed with %v or %s it shows "xxxxx" too, so a log line or
// an error message that formats it by mistake shows no secret; string(s)
// is the value.
type Secret string

// String returns "xxxxx", not the secret.
func (Secret) String() string { return redacted }

// GoString returns "xxxxx", not the secret, for %#v.
func (Secret) GoString() string { return redacted }

// The struct tag of params fields that hold secrets, for string fields that
// cannot be a Secret:
//
//	Token string `json:"token" stint:"secret"` // readers see "xxxxx"
//	DSN   string `json:"dsn" stint:"dsn"`      // readers see the DSN without its password
//
// "dsn" marks a connection string, a URL or PostgreSQL's key=value form:
// readers see it with its passwords replaced (see RedactDSN), the rest
// shown. The tag applies to a string field, or to the strings of a slice,
// array or map field.
const secretTag = "stint"

// secretMode says how a param is redacted.
type secretMode uint8

const (
	notSecret secretMode = iota
	wholeSecret
	dsnSecret
)

// secretPlan lists where a params type holds secrets, by JSON names: the
// redaction of the value itself, of the fields of an object, or of the
// elements of an array or object used as a map.
type secretPlan struct {
	mode   secretMode
	fields map[string]*secretPlan
	elem   *secretPlan
}

var secretType = reflect.TypeFor[Secret]()

// planSecrets returns where values of t hold secrets, nil when nowhere.
func planSecrets(t reflect.Type) *secretPlan {
	return planType(t, notSecret, map[reflect.Type]bool{})
}

// planType is planSecrets with the mode a field's tag gives its strings;
// within lists the struct types being planned, so that a recursive type
// ends (its secrets are found down to its first repetition).
func planType(t reflect.Type, mode secretMode, within map[reflect.Type]bool) *secretPlan {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == secretType {
		return &secretPlan{mode: wholeSecret}
	}
	switch t.Kind() {
	case reflect.String:
		if mode != notSecret {
			return &secretPlan{mode: mode}
		}
	case reflect.Slice, reflect.Array, reflect.Map:
		if t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8 {
			return nil // []byte encodes as base64 text
		}
		if e := planType(t.Elem(), mode, within); e != nil {
			return &secretPlan{elem: e}
		}
	case reflect.Struct:
		if within[t] {
			return nil
		}
		within[t] = true
		defer delete(within, t)
		fields := map[string]*secretPlan{}
		planFields(t, within, fields)
		if len(fields) > 0 {
			return &secretPlan{fields: fields}
		}
	}
	return nil
}

// planFields adds to fields the plans of struct t's fields by their JSON
// names, those of embedded structs promoted as encoding/json does.
func planFields(t reflect.Type, within map[reflect.Type]bool, fields map[string]*secretPlan) {
	for f := range t.Fields() {
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if f.Anonymous && name == "" && ft.Kind() == reflect.Struct {
			if !within[ft] {
				within[ft] = true
				planFields(ft, within, fields)
				delete(within, ft)
			}
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		mode := notSecret
		switch f.Tag.Get(secretTag) {
		case "secret":
			mode = wholeSecret
		case "dsn":
			mode = dsnSecret
		}
		if p := planType(f.Type, mode, within); p != nil {
			fields[name] = p
		}
	}
}

// apply redacts v, a decoded JSON value, as the plan says, reporting
// whether it changed anything. Object keys match field names as
// encoding/json matches them, ignoring case, so params submitted with
// other capitals are redacted too.
func (p *secretPlan) apply(v any) (any, bool) {
	switch v := v.(type) {
	case string:
		switch p.mode {
		case wholeSecret:
			if v != "" && v != redacted {
				return redacted, true
			}
		case dsnSecret:
			if s := RedactDSN(v); s != v {
				return s, true
			}
		}
	case []any:
		changed := false
		if p.elem != nil {
			for i, e := range v {
				if ne, c := p.elem.apply(e); c {
					v[i], changed = ne, true
				}
			}
		}
		return v, changed
	case map[string]any:
		changed := false
		for k, e := range v {
			fp := p.elem
			if p.fields != nil {
				fp = p.field(k)
			}
			if fp == nil {
				continue
			}
			if ne, c := fp.apply(e); c {
				v[k], changed = ne, true
			}
		}
		return v, changed
	}
	return v, false
}

// field returns the plan of the field an object key decodes into.
func (p *secretPlan) field(key string) *secretPlan {
	if fp, ok := p.fields[key]; ok {
		return fp
	}
	for name, fp := range p.fields {
		if strings.EqualFold(name, key) {
			return fp
		}
	}
	return nil
}
