package webhook

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"

	meshv1alpha1 "istio.io/api/mesh/v1alpha1"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// meshHolder keeps the latest mesh config from the bus for the injector; Istio's defaults until
// one arrives (or without a bus).
type meshHolder struct {
	src      bus.Source
	log      *slog.Logger
	fallback *meshv1alpha1.MeshConfig
	latest   atomic.Pointer[meshv1alpha1.MeshConfig]
}

func (h *meshHolder) current() *meshv1alpha1.MeshConfig {
	if m := h.latest.Load(); m != nil {
		return m
	}
	return h.fallback
}

// Run follows the bus until ctx ends.
func (h *meshHolder) Run(ctx context.Context) error {
	return h.src.Subscribe(ctx, []string{schema.MeshConfig.TypeURL}, h)
}

func (h *meshHolder) Apply(ch bus.Change) error {
	for _, r := range ch.Updated {
		m, ok := r.Body.(*meshv1alpha1.MeshConfig)
		if !ok {
			return fmt.Errorf("MeshConfig %s: body is %T", r.Name, r.Body)
		}
		h.latest.Store(m)
	}
	if len(ch.Removed) > 0 && len(ch.Updated) == 0 {
		h.latest.Store(nil)
	}
	return nil
}

func (h *meshHolder) Synced() { h.log.Debug("mesh config received") }
