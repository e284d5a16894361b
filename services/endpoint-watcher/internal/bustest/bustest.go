// Package bustest holds test helpers for endpoint-watcher: a recording bus.Publisher and a
// decoder of Kubernetes-style YAML documents into bus resources. It depends only on the bus
// interfaces so that tests do not wait on the bus implementation.
package bustest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// Call is one recorded Publisher call.
type Call struct {
	Op      string // "Upsert", "Delete" or "Replace"
	TypeURL string
	Names   []string // names upserted, deleted or replaced, in call order
}

// Recorder is a bus.Publisher that records every call and the resulting state.
type Recorder struct {
	mu      sync.Mutex
	calls   []Call
	state   map[string]map[string]*bus.Resource
	changed chan struct{}
}

var _ bus.Publisher = (*Recorder)(nil)

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder {
	return &Recorder{state: map[string]map[string]*bus.Resource{}, changed: make(chan struct{})}
}

func (r *Recorder) record(c Call) {
	r.calls = append(r.calls, c)
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *Recorder) typeState(typeURL string) map[string]*bus.Resource {
	if r.state[typeURL] == nil {
		r.state[typeURL] = map[string]*bus.Resource{}
	}
	return r.state[typeURL]
}

// Upsert implements bus.Publisher.
func (r *Recorder) Upsert(typeURL string, resources ...*bus.Resource) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := Call{Op: "Upsert", TypeURL: typeURL}
	for _, res := range resources {
		r.typeState(typeURL)[res.Name] = res
		c.Names = append(c.Names, res.Name)
	}
	r.record(c)
	return nil
}

// Delete implements bus.Publisher.
func (r *Recorder) Delete(typeURL string, names ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range names {
		delete(r.typeState(typeURL), n)
	}
	r.record(Call{Op: "Delete", TypeURL: typeURL, Names: slices.Clone(names)})
}

// Replace implements bus.Publisher.
func (r *Recorder) Replace(typeURL string, resources []*bus.Resource) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := map[string]*bus.Resource{}
	c := Call{Op: "Replace", TypeURL: typeURL}
	for _, res := range resources {
		st[res.Name] = res
		c.Names = append(c.Names, res.Name)
	}
	r.state[typeURL] = st
	r.record(c)
	return nil
}

// Calls returns the calls so far.
func (r *Recorder) Calls() []Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// Reset forgets the recorded calls, keeping the state.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = nil
}

// State returns the current resources of one type, by name.
func (r *Recorder) State(typeURL string) map[string]*bus.Resource {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.state[typeURL])
}

// WaitFor waits until cond holds for the recorded calls, failing t after timeout.
func (r *Recorder) WaitFor(t testing.TB, timeout time.Duration, cond func(calls []Call) bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ok := cond(r.calls)
		ch := r.changed
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("condition not met after %v; calls: %+v", timeout, r.Calls())
		}
	}
}

var docSeparator = regexp.MustCompile(`(?m)^---\s*$`)

// LoadYAML decodes a file of Kubernetes-style YAML documents (apiVersion, kind, metadata, spec)
// into bus resources grouped by type URL, in file order.
func LoadYAML(path string) (map[string][]*bus.Resource, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out, err := ParseYAML(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// ParseYAML is LoadYAML on data.
func ParseYAML(data []byte) (map[string][]*bus.Resource, error) {
	out := map[string][]*bus.Resource{}
	for i, doc := range docSeparator.Split(string(data), -1) {
		if len(bytes.TrimSpace([]byte(doc))) == 0 {
			continue
		}
		kind, res, err := decodeDoc([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		out[kind.TypeURL] = append(out[kind.TypeURL], res)
	}
	return out, nil
}

func decodeDoc(doc []byte) (schema.Kind, *bus.Resource, error) {
	var obj struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name              string            `json:"name"`
			Namespace         string            `json:"namespace"`
			Labels            map[string]string `json:"labels"`
			Annotations       map[string]string `json:"annotations"`
			CreationTimestamp time.Time         `json:"creationTimestamp"`
		} `json:"metadata"`
		Spec json.RawMessage `json:"spec"`
	}
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return schema.Kind{}, nil, err
	}
	if err := json.Unmarshal(js, &obj); err != nil {
		return schema.Kind{}, nil, err
	}
	kind, ok := schema.ByAPIVersionKind(obj.APIVersion, obj.Kind)
	if !ok {
		return schema.Kind{}, nil, fmt.Errorf("unknown kind %s %s", obj.APIVersion, obj.Kind)
	}
	msg := kind.New()
	if len(obj.Spec) > 0 {
		if err := protojson.Unmarshal(obj.Spec, msg); err != nil {
			return schema.Kind{}, nil, fmt.Errorf("%s %s: spec: %w", obj.Kind, obj.Metadata.Name, err)
		}
	}
	return kind, &bus.Resource{
		Name:        schema.Name(obj.Metadata.Namespace, obj.Metadata.Name),
		Body:        msg,
		Labels:      obj.Metadata.Labels,
		Annotations: obj.Metadata.Annotations,
		CreateTime:  obj.Metadata.CreationTimestamp,
	}, nil
}

// RenderYAML renders resources of the given types as YAML, types in the given order and
// resources by name, so that golden files are stable.
func RenderYAML(state map[string]map[string]*bus.Resource, typeURLs ...string) ([]byte, error) {
	type item struct {
		Name string          `json:"name"`
		Body json.RawMessage `json:"body"`
	}
	type group struct {
		Type      string `json:"type"`
		Resources []item `json:"resources"`
	}
	var groups []group
	for _, typeURL := range typeURLs {
		g := group{Type: typeURL, Resources: []item{}}
		for _, name := range slices.Sorted(maps.Keys(state[typeURL])) {
			b, err := protojson.Marshal(state[typeURL][name].Body)
			if err != nil {
				return nil, err
			}
			g.Resources = append(g.Resources, item{Name: name, Body: b})
		}
		groups = append(groups, g)
	}
	js, err := json.Marshal(groups)
	if err != nil {
		return nil, err
	}
	return yaml.JSONToYAML(js)
}

// WaitForState waits until cond holds for the current state (by type URL, then name), failing
// t after timeout. cond runs with the Recorder locked: it must not call the Recorder.
func (r *Recorder) WaitForState(t testing.TB, timeout time.Duration, cond func(state map[string]map[string]*bus.Resource) bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ok := cond(r.state)
		ch := r.changed
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			r.mu.Lock()
			defer r.mu.Unlock()
			var dump strings.Builder
			for typeURL, rs := range r.state {
				for name, res := range rs {
					fmt.Fprintf(&dump, "%s %s: %v\n", typeURL, name, res.Body)
				}
			}
			t.Fatalf("state condition not met after %v; state:\n%s", timeout, dump.String())
		}
	}
}
