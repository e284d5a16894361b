package config

import (
	"errors"
	"strconv"
	"strings"
)

// Sentinel causes, for errors.Is on an *Error.
var (
	// ErrMalformed: the document is not valid YAML, or not a mapping.
	ErrMalformed = errors.New("malformed YAML")
	// ErrUnknownKind: apiVersion/kind is not an Istio config kind Sailplane reads from files.
	ErrUnknownKind = errors.New("unknown kind")
	// ErrSchema: the spec does not match the kind's schema (unknown field, wrong type).
	ErrSchema = errors.New("does not match schema")
)

// Error is a problem with one config document or one field of it. Every error returned by
// ParseYAML and Validate is an *Error (Validate may join several).
type Error struct {
	File string
	// Doc is the 1-based index of the document in File, counting non-empty documents only; 0
	// when unknown.
	Doc       int
	Kind      string
	Namespace string
	Name      string
	// Field is the path of the offending field in YAML (camelCase) spelling:
	// "spec.http[0].route[1].weight"; empty when the whole document is at fault.
	Field string
	Err   error
}

// Error renders "file: document N: Kind ns/name: field: cause", omitting unknown parts.
func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteString(": ")
	}
	if e.Doc > 0 {
		b.WriteString("document ")
		b.WriteString(strconv.Itoa(e.Doc))
		b.WriteString(": ")
	}
	if e.Kind != "" || e.Name != "" {
		if e.Kind != "" {
			b.WriteString(e.Kind)
		}
		if e.Name != "" {
			if e.Kind != "" {
				b.WriteString(" ")
			}
			if e.Namespace != "" {
				b.WriteString(e.Namespace)
				b.WriteString("/")
			}
			b.WriteString(e.Name)
		}
		b.WriteString(": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	if e.Err != nil {
		b.WriteString(e.Err.Error())
	} else {
		b.WriteString("invalid")
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Errors flattens err (an *Error, or errors joined with errors.Join, possibly nested) into its
// *Error parts. Parts that are not *Error are wrapped in one.
func Errors(err error) []*Error {
	if err == nil {
		return nil
	}
	var out []*Error
	var walk func(error)
	walk = func(err error) {
		if e, ok := err.(*Error); ok {
			out = append(out, e)
			return
		}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		out = append(out, &Error{Err: err})
	}
	walk(err)
	return out
}
