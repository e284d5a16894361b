package kubesource

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"k8s.io/apimachinery/pkg/types"

	"sailplane.dev/services/config-ingest/internal/statefile"
	"sailplane.dev/shared/config"
	"sailplane.dev/shared/schema"
)

// StateFile is the file, under Config.StateDir, holding the last valid version of every
// resource that is invalid in the API server: the API server only has the invalid one.
const StateFile = "config-ingest-kubernetes.json"

// stateVersion is the format of the state file; others are ignored.
const stateVersion = 1

type savedState struct {
	Version   int             `json:"version"`
	Resources []savedResource `json:"resources"`
}

type savedResource struct {
	Type        string            `json:"type"`
	Namespace   string            `json:"namespace,omitempty"`
	Name        string            `json:"name"`
	UID         types.UID         `json:"uid"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	CreateTime  time.Time         `json:"createTime,omitzero"`
	Spec        json.RawMessage   `json:"spec"`
}

// keptVersion is a last valid version restored from the state file, for the object with UID.
type keptVersion struct {
	uid types.UID
	c   config.Config
}

func (s *Source) statePath() string { return filepath.Join(s.cfg.StateDir, StateFile) }

// loadState reads the state file into s.restored (by type URL, then bus name), for the first
// sync to use.
func (s *Source) loadState() {
	if s.cfg.StateDir == "" {
		return
	}
	data, err := os.ReadFile(s.statePath())
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	restored := map[string]map[string]keptVersion{}
	if err == nil {
		restored, err = parseState(data)
	}
	if err != nil {
		s.log.Warn("saved Kubernetes config state ignored: the last valid version of resources that are now invalid is lost", "file", s.statePath(), "error", err)
		return
	}
	s.restored, s.saved = restored, data
}

func parseState(data []byte) (map[string]map[string]keptVersion, error) {
	var st savedState
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, err
	}
	if st.Version != stateVersion {
		return nil, fmt.Errorf("version %d, want %d", st.Version, stateVersion)
	}
	out := map[string]map[string]keptVersion{}
	for _, r := range st.Resources {
		k, ok := schema.ByTypeURL(r.Type)
		if !ok {
			return nil, fmt.Errorf("unknown type %q", r.Type)
		}
		spec := k.New()
		if err := protojson.Unmarshal(r.Spec, spec); err != nil {
			return nil, fmt.Errorf("%s %s/%s: %w", k.Kind, r.Namespace, r.Name, err)
		}
		c := config.Config{
			Kind: k, Namespace: r.Namespace, Name: r.Name, Labels: r.Labels, Annotations: r.Annotations,
			CreateTime: r.CreateTime, Spec: spec, Source: config.Source{File: SourcePrefix},
		}
		if out[k.TypeURL] == nil {
			out[k.TypeURL] = map[string]keptVersion{}
		}
		out[k.TypeURL][c.BusName()] = keptVersion{uid: r.UID, c: c}
	}
	return out, nil
}

// saveStateLocked hands the last valid version of every invalid resource to the writer when
// it changed. Only transitions between valid and invalid change it, so it is cheap and rare.
func (s *Source) saveStateLocked() {
	if s.writer == nil || !s.synced {
		return
	}
	st := savedState{Version: stateVersion, Resources: []savedResource{}}
	for _, ks := range s.kinds {
		for _, busName := range slices.Sorted(maps.Keys(ks.invalid)) {
			c, ok := ks.published[busName]
			if !ok {
				continue
			}
			spec, err := protojson.Marshal(c.Spec)
			if err != nil {
				s.log.Warn("cannot save Kubernetes config state", "kind", ks.kind.Kind, "name", busName, "error", err)
				return
			}
			st.Resources = append(st.Resources, savedResource{
				Type: ks.kind.TypeURL, Namespace: c.Namespace, Name: c.Name, UID: ks.uids[busName],
				Labels: c.Labels, Annotations: c.Annotations, CreateTime: c.CreateTime, Spec: spec,
			})
		}
	}
	data, err := json.MarshalIndent(st, "", " ")
	if err != nil || bytes.Equal(data, s.saved) {
		return
	}
	s.saved = data
	s.writer.Write(data)
}

// startWriter starts the state file's writer when there is a state folder; the returned
// function stops it once everything queued is written.
func (s *Source) startWriter() func() {
	if s.cfg.StateDir == "" {
		return func() {}
	}
	s.writer = statefile.NewWriter(s.log, s.statePath())
	return s.writer.Close
}
