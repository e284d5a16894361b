package upstream

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"sailplane.dev/shared/bus"
)

// PathAnnotation lists, comma-separated, the instance IDs of the config-ingests a resource
// passed through, its origin first. An annotation because istiod's MCP carries metadata
// annotations both ways (it reads them from an upstream and serves them on), so a cycle through
// istiod is detected too.
const PathAnnotation = "config.sailplane.dev/path"

// IDFile is the file, under Config.StateDir, keeping the instance ID across restarts.
const IDFile = "config-ingest-id"

// ErrCycle marks a resource an upstream sent that had passed through this config-ingest:
// sources read each other. It is not served from that upstream, so that deleting it at its
// origin deletes it everywhere.
var ErrCycle = errors.New("it passed through this config-ingest already: config sources form a cycle")

// CycleError is a resource of Source dropped as a cycle.
type CycleError struct {
	Kind, Name string
	Source     string
}

func (e *CycleError) Error() string {
	return fmt.Sprintf("%s %s from %s is not served: %v (remove the cycle from configSources)", e.Kind, e.Name, e.Source, ErrCycle)
}

func (e *CycleError) Unwrap() error { return ErrCycle }

// onPath reports whether r passed through id.
func onPath(r *bus.Resource, id string) bool {
	return slices.Contains(strings.Split(r.Annotations[PathAnnotation], ","), id)
}

// stamp returns r with id appended to its path (a copy: r may be shared).
func stamp(r *bus.Resource, id string) *bus.Resource {
	cp := *r
	cp.Annotations = maps.Clone(r.Annotations)
	if cp.Annotations == nil {
		cp.Annotations = map[string]string{}
	}
	if p := cp.Annotations[PathAnnotation]; p != "" {
		cp.Annotations[PathAnnotation] = p + "," + id
	} else {
		cp.Annotations[PathAnnotation] = id
	}
	return &cp
}

// instanceID is a random ID, kept in dir (when set) so that it outlives restarts.
func instanceID(dir string) string {
	path := filepath.Join(dir, IDFile)
	if dir != "" {
		if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			return strings.TrimSpace(string(b))
		}
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	if fi, err := os.Stat(dir); dir != "" && err == nil && fi.IsDir() {
		// Only into a state folder already there (a check-only run writes nothing); unsaved,
		// the next run picks a new ID, still unique.
		_ = os.WriteFile(path, []byte(id+"\n"), 0o644)
	}
	return id
}

// stampPublisher stamps the local sources' resources with the instance ID.
type stampPublisher struct {
	bus.Publisher
	id string
}

func (p stampPublisher) stampAll(rs []*bus.Resource) []*bus.Resource {
	out := make([]*bus.Resource, len(rs))
	for i, r := range rs {
		out[i] = stamp(r, p.id)
	}
	return out
}

func (p stampPublisher) Upsert(typ string, rs ...*bus.Resource) error {
	return p.Publisher.Upsert(typ, p.stampAll(rs)...)
}

func (p stampPublisher) Replace(typ string, rs []*bus.Resource) error {
	return p.Publisher.Replace(typ, p.stampAll(rs))
}
