package xdsserver

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"sailplane.dev/services/xds-server/internal/xds"
)

// Reasons in the overload metrics' reason label.
const (
	reasonLineFull    = "line_full"    // refused: no place, and the line was full
	reasonWaited      = "waited"       // refused: no place within --xds-admission-wait
	reasonRate        = "rate"         // refused: over --xds-admission-rate
	reasonSendTimeout = "send_timeout" // closed: the client stopped reading
	reasonRebalance   = "rebalance"    // closed: this replica held more than its share
)

// overloadMetrics are admission control's and rebalancing's metrics (docs/metrics.md).
type overloadMetrics struct {
	refused metric.Int64Counter // sailplane_xds_refused{reason}: ADS streams refused
	closed  metric.Int64Counter // sailplane_xds_closed_connections{reason}
	// reasons holds each reason's options, made once.
	reasons map[string]metric.AddOption
}

func newOverloadMetrics(mp metric.MeterProvider, a *admission) (*overloadMetrics, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(xds.MeterName)
	m := &overloadMetrics{reasons: map[string]metric.AddOption{}}
	for _, r := range []string{reasonLineFull, reasonWaited, reasonRate, reasonSendTimeout, reasonRebalance} {
		m.reasons[r] = metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", r)))
	}
	var errs []error
	var err error
	m.refused, err = meter.Int64Counter("sailplane_xds_refused",
		metric.WithDescription("ADS streams refused with Unavailable and a retry delay by admission control, by reason."))
	errs = append(errs, err)
	m.closed, err = meter.Int64Counter("sailplane_xds_closed_connections",
		metric.WithDescription("Client connections closed by the server: a client not reading (send_timeout) or rebalancing across replicas."))
	errs = append(errs, err)
	_, err = meter.Int64ObservableGauge("sailplane_xds_initializing",
		metric.WithDescription("ADS streams in their initial push."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			a.mu.Lock()
			defer a.mu.Unlock()
			o.Observe(int64(a.initializing))
			return nil
		}))
	errs = append(errs, err)
	_, err = meter.Int64ObservableGauge("sailplane_xds_admission_waiting",
		metric.WithDescription("ADS streams waiting for a place in their initial push."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			a.mu.Lock()
			defer a.mu.Unlock()
			o.Observe(int64(len(a.waiting)))
			return nil
		}))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *overloadMetrics) refuse(reason string) {
	m.refused.Add(context.Background(), 1, m.reasons[reason])
}
func (m *overloadMetrics) close(reason string) {
	m.closed.Add(context.Background(), 1, m.reasons[reason])
}
