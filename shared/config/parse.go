package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"sigs.k8s.io/yaml"

	"sailplane.dev/shared/schema"
)

// ParseYAML reads every document of a multi-document YAML file. Each document is parsed on its
// own: one that fails is reported (as an *Error carrying file, 1-based document index and, when
// known, kind/namespace/name and field) and does not affect the others. Empty documents are
// skipped and not counted. Only the kinds of schema.IstioConfig are accepted; apiVersion may use
// v1, v1beta1 or v1alpha3. The specs are decoded, not validated: call Validate.
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
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return Config{}, &Error{Err: fmt.Errorf("%w: %v", ErrMalformed, strings.TrimPrefix(err.Error(), "error converting YAML to JSON: "))}
	}
	js = bytes.TrimSpace(js)
	if len(js) == 0 || js[0] != '{' {
		return Config{}, &Error{Err: fmt.Errorf("%w: a document must be a mapping with apiVersion, kind, metadata and spec", ErrMalformed)}
	}
	var h header
	if err := json.Unmarshal(js, &h); err != nil {
		var te *json.UnmarshalTypeError
		field := ""
		if errors.As(err, &te) {
			field = te.Field
		}
		return Config{}, &Error{Kind: h.Kind, Field: field, Err: fmt.Errorf("%w: %v", ErrMalformed, err)}
	}
	ns := h.Metadata.Namespace
	if ns == "" {
		ns = defaultNamespace
	}
	e := &Error{Kind: h.Kind, Namespace: ns, Name: h.Metadata.Name}
	if h.APIVersion == "" || h.Kind == "" {
		e.Err = fmt.Errorf("%w: apiVersion and kind are required", ErrUnknownKind)
		return Config{}, e
	}
	k, ok := schema.ByAPIVersionKind(h.APIVersion, h.Kind)
	if ok && k.TypeURL == schema.MeshConfig.TypeURL {
		e.Err = fmt.Errorf("%w: MeshConfig is read from the mesh file, not from config folders", ErrUnknownKind)
		return Config{}, e
	}
	if !ok || !isIstioConfig(k) {
		e.Err = fmt.Errorf("%w %s %q", ErrUnknownKind, h.APIVersion, h.Kind)
		return Config{}, e
	}
	if h.Metadata.Name == "" {
		e.Field, e.Err = "metadata.name", errors.New("required")
		return Config{}, e
	}
	if msg := dns1123Subdomain(h.Metadata.Name); msg != "" {
		e.Field, e.Err = "metadata.name", errors.New(msg)
		return Config{}, e
	}
	if msg := dns1123Label(ns); msg != "" {
		e.Field, e.Err = "metadata.namespace", errors.New(msg)
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

func isIstioConfig(k schema.Kind) bool {
	for _, ik := range schema.IstioConfig {
		if ik.TypeURL == k.TypeURL {
			return true
		}
	}
	return false
}
