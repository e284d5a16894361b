package upstream

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// StateFile is the file, under Config.StateDir, holding what each upstream last sent, so that a
// restart serves it until the upstream's first full state.
const StateFile = "config-ingest-upstreams.json"

const stateVersion = 1

type savedState struct {
	Version int           `json:"version"`
	Sources []savedSource `json:"sources"` // by precedence
}

type savedSource struct {
	Address string                     `json:"address"`
	Types   map[string][]savedResource `json:"types"`
}

type savedResource struct {
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	CreateTime  time.Time         `json:"createTime,omitzero"`
	Spec        json.RawMessage   `json:"spec"`
}

func (m *Manager) statePath() string { return filepath.Join(m.cfg.StateDir, StateFile) }

// marshalState encodes every upstream layer, in precedence order.
func (m *Manager) marshalState() ([]byte, error) {
	m.merger.mu.Lock()
	order := append([]string(nil), m.merger.order[1:]...)
	m.merger.mu.Unlock()
	st := savedState{Version: stateVersion, Sources: []savedSource{}}
	for _, addr := range order {
		ss := savedSource{Address: addr, Types: map[string][]savedResource{}}
		for typ, rs := range m.merger.Snapshot(addr) {
			for _, r := range rs {
				spec, err := protojson.Marshal(r.Body)
				if err != nil {
					return nil, fmt.Errorf("%s %s of %s: %w", typ, r.Name, addr, err)
				}
				ss.Types[typ] = append(ss.Types[typ], savedResource{Name: r.Name, Labels: r.Labels, Annotations: r.Annotations, CreateTime: r.CreateTime, Spec: spec})
			}
		}
		st.Sources = append(st.Sources, ss)
	}
	return json.Marshal(st)
}

// restore puts the saved upstream layers in the merger, before the local sources publish:
// the first state config-ingest publishes then has them.
func (m *Manager) restore() {
	if m.cfg.StateDir == "" {
		return
	}
	data, err := os.ReadFile(m.statePath())
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	var st savedState
	if err == nil {
		err = json.Unmarshal(data, &st)
	}
	if err == nil && st.Version != stateVersion {
		err = fmt.Errorf("format %d, not %d", st.Version, stateVersion)
	}
	if err != nil {
		m.log.Warn("saved upstream config ignored: it is served again when each upstream answers", "file", m.statePath(), "error", err)
		return
	}
	var order []string
	layers := map[string]map[string][]*bus.Resource{}
	for _, ss := range st.Sources {
		types := map[string][]*bus.Resource{}
		for typ, rs := range ss.Types {
			kind, ok := schema.ByTypeURL(typ)
			if !ok {
				continue
			}
			for _, sr := range rs {
				body := kind.New()
				if err := protojson.Unmarshal(sr.Spec, body); err != nil {
					m.log.Warn("saved upstream resource ignored", "file", m.statePath(), "source", ss.Address, "kind", kind.Kind, "name", sr.Name, "error", err)
					continue
				}
				types[typ] = append(types[typ], &bus.Resource{Name: sr.Name, Body: body, Labels: sr.Labels, Annotations: sr.Annotations, CreateTime: sr.CreateTime})
			}
		}
		order = append(order, ss.Address)
		layers[ss.Address] = types
		m.restored[ss.Address] = true
	}
	m.merger.SetOrder(order)
	count := 0
	for _, addr := range order {
		p := m.merger.Publisher(addr)
		for typ, rs := range layers[addr] {
			count += len(rs)
			_ = p.Replace(typ, rs) // refusals (too large) are logged when the upstream resends
		}
	}
	m.log.Info("saved upstream config restored: served until each upstream's first full state", "file", m.statePath(), "sources", order, "resources", count)
}
