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
	// ErrTooLarge: the document is larger than MaxResourceBytes.
	ErrTooLarge = errors.New("resource too large")
)

// Error is a problem with one config document or one field of it. Every error returned by
// ParseYAML and Validate is an *Error (Validate may join several).
type Error struct {
	File string
	// Doc is the 1-based index of the document in File, counting non-empty documents only; 0
	// when unknown.
	Doc  int
	Kind string
	// Group is the kind's API group, when known: it tells the Gateway API's Gateway from
	// Istio's (both Kind "Gateway"). It is not rendered: the file and document say which.
	Group     string
	Namespace string
	Name      string
	// Field is the path of the offending field in YAML (camelCase) spelling:
	// "spec.http[0].route[1].weight"; empty when the whole document is at fault.
	Field string
	Err   error
}

// Error renders "file: document N: Kind ns/name: field: cause", omitting unknown parts.
func (e *Error) Error() string {
	cause := "invalid"
	if e.Err != nil {
		cause = e.Err.Error()
	}
	return render(e.File, e.Doc, e.Kind, e.Namespace, e.Name, e.Field, cause)
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

// Warning is something Istio accepts but reports: a setting without effect, a deprecated field, a
// name the Kubernetes API server would refuse. The resource is still served; config-ingest logs
// warnings and the webhook returns them as admission warnings. It is deliberately not an error.
type Warning struct {
	File string
	Doc  int
	Kind string
	// Group is the kind's API group, when known: it tells the Gateway API's Gateway from
	// Istio's (both Kind "Gateway"). It is not rendered: the file and document say which.
	Group     string
	Namespace string
	Name      string
	// Field is the path of the field in YAML spelling, like Error.Field; empty for the whole
	// document.
	Field   string
	Message string
}

// String renders the warning like Error.Error: "file: document N: Kind ns/name: field: message".
func (w *Warning) String() string {
	return render(w.File, w.Doc, w.Kind, w.Namespace, w.Name, w.Field, w.Message)
}

func render(file string, doc int, kind, namespace, name, field, msg string) string {
	var b strings.Builder
	if file != "" {
		b.WriteString(file)
		b.WriteString(": ")
	}
	if doc > 0 {
		b.WriteString("document ")
		b.WriteString(strconv.Itoa(doc))
		b.WriteString(": ")
	}
	if kind != "" || name != "" {
		b.WriteString(kind)
		if name != "" {
			if kind != "" {
				b.WriteString(" ")
			}
			if namespace != "" {
				b.WriteString(namespace)
				b.WriteString("/")
			}
			b.WriteString(name)
		}
		b.WriteString(": ")
	}
	if field != "" {
		b.WriteString(field)
		b.WriteString(": ")
	}
	b.WriteString(msg)
	return b.String()
}
