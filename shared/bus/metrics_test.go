package bus_test

import (
	"testing"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/bus/bustest"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/telemetry/telemetrytest"
)

// TestMetrics: on every transport, the producer's sailplane_bus_resources and the consumer's
// sailplane_bus_consumer_resources follow what each holds, and a change (not the initial state)
// lands in sailplane_bus_lag_seconds once the consumer answered it, a rejected one too.
func TestMetrics(t *testing.T) {
	const consumer = "metrics-consumer"
	vs := schema.VirtualService.TypeURL
	transports := []struct {
		name   string
		source func(t *testing.T, s *bus.Store, m *telemetrytest.Metrics) bus.Source
	}{
		{"local", func(_ *testing.T, s *bus.Store, _ *telemetrytest.Metrics) bus.Source {
			return bus.Local(s, bus.WithLocalConsumer(consumer))
		}},
		{"delta", func(t *testing.T, s *bus.Store, m *telemetrytest.Metrics) bus.Source {
			return bus.Dial(startPeer(t, s).addr, bus.WithDialLogger(testLogger(t)), bus.WithNodeID(consumer),
				bus.WithConsumerMeterProvider(m.Provider()))
		}},
		{"sotw", func(t *testing.T, s *bus.Store, m *telemetrytest.Metrics) bus.Source {
			return bus.DialSotW(startPeer(t, s).addr, bus.WithDialLogger(testLogger(t)), bus.WithNodeID(consumer),
				bus.WithConsumerMeterProvider(m.Provider()))
		}},
	}
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			m := telemetrytest.New(t)
			s := bus.NewStore(bus.WithLogger(testLogger(t)), bus.WithMeterProvider(m.Provider()))
			s.Upsert(vs, bustest.VirtualService("ns/a", "1", "a"), bustest.VirtualService("ns/b", "1", "b"),
				bustest.VirtualService("ns/c", "1", "c"))
			h := bustest.NewRecorder()
			cancel := bustest.Subscribe(t, tr.source(t, s, m), []string{vs}, h)
			bustest.WaitConverged(t, s, h, vs)

			held := []string{"sailplane_bus_consumer_resources", "type", "VirtualService", "consumer", consumer}
			m.WaitValue(3, held[0], held[1:]...)
			if v := m.Value("sailplane_bus_resources", "type", "VirtualService"); v != 3 {
				t.Errorf("sailplane_bus_resources = %v, want 3", v)
			}
			if v := m.Value("sailplane_bus_lag_seconds", "type", "VirtualService"); v != 0 {
				t.Errorf("the initial state counted as %v lagging deliveries, want 0", v)
			}

			s.Upsert(vs, bustest.VirtualService("ns/a", "2", "a"))
			bustest.WaitConverged(t, s, h, vs)
			m.WaitValue(1, "sailplane_bus_lag_seconds", "type", "VirtualService")

			h.RejectVersion("ns/b", "2", "refused")
			s.Upsert(vs, bustest.VirtualService("ns/b", "2", "b"))
			m.WaitValue(2, "sailplane_bus_lag_seconds", "type", "VirtualService")
			if sum := m.Scrape().Sum("sailplane_bus_lag_seconds", "type", "VirtualService"); sum <= 0 || sum > bustest.Timeout.Seconds() {
				t.Errorf("lag sum %vs, want in (0, %v]", sum, bustest.Timeout)
			}

			s.Delete(vs, "ns/c")
			m.WaitValue(2, held[0], held[1:]...)
			if v := m.Value("sailplane_bus_resources", "type", "VirtualService"); v != 2 {
				t.Errorf("sailplane_bus_resources after a deletion = %v, want 2", v)
			}

			cancel()
			if v := m.Value(held[0], held[1:]...); v != 0 {
				t.Errorf("sailplane_bus_consumer_resources after the subscription ended = %v, want 0", v)
			}
		})
	}
}
