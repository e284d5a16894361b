package configingest

import (
	"context"
	"errors"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"sailplane.dev/services/config-ingest/internal/upstream"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/config"
	"sailplane.dev/shared/telemetry"
)

// countProblems reports the current Problems as sailplane_config_problems{kind, reason}, read
// at each collection, until stop is called: the gauge is what an alert on broken config watches.
// A kind and reason seen once stay reported, 0 once their problems clear, so the series drops to
// 0 (resolving the alert, and graphed) rather than vanishing.
func (s *Service) countProblems() (stop func()) {
	gauge, err := s.meter.Int64ObservableGauge("sailplane_config_problems",
		metric.WithDescription("Current config problems (each served from its last good version, or not served), by resource kind and reason."))
	telemetry.Handle(err)
	type key struct{ kind, reason string }
	var mu sync.Mutex // readers may collect at once
	counts := map[key]int64{}
	reg, err := s.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		mu.Lock()
		defer mu.Unlock()
		for k := range counts {
			counts[k] = 0
		}
		for _, p := range s.Problems() {
			counts[key{problemKind(p), problemReason(p)}]++
		}
		for k, n := range counts {
			o.ObserveInt64(gauge, n, metric.WithAttributes(attribute.String("kind", k.kind), attribute.String("reason", k.reason)))
		}
		return nil
	}, gauge)
	telemetry.Handle(err)
	return func() {
		if reg != nil {
			telemetry.Handle(reg.Unregister())
		}
	}
}

// problemKind is the kind of the resource at fault ("VirtualService"), "" when the problem is
// not one resource's (an unreadable folder, the API server).
func problemKind(err error) string {
	var ce *config.Error
	if errors.As(err, &ce) {
		return ce.Kind
	}
	var conflict *upstream.ConflictError
	if errors.As(err, &conflict) {
		return conflict.Kind
	}
	var cycle *upstream.CycleError
	if errors.As(err, &cycle) {
		return cycle.Kind
	}
	return ""
}

// problemReason names what kind of problem err is, from the most specific cause.
func problemReason(err error) string {
	var tooLarge *bus.TooLargeError
	switch {
	case errors.As(err, &tooLarge), errors.Is(err, config.ErrTooLarge):
		return "too_large"
	case errors.Is(err, ErrDuplicate):
		return "duplicate"
	case errors.Is(err, ErrUnreadable):
		return "unreadable"
	case errors.Is(err, ErrEmpty):
		return "empty"
	case errors.Is(err, ErrSettling):
		return "settling"
	case errors.Is(err, ErrKubernetes):
		return "kubernetes"
	case errors.Is(err, ErrMeshConfigMap):
		return "mesh_configmap"
	case errors.Is(err, upstream.ErrConflict):
		return "conflict"
	case errors.Is(err, upstream.ErrCycle):
		return "cycle"
	case errors.Is(err, upstream.ErrTLS):
		return "upstream_tls"
	case errors.Is(err, upstream.ErrNotSynced):
		return "upstream_not_synced"
	case errors.Is(err, config.ErrMalformed):
		return "malformed"
	case errors.Is(err, config.ErrUnknownKind):
		return "unknown_kind"
	case errors.Is(err, config.ErrSchema):
		return "schema"
	}
	var ce *config.Error
	if errors.As(err, &ce) {
		return "invalid"
	}
	return "other"
}
