package tree

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"sailplane.dev/shared/config"
	"sailplane.dev/shared/schema"
)

// stateVersion is the format of MarshalState; RestoreState refuses others. Version 1 kept every
// file by its path as given, with no record of which config source it was read from: a state
// saved for one configuration was then served to another run from the same folder.
const stateVersion = 2

// ErrState: a saved state that cannot be restored.
var ErrState = errors.New("saved config state cannot be restored")

type savedState struct {
	Version int           `json:"version"`
	Sources []savedSource `json:"sources"`
}

// savedSource is what one config source (a root folder) held: its files by path relative to it.
type savedSource struct {
	Source string                     `json:"source"` // SourceAddress of the root
	Files  map[string]json.RawMessage `json:"files"`
}

type savedResource struct {
	Type        string            `json:"type"`
	Namespace   string            `json:"namespace,omitempty"`
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	CreateTime  time.Time         `json:"createTime,omitzero"`
	Doc         int               `json:"doc,omitempty"`
	Spec        json.RawMessage   `json:"spec"`
}

// SourceAddress is the address a root folder is saved under: "fs://" and its absolute path,
// as a mesh config's configSources names it, so that the same folder matches whichever
// working folder or relative path it is reached from.
func SourceAddress(root string) string {
	if abs, err := filepath.Abs(root); err == nil {
		root = abs
	}
	return "fs://" + filepath.ToSlash(filepath.Clean(root))
}

// under returns p relative to root when p lies under it.
func under(root, p string) (string, bool) {
	rel, err := filepath.Rel(root, p)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", false
	}
	return rel, true
}

// MarshalState returns, for RestoreState after a restart, the last valid resources of every
// file, grouped by the config source (root folder) they were read from. A file's part is
// encoded once and kept with it (a file's state never changes once read), so a change costs the
// encoding of what changed.
func (t *Tree) MarshalState() ([]byte, error) {
	// The roots of the last scan and those still kept while a new one cannot be read: every
	// file is under one of them (under two, for nested roots, it is saved with each).
	var roots []string
	for _, r := range append(slices.Clone(t.scanned), t.roots...) {
		if !slices.Contains(roots, r) {
			roots = append(roots, r)
		}
	}
	st := savedState{Version: stateVersion, Sources: []savedSource{}}
	for _, root := range roots {
		src := savedSource{Source: SourceAddress(root), Files: map[string]json.RawMessage{}}
		for p, f := range t.files {
			rel, ok := under(root, p)
			if !ok || len(f.order) == 0 {
				continue
			}
			if f.saved == nil {
				saved, err := f.marshalState()
				if err != nil {
					return nil, err
				}
				f.saved = saved
			}
			src.Files[filepath.ToSlash(rel)] = f.saved
		}
		if len(src.Files) > 0 {
			st.Sources = append(st.Sources, src)
		}
	}
	return json.Marshal(st)
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
			Labels: c.Labels, Annotations: c.Annotations, CreateTime: c.CreateTime, Doc: c.Source.Doc, Spec: spec,
		})
	}
	return json.Marshal(rs)
}

// RestoreState loads a state saved by MarshalState into a Tree before its first Scan of roots,
// the config folders now configured. Each saved file of a source still configured becomes that
// file's previous version: the first Scan keeps it where the file is now invalid, emptied or
// unreadable (its folder included), exactly as it would have without the restart, and publishes
// nothing of files that are gone. What other sources held is not restored: a configuration
// never serves another one's config. It returns the addresses of those sources.
func (t *Tree) RestoreState(data []byte, roots []string) (ignored []string, err error) {
	var probe struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrState, err)
	}
	if probe.Version == 1 {
		return nil, fmt.Errorf("%w: saved by an older Sailplane (format 1), which did not record the config source of each file", ErrState)
	}
	if probe.Version != stateVersion {
		return nil, fmt.Errorf("%w: version %d, want %d", ErrState, probe.Version, stateVersion)
	}
	var st savedState
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrState, err)
	}
	byAddress := map[string]string{} // source address -> root as configured
	for _, r := range roots {
		byAddress[SourceAddress(r)] = filepath.Clean(r)
	}
	files := map[string]*file{}
	var restored []string
	for _, src := range st.Sources {
		root, ok := byAddress[src.Source]
		if !ok {
			ignored = append(ignored, src.Source)
			continue
		}
		restored = append(restored, root)
		for rel, raw := range src.Files {
			p := filepath.Join(root, filepath.FromSlash(rel))
			if _, ok := under(root, p); !ok {
				return nil, fmt.Errorf("%w: %s: file %q is not under it", ErrState, src.Source, rel)
			}
			f, err := restoreFile(p, raw)
			if err != nil {
				return nil, err
			}
			files[p] = f
		}
	}
	t.files, t.roots = files, restored
	return ignored, nil
}

// restoreFile decodes one file's saved resources.
func restoreFile(p string, raw json.RawMessage) (*file, error) {
	var rs []savedResource
	if err := json.Unmarshal(raw, &rs); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrState, p, err)
	}
	f := &file{restored: true, valid: map[Key]config.Config{}}
	for _, r := range rs {
		k, ok := schema.ByTypeURL(r.Type)
		if !ok {
			return nil, fmt.Errorf("%w: %s: unknown type %q", ErrState, p, r.Type)
		}
		spec := k.New()
		if err := protojson.Unmarshal(r.Spec, spec); err != nil {
			return nil, fmt.Errorf("%w: %s: %s %s: %w", ErrState, p, k.Kind, r.Name, err)
		}
		c := config.Config{
			Kind: k, Namespace: r.Namespace, Name: r.Name, Labels: r.Labels, Annotations: r.Annotations,
			CreateTime: r.CreateTime, Spec: spec, Source: config.Source{File: p, Doc: r.Doc},
		}
		f.add(Key{k.TypeURL, c.BusName()}, c)
	}
	return f, nil
}
