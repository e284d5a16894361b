package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"sigs.k8s.io/yaml"
)

// UnmarshalYAML decodes a YAML (or JSON) rendering of m into m, strictly: unknown fields and
// enum values are errors. root names the value in error paths ("spec"). Errors are *Error with
// Field set to the offending path; the other identity fields are left for the caller.
func UnmarshalYAML(data []byte, m proto.Message, root string) error {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return &Error{Field: root, Err: fmt.Errorf("%w: %v", ErrMalformed, err)}
	}
	return UnmarshalJSON(js, m, root)
}

// UnmarshalJSON is UnmarshalYAML for JSON input.
func UnmarshalJSON(js []byte, m proto.Message, root string) error {
	norm, err := NormalizeJSON(js, m, root)
	if err != nil {
		return err
	}
	if norm == nil {
		proto.Reset(m)
		return nil
	}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(norm, m); err != nil {
		msg := err.Error()
		// "proto: (line 1:23): ..." -> "...": the line refers to the JSON we made, not the file.
		msg = strings.TrimPrefix(msg, "proto:")
		msg = strings.TrimSpace(msg)
		if strings.HasPrefix(msg, "(line ") {
			if i := strings.Index(msg, "): "); i >= 0 {
				msg = msg[i+3:]
			}
		}
		return &Error{Field: root, Err: fmt.Errorf("%w: %s", ErrSchema, msg)}
	}
	return nil
}

// NormalizeJSON checks js against m's schema strictly (unknown fields and enum values are
// *Error naming the field path under root) and returns it in protojson's canonical spelling:
// field names in lowerCamelCase, durations written the Go way ("30ms", "1h") turned into
// seconds ("0.030s"). It returns nil for a JSON null. m is not modified.
func NormalizeJSON(js []byte, m proto.Message, root string) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, &Error{Field: root, Err: fmt.Errorf("%w: %v", ErrMalformed, err)}
	}
	// Walk first: protojson's own errors point at JSON offsets, which mean nothing to someone
	// who wrote YAML; the walk names the field path instead.
	if path, err := checkMessage(v, m.ProtoReflect().Descriptor(), root); err != nil {
		return nil, &Error{Field: path, Err: fmt.Errorf("%w: %v", ErrSchema, err)}
	}
	if v == nil {
		return nil, nil
	}
	out, err := json.Marshal(v)
	if err != nil {
		return nil, &Error{Field: root, Err: fmt.Errorf("%w: %v", ErrMalformed, err)}
	}
	return out, nil
}

// wellKnown messages have their own JSON forms (durations as "10s", wrappers as scalars, ...):
// protojson checks them.
func wellKnown(md protoreflect.MessageDescriptor) bool {
	return strings.HasPrefix(string(md.FullName()), "google.protobuf.")
}

// checkMessage walks the decoded JSON v of a message md and returns the path and cause of the
// first field that cannot be decoded. It renames fields to their JSON names and rewrites
// duration strings in place (see duration).
func checkMessage(v any, md protoreflect.MessageDescriptor, path string) (string, error) {
	if v == nil || wellKnown(md) {
		return "", nil
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return path, fmt.Errorf("expected an object, got %s", jsonType(v))
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fields := md.Fields()
	for _, k := range keys {
		fd := fields.ByJSONName(k)
		if fd == nil {
			fd = fields.ByTextName(k)
		}
		p := joinPath(path, k)
		if fd == nil {
			return p, fmt.Errorf("unknown field %q", k)
		}
		if p, err := checkField(obj[k], fd, p); err != nil {
			return p, err
		}
		if jn := fd.JSONName(); jn != k {
			if _, dup := obj[jn]; dup {
				return p, fmt.Errorf("set twice, as %q and %q", k, jn)
			}
			obj[jn] = obj[k]
			delete(obj, k)
			k = jn
		}
		if isDuration(fd) && !fd.IsList() && !fd.IsMap() {
			d, err := duration(obj[k])
			if err != nil {
				return p, err
			}
			obj[k] = d
		}
	}
	return "", nil
}

func checkField(v any, fd protoreflect.FieldDescriptor, path string) (string, error) {
	if v == nil {
		return "", nil
	}
	switch {
	case fd.IsMap():
		obj, ok := v.(map[string]any)
		if !ok {
			return path, fmt.Errorf("expected a map, got %s", jsonType(v))
		}
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if p, err := checkSingular(obj[k], fd.MapValue(), path+"["+k+"]"); err != nil {
				return p, err
			}
		}
		return "", nil
	case fd.IsList():
		arr, ok := v.([]any)
		if !ok {
			return path, fmt.Errorf("expected a list, got %s", jsonType(v))
		}
		for i, e := range arr {
			if p, err := checkSingular(e, fd, path+"["+strconv.Itoa(i)+"]"); err != nil {
				return p, err
			}
		}
		return "", nil
	}
	return checkSingular(v, fd, path)
}

func checkSingular(v any, fd protoreflect.FieldDescriptor, path string) (string, error) {
	if v == nil {
		return "", nil
	}
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return checkMessage(v, fd.Message(), path)
	case protoreflect.EnumKind:
		ed := fd.Enum()
		if ed.FullName() == "google.protobuf.NullValue" {
			return "", nil
		}
		switch x := v.(type) {
		case string:
			if ed.Values().ByName(protoreflect.Name(x)) != nil {
				return "", nil
			}
			names := make([]string, 0, ed.Values().Len())
			for i := 0; i < ed.Values().Len(); i++ {
				names = append(names, string(ed.Values().Get(i).Name()))
			}
			return path, fmt.Errorf("unknown value %q (one of %s)", x, strings.Join(names, ", "))
		case json.Number:
			return "", nil
		}
		return path, fmt.Errorf("expected an enum name, got %s", jsonType(v))
	case protoreflect.StringKind, protoreflect.BytesKind:
		if _, ok := v.(string); !ok {
			return path, fmt.Errorf("expected a string, got %s (quote it)", jsonType(v))
		}
	case protoreflect.BoolKind:
		if _, ok := v.(bool); !ok {
			return path, fmt.Errorf("expected true or false, got %s", jsonType(v))
		}
	default: // numbers: protojson also accepts them quoted
		switch x := v.(type) {
		case json.Number:
		case string:
			if _, err := strconv.ParseFloat(x, 64); err != nil && x != "NaN" && x != "Infinity" && x != "-Infinity" {
				return path, fmt.Errorf("expected a number, got %q", x)
			}
		default:
			return path, fmt.Errorf("expected a number, got %s", jsonType(v))
		}
	}
	return "", nil
}

func isDuration(fd protoreflect.FieldDescriptor) bool {
	return fd.Kind() == protoreflect.MessageKind && fd.Message().FullName() == "google.protobuf.Duration"
}

// duration accepts what Istio users write, Go durations ("30ms", "1h30m", "10s"), and returns
// protojson's form ("0.030s").
func duration(v any) (any, error) {
	s, ok := v.(string)
	if !ok {
		if v == nil {
			return nil, nil
		}
		return nil, fmt.Errorf("expected a duration like \"10s\" or \"250ms\", got %s", jsonType(v))
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return nil, fmt.Errorf("invalid duration %q (want e.g. \"10s\", \"250ms\", \"1h\")", s)
	}
	sign := ""
	if d < 0 {
		sign, d = "-", -d
	}
	return fmt.Sprintf("%s%d.%09ds", sign, d/time.Second, d%time.Second), nil
}

func joinPath(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

func jsonType(v any) string {
	switch v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "a list"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}
