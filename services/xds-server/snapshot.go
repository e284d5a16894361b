package xdsserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/proto"

	"sailplane.dev/services/xds-server/internal/grpcgen"
)

// newSnapshot packs generated resources into one cache snapshot. Each type's version is a hash
// of its content: a rebuild that changes nothing for a type pushes nothing for it, and every
// replica of the xds-server names the same content the same way.
func newSnapshot(res *grpcgen.Resources, log *slog.Logger) (*cachev3.Snapshot, error) {
	snap := &cachev3.Snapshot{}
	add := func(t types.ResponseType, items []types.Resource) {
		v, items := contentVersion(items, log)
		snap.Resources[t] = cachev3.NewResources(v, items)
	}
	add(types.Listener, asResources(res.Listeners))
	add(types.Route, asResources(res.Routes))
	add(types.Cluster, asResources(res.Clusters))
	add(types.Endpoint, asResources(res.Endpoints))
	// The snapshot is shared by every node; computing the delta version map now keeps the
	// cache from filling it lazily from several goroutines at once.
	if err := snap.ConstructVersionMap(); err != nil {
		return nil, err
	}
	return snap, nil
}

func asResources[T types.Resource](in []T) []types.Resource {
	out := make([]types.Resource, len(in))
	for i, r := range in {
		out[i] = r
	}
	return out
}

// contentVersion hashes resources given in a stable order. A resource that cannot be marshalled
// (invalid UTF-8 from config that skipped serialization on an in-process bus) could never be
// sent; it is dropped alone rather than failing the whole snapshot.
func contentVersion(items []types.Resource, log *slog.Logger) (string, []types.Resource) {
	h := sha256.New()
	opts := proto.MarshalOptions{Deterministic: true}
	kept := items[:0:0]
	for _, r := range items {
		b, err := opts.Marshal(r)
		if err != nil {
			log.Warn("dropping unmarshallable resource", "name", cachev3.GetResourceName(r), "err", err)
			continue
		}
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
		kept = append(kept, r)
	}
	return hex.EncodeToString(h.Sum(nil)[:8]), kept
}

// cacheLogger adapts slog to go-control-plane's printf-style logger.
type cacheLogger struct{ l *slog.Logger }

func (c cacheLogger) logf(level slog.Level, format string, args []any) {
	if c.l.Enabled(context.Background(), level) {
		c.l.Log(context.Background(), level, fmt.Sprintf(format, args...))
	}
}

func (c cacheLogger) Debugf(format string, args ...any) { c.logf(slog.LevelDebug, format, args) }
func (c cacheLogger) Infof(format string, args ...any)  { c.logf(slog.LevelInfo, format, args) }
func (c cacheLogger) Warnf(format string, args ...any)  { c.logf(slog.LevelWarn, format, args) }
func (c cacheLogger) Errorf(format string, args ...any) { c.logf(slog.LevelError, format, args) }
