package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"sailplane.dev/shared/schema"
)

// ParseYAML reads every document of a multi-document YAML file. Each document is parsed on its
// own: one that fails is reported (as an *Error carrying file, 1-based document index and, when
// known, kind/namespace/name and field) and does not affect the others. Empty documents are
// skipped and not counted. Only the kinds of schema.ConfigKinds are accepted, in the API versions
// Istio and the Gateway API serve them (schema.Kind.Versions); duplicate keys, unknown top-level
// fields and documents over MaxResourceBytes are errors. The specs are decoded, not validated:
// call Validate (and, for the Gateway API kinds, gatewayapi/validation). A Gateway API spec is
// kept as the google.protobuf.Struct of its JSON, as the bus carries it.
func ParseYAML(file string, data []byte, defaultNamespace string) ([]Config, []error) {
	var cfgs []Config
	var errs []error
	for i, doc := range SplitDocuments(data) {
		c, err := parseDocument(doc, defaultNamespace)
		if err != nil {
			err.File, err.Doc = file, i+1
			errs = append(errs, err)
			continue
		}
		c.Source = Source{File: file, Doc: i + 1}
		cfgs = append(cfgs, c)
	}
	return cfgs, errs
}

// SplitDocuments splits a YAML stream on its "---" (and "...") marker lines and drops the
// documents that hold nothing but blank lines and comments.
func SplitDocuments(data []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	flush := func() {
		if !emptyDoc(cur.Bytes()) {
			docs = append(docs, bytes.Clone(cur.Bytes()))
		}
		cur.Reset()
	}
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i+1], data[i+1:]
		} else {
			data = nil
		}
		if marker, rest := docMarker(line); marker {
			flush()
			// "--- {a: 1}" or "--- |" starts the next document on the marker's own line.
			if r := bytes.TrimSpace(rest); len(r) > 0 && r[0] != '#' {
				cur.Write(rest)
				cur.WriteByte('\n')
			}
			continue
		}
		cur.Write(line)
	}
	flush()
	return docs
}

// docMarker reports whether line is a document marker at column 0: "---" or "..." alone or
// followed by blanks.
func docMarker(line []byte) (bool, []byte) {
	line = bytes.TrimRight(line, "\r\n")
	if !bytes.HasPrefix(line, []byte("---")) && !bytes.HasPrefix(line, []byte("...")) {
		return false, nil
	}
	if len(line) == 3 {
		return true, nil
	}
	if line[3] == ' ' || line[3] == '\t' {
		if line[0] == '.' {
			return true, nil
		}
		return true, line[4:]
	}
	return false, nil
}

func emptyDoc(doc []byte) bool {
	for _, l := range bytes.Split(doc, []byte("\n")) {
		l = bytes.TrimSpace(l)
		if len(l) > 0 && l[0] != '#' && !bytes.HasPrefix(l, []byte("%")) {
			return false
		}
	}
	return true
}

// MaxResourceBytes is the largest document ParseYAML accepts: the Kubernetes API server's limit
// for one object (etcd's 1.5 MiB request limit). A bigger resource could not exist in a cluster,
// and would not fit in one bus message either.
const MaxResourceBytes = 3 << 19

var lineRE = regexp.MustCompile(`line (\d+)`)

// topLevelFields are the keys a Kubernetes object may have; anything else (a misspelled "spec:")
// would otherwise be silently dropped.
var topLevelFields = map[string]bool{"apiVersion": true, "kind": true, "metadata": true, "spec": true, "status": true}

type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace"`
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec json.RawMessage `json:"spec"`
}

func parseDocument(doc []byte, defaultNamespace string) (Config, *Error) {
	if len(doc) > MaxResourceBytes {
		// Named, so that the resource's last good version is kept, but not parsed: that is what
		// the limit protects.
		apiVersion, kind, ns, name := identify(doc)
		if ns == "" && name != "" {
			ns = defaultNamespace
		}
		return Config{}, &Error{Kind: kind, Group: group(apiVersion), Namespace: ns, Name: name, Err: fmt.Errorf(
			"%w: the document is %d bytes, more than the %d bytes (1.5 MiB) a resource may have", ErrTooLarge, len(doc), MaxResourceBytes)}
	}
	h, err := parseHeader(doc)
	if err != nil {
		err.Group = group(h.APIVersion)
		if err.Name != "" && err.Namespace == "" {
			err.Namespace = defaultNamespace
		}
		return Config{}, err
	}
	ns := h.Metadata.Namespace
	if ns == "" {
		ns = defaultNamespace
	}
	e := &Error{Kind: h.Kind, Group: group(h.APIVersion), Namespace: ns, Name: h.Metadata.Name}
	if h.APIVersion == "" || h.Kind == "" {
		e.Err = fmt.Errorf("%w: apiVersion and kind are required", ErrUnknownKind)
		return Config{}, e
	}
	k, ok := schema.ByAPIVersionKind(h.APIVersion, h.Kind)
	if ok && k.TypeURL == schema.MeshConfig.TypeURL {
		e.Err = fmt.Errorf("%w: MeshConfig is read from the mesh file, not from config folders", ErrUnknownKind)
		return Config{}, e
	}
	if !ok || !isConfigKind(k) {
		e.Err = fmt.Errorf("%w %s %q", ErrUnknownKind, h.APIVersion, h.Kind)
		if k, ok := kindNamed(e.Group, h.Kind); ok {
			e.Err = fmt.Errorf("%w: %s has no %s (versions: %s)", ErrUnknownKind, k.Group, h.APIVersion, strings.Join(k.Versions(), ", "))
		}
		return Config{}, e
	}
	if k.ClusterScoped {
		// As the API server does: a cluster-scoped object has no namespace.
		ns, e.Namespace = "", ""
	}
	if h.Metadata.Name == "" {
		e.Field, e.Err = "metadata.name", errors.New("required")
		return Config{}, e
	}
	// Other names the API server would refuse are warnings (see Validate): Istio accepts them
	// from files. A "/" cannot be told apart from the namespace separator of bus names.
	if strings.Contains(ns, "/") {
		e.Field, e.Err = "metadata.namespace", fmt.Errorf("%q must not contain \"/\"", ns)
		return Config{}, e
	}
	spec := k.New()
	if len(h.Spec) > 0 {
		if err := UnmarshalJSON(h.Spec, spec, "spec"); err != nil {
			se := err.(*Error)
			e.Field, e.Err = se.Field, se.Err
			return Config{}, e
		}
	}
	return Config{
		Kind:        k,
		Namespace:   ns,
		Name:        h.Metadata.Name,
		Labels:      h.Metadata.Labels,
		Annotations: h.Metadata.Annotations,
		Spec:        spec,
	}, nil
}

// parseHeader reads a document's apiVersion, kind and metadata, strictly: duplicate keys and
// unknown top-level fields are errors. What it could read is returned even with an error.
func parseHeader(doc []byte) (header, *Error) {
	var h header
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), "error converting YAML to JSON: ")
		msg = strings.ReplaceAll(strings.TrimPrefix(msg, "yaml: unmarshal errors:\n"), "\n", ";")
		msg = lineRE.ReplaceAllString(strings.TrimSpace(msg), "line $1 of the document")
		e := &Error{Err: fmt.Errorf("%w: %s", ErrMalformed, msg)}
		// A duplicate key still leaves a readable document: name the resource, so that its
		// last good version is kept.
		if lax, err := yaml.YAMLToJSON(doc); err == nil && json.Unmarshal(lax, &h) == nil {
			e.Kind, e.Namespace, e.Name = h.Kind, h.Metadata.Namespace, h.Metadata.Name
		}
		return h, e
	}
	js = bytes.TrimSpace(js)
	if len(js) == 0 || js[0] != '{' {
		return h, &Error{Err: fmt.Errorf("%w: a document must be a mapping with apiVersion, kind, metadata and spec", ErrMalformed)}
	}
	if err := json.Unmarshal(js, &h); err != nil {
		var te *json.UnmarshalTypeError
		field := ""
		if errors.As(err, &te) {
			field = te.Field
		}
		return h, &Error{Kind: h.Kind, Field: field, Err: fmt.Errorf("%w: %v", ErrMalformed, err)}
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(js, &top); err != nil {
		return h, &Error{Kind: h.Kind, Err: fmt.Errorf("%w: %v", ErrMalformed, err)}
	}
	for _, k := range slices.Sorted(maps.Keys(top)) {
		if !topLevelFields[k] {
			return h, &Error{Kind: h.Kind, Namespace: h.Metadata.Namespace, Name: h.Metadata.Name, Field: k,
				Err: fmt.Errorf("%w: unknown field %q (a resource has apiVersion, kind, metadata, spec and status)", ErrSchema, k)}
		}
	}
	return h, nil
}

// identify reads apiVersion, kind, namespace and name from the top-level lines of a document and
// the direct children of its metadata, without parsing the rest (an oversized annotation, say).
func identify(doc []byte) (apiVersion, kind, namespace, name string) {
	var head bytes.Buffer
	inMetadata, childIndent := false, -1
	for line := range bytes.Lines(doc) {
		trimmed := bytes.TrimLeft(line, " ")
		indent := len(line) - len(trimmed)
		switch {
		case indent == 0:
			inMetadata = bytes.HasPrefix(line, []byte("metadata:"))
			if inMetadata || bytes.HasPrefix(line, []byte("kind:")) || bytes.HasPrefix(line, []byte("apiVersion:")) {
				head.Write(line)
			}
		case inMetadata && (childIndent < 0 || indent == childIndent):
			childIndent = indent
			if bytes.HasPrefix(trimmed, []byte("name:")) || bytes.HasPrefix(trimmed, []byte("namespace:")) {
				head.Write(line)
			}
		}
	}
	var h header
	if js, err := yaml.YAMLToJSON(head.Bytes()); err == nil {
		_ = json.Unmarshal(js, &h) // best effort: an unnamed error is still an error
	}
	return h.APIVersion, h.Kind, h.Metadata.Namespace, h.Metadata.Name
}

func kindNamed(group, kind string) (schema.Kind, bool) {
	for _, k := range schema.ConfigKinds {
		if k.Group == group && k.Kind == kind {
			return k, true
		}
	}
	return schema.Kind{}, false
}

func isConfigKind(k schema.Kind) bool {
	for _, ck := range schema.ConfigKinds {
		if ck.TypeURL == k.TypeURL {
			return true
		}
	}
	return false
}

// group is the API group of an apiVersion ("" for the core group's "v1").
func group(apiVersion string) string {
	g, _, ok := strings.Cut(apiVersion, "/")
	if !ok {
		return ""
	}
	return g
}
