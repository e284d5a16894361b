package tree

import (
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"

	"sailplane.dev/shared/config"
	"sailplane.dev/shared/schema"
)

// stateVersion is the format of MarshalState; RestoreState refuses others.
const stateVersion = 1

// ErrState: a saved state that cannot be restored.
var ErrState = errors.New("saved config state cannot be restored")

type savedState struct {
	Version int                        `json:"version"`
	Roots   []string                   `json:"roots,omitempty"`
	Files   map[string][]savedResource `json:"files"`
}

type savedResource struct {
	Type        string            `json:"type"`
	Namespace   string            `json:"namespace,omitempty"`
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Doc         int               `json:"doc,omitempty"`
	Spec        json.RawMessage   `json:"spec"`
}

// MarshalState returns, for RestoreState after a restart, the last valid resources of every
// file and the folders they were read from. A file's part is encoded once and kept with it
// (a file's state never changes once read), so a change costs the encoding of what changed.
func (t *Tree) MarshalState() ([]byte, error) {
	files := make(map[string]json.RawMessage, len(t.files))
	for p, f := range t.files {
		if len(f.order) == 0 {
			continue
		}
		if f.saved == nil {
			saved, err := f.marshalState()
			if err != nil {
				return nil, err
			}
			f.saved = saved
		}
		files[p] = f.saved
	}
	return json.Marshal(struct {
		Version int                        `json:"version"`
		Roots   []string                   `json:"roots,omitempty"`
		Files   map[string]json.RawMessage `json:"files"`
	}{stateVersion, t.roots, files})
}

// marshalState encodes the file's valid resources, in the form savedState reads back.
func (f *file) marshalState() (json.RawMessage, error) {
	rs := make([]savedResource, 0, len(f.order))
	for _, k := range f.order {
		c := f.valid[k]
		spec, err := protojson.Marshal(c.Spec)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", c.Kind.Kind, k.Name, err)
		}
		rs = append(rs, savedResource{
			Type: k.TypeURL, Namespace: c.Namespace, Name: c.Name,
			Labels: c.Labels, Annotations: c.Annotations, Doc: c.Source.Doc, Spec: spec,
		})
	}
	return json.Marshal(rs)
}

// RestoreState loads a state saved by MarshalState into a Tree before its first Scan. Each
// file's saved resources become its previous version: the first Scan keeps them where the file
// is now invalid, emptied or unreadable, exactly as it would have without the restart, and
// publishes nothing of files that are gone.
func (t *Tree) RestoreState(data []byte) error {
	var st savedState
	if err := json.Unmarshal(data, &st); err != nil {
		return fmt.Errorf("%w: %w", ErrState, err)
	}
	if st.Version != stateVersion {
		return fmt.Errorf("%w: version %d, want %d", ErrState, st.Version, stateVersion)
	}
	files := make(map[string]*file, len(st.Files))
	for p, rs := range st.Files {
		f := &file{restored: true, valid: map[Key]config.Config{}}
		for _, r := range rs {
			k, ok := schema.ByTypeURL(r.Type)
			if !ok {
				return fmt.Errorf("%w: %s: unknown type %q", ErrState, p, r.Type)
			}
			spec := k.New()
			if err := protojson.Unmarshal(r.Spec, spec); err != nil {
				return fmt.Errorf("%w: %s: %s %s: %w", ErrState, p, k.Kind, r.Name, err)
			}
			c := config.Config{
				Kind: k, Namespace: r.Namespace, Name: r.Name, Labels: r.Labels, Annotations: r.Annotations,
				Spec: spec, Source: config.Source{File: p, Doc: r.Doc},
			}
			f.add(Key{k.TypeURL, c.BusName()}, c)
		}
		files[p] = f
	}
	t.files, t.roots = files, st.Roots
	return nil
}
