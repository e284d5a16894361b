// Package schemafile reads the Gateway API CRDs into what package validation embeds
// (schemas.gen.json), and writes and reads that file.
package schemafile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// Group is the only group the file holds.
const Group = "gateway.networking.k8s.io"

// Version is the CRD version whose schema is kept: the one Sailplane stores and publishes.
const Version = "v1"

// File is the content of schemas.gen.json.
type File struct {
	// BundleVersion is the Gateway API release the CRDs come from ("v1.6.3").
	BundleVersion string `json:"bundleVersion"`
	Channel       string `json:"channel"`
	// Kinds by Kubernetes kind ("HTTPRoute").
	Kinds map[string]Kind `json:"kinds"`
}

// Kind is one CRD's v1 schema.
type Kind struct {
	Namespaced bool `json:"namespaced"`
	// Schema is the version's openAPIV3Schema (an apiextensions/v1 JSONSchemaProps), its
	// descriptions and its status removed.
	Schema json.RawMessage `json:"schema"`
}

type crd struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name        string            `json:"name"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		Group string `json:"group"`
		Names struct {
			Kind string `json:"kind"`
		} `json:"names"`
		Scope    string `json:"scope"`
		Versions []struct {
			Name   string `json:"name"`
			Served bool   `json:"served"`
			Schema struct {
				OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
			} `json:"schema"`
		} `json:"versions"`
	} `json:"spec"`
}

// Read reads every *.yaml of fsys's root, keeping the CRDs of Group that serve Version (other
// documents, such as a ValidatingAdmissionPolicy, are skipped).
func Read(fsys fs.FS) (*File, error) {
	names, err := fs.Glob(fsys, "*.yaml")
	if err != nil {
		return nil, err
	}
	f := &File{Kinds: map[string]Kind{}}
	for _, name := range names {
		data, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		for _, doc := range bytes.Split(data, []byte("\n---\n")) {
			var c crd
			if err := yaml.Unmarshal(doc, &c); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			if c.Kind != "CustomResourceDefinition" || c.Spec.Group != Group {
				continue
			}
			if err := f.add(c); err != nil {
				return nil, fmt.Errorf("%s: %s: %w", path.Base(name), c.Metadata.Name, err)
			}
		}
	}
	if len(f.Kinds) == 0 {
		return nil, fmt.Errorf("no %s CRD", Group)
	}
	return f, nil
}

func (f *File) add(c crd) error {
	bundle, channel := c.Metadata.Annotations[Group+"/bundle-version"], c.Metadata.Annotations[Group+"/channel"]
	if f.BundleVersion == "" {
		f.BundleVersion, f.Channel = bundle, channel
	} else if bundle != f.BundleVersion || channel != f.Channel {
		return fmt.Errorf("bundle %s %s, the others are %s %s", bundle, channel, f.BundleVersion, f.Channel)
	}
	for _, v := range c.Spec.Versions {
		if v.Name != Version || !v.Served {
			continue
		}
		stripDescriptions(v.Schema.OpenAPIV3Schema)
		// Status is the controller's, never read from a user's document.
		if props, ok := v.Schema.OpenAPIV3Schema["properties"].(map[string]any); ok {
			delete(props, "status")
		}
		js, err := json.Marshal(v.Schema.OpenAPIV3Schema)
		if err != nil {
			return err
		}
		f.Kinds[c.Spec.Names.Kind] = Kind{Namespaced: c.Spec.Scope == "Namespaced", Schema: js}
		return nil
	}
	return fmt.Errorf("no served %s version", Version)
}

// stripDescriptions removes every schema's description. A property named "description" is a
// schema (a map), never a string, so it stays.
func stripDescriptions(v any) {
	switch x := v.(type) {
	case map[string]any:
		if _, ok := x["description"].(string); ok {
			delete(x, "description")
		}
		for _, e := range x {
			stripDescriptions(e)
		}
	case []any:
		for _, e := range x {
			stripDescriptions(e)
		}
	}
}

// Encode renders f with one kind per line, so that a regenerated file's diff says which kinds
// changed.
func (f *File) Encode() ([]byte, error) {
	var b bytes.Buffer
	head, err := json.Marshal(struct {
		BundleVersion string `json:"bundleVersion"`
		Channel       string `json:"channel"`
	}{f.BundleVersion, f.Channel})
	if err != nil {
		return nil, err
	}
	b.Write(head[:len(head)-1])
	b.WriteString(`,"kinds":{` + "\n")
	kinds := make([]string, 0, len(f.Kinds))
	for k := range f.Kinds {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for i, k := range kinds {
		js, err := json.Marshal(map[string]Kind{k: f.Kinds[k]})
		if err != nil {
			return nil, err
		}
		b.Write(js[1 : len(js)-1])
		if i < len(kinds)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString("}}\n")
	return b.Bytes(), nil
}

// Decode reads what Encode wrote.
func Decode(data []byte) (*File, error) {
	var f File
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, err
	}
	if len(f.Kinds) == 0 || !strings.HasPrefix(f.BundleVersion, "v") {
		return nil, fmt.Errorf("no kinds or no bundle version")
	}
	return &f, nil
}
