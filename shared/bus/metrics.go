package bus

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/telemetry"
)

// meterScope is the bus's instrumentation scope.
const meterScope = "sailplane.dev/bus"

// storeMetrics are the producer side's instruments, recorded by a Store and every transport
// serving it.
type storeMetrics struct {
	// resources is sailplane_bus_resources{type}: what the Store holds.
	resources metric.Int64Gauge
	// lag is sailplane_bus_lag_seconds{type}: from a change's publication until a consumer
	// answered (applied or rejected) the delivery carrying it, on the producer's clock, so clocks
	// of other hosts never skew it. A burst coalesced into one delivery counts from its first
	// change: how stale the consumer was at worst.
	lag metric.Float64Histogram
}

func newStoreMetrics(provider metric.MeterProvider) storeMetrics {
	meter := telemetry.Meter(provider, meterScope)
	resources, err := meter.Int64Gauge("sailplane_bus_resources",
		metric.WithDescription("Resources a bus producer holds, by type."))
	telemetry.Handle(err)
	lag, err := meter.Float64Histogram("sailplane_bus_lag_seconds",
		metric.WithDescription("Time from a change's publication on the bus until a consumer acknowledged (applied or rejected) it, by type."),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30))
	telemetry.Handle(err)
	return storeMetrics{resources: resources, lag: lag}
}

// delivered records the lag of a delivery of typ's changes pending since since (zero: the
// delivery carried no change, as an initial state).
func (m storeMetrics) delivered(typ string, since time.Time) {
	if !since.IsZero() {
		m.lag.Record(context.Background(), time.Since(since).Seconds(), typeAttr(typ))
	}
}

// consumerResources is sailplane_bus_consumer_resources{type, consumer}: what the consumers of
// this process hold, to compare with their producer's sailplane_bus_resources.
type consumerResources struct {
	held metric.Int64UpDownCounter
}

func newConsumerResources(provider metric.MeterProvider) consumerResources {
	held, err := telemetry.Meter(provider, meterScope).Int64UpDownCounter("sailplane_bus_consumer_resources",
		metric.WithDescription("Resources a bus consumer holds, by type and consumer (node ID; in-process: the consumer's name)."))
	telemetry.Handle(err)
	return consumerResources{held: held}
}

// typeLabel is the type's kind name ("VirtualService") for known types, else its type URL.
func typeLabel(typeURL string) string {
	if k, ok := schema.ByTypeURL(typeURL); ok {
		return k.Kind
	}
	return typeURL
}

// typeAttrs holds typeAttr's options by type URL: building an attribute set on every change
// would cost about as much as the rest of a local delivery. Only published types are measured
// (a consumer's subscription to an unknown type records nothing), so it stays small.
var typeAttrs sync.Map

// typeAttr is the measurement option of the type label of typeURL.
func typeAttr(typeURL string) metric.MeasurementOption {
	if o, ok := typeAttrs.Load(typeURL); ok {
		return o.(metric.MeasurementOption)
	}
	o, _ := typeAttrs.LoadOrStore(typeURL, metric.WithAttributes(attribute.String("type", typeLabel(typeURL))))
	return o.(metric.MeasurementOption)
}
