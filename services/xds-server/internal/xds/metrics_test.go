package xds

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"sailplane.dev/services/xds-server/internal/model"
)

// meterReader is an SDK MeterProvider with a reader to collect from, for one test.
func meterReader(t testing.TB) (*sdkmetric.MeterProvider, *sdkmetric.ManualReader) {
	t.Helper()
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return mp, r
}

// benchObservers are the observers the server runs with in production: its metrics, recorded
// into an SDK provider (the global no-op one would cost nothing).
func benchObservers(t testing.TB) []Observer {
	mp, _ := meterReader(t)
	m, err := NewMetrics(mp)
	if err != nil {
		t.Fatal(err)
	}
	return []Observer{m}
}

// point is one series of a collected metric: its labels and its value (a sum's or gauge's) or
// its count (a histogram's).
type point struct {
	labels string
	value  float64
	count  uint64
	bounds []float64
}

func collect(t *testing.T, r *sdkmetric.ManualReader) map[string][]point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string][]point{}
	labels := func(s attribute.Set) string { return s.Encoded(attribute.DefaultEncoder()) }
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[m.Name] = append(out[m.Name], point{labels: labels(p.Attributes), value: float64(p.Value)})
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[m.Name] = append(out[m.Name], point{labels: labels(p.Attributes), count: p.Count, bounds: p.Bounds})
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					out[m.Name] = append(out[m.Name], point{labels: labels(p.Attributes), count: p.Count, bounds: p.Bounds})
				}
			default:
				t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return out
}

// The metrics of a real stream: a proxy connects, is answered and ACKs, is pushed and NACKs,
// disconnects.
func TestMetrics(t *testing.T) {
	mp, reader := meterReader(t)
	m, err := NewMetrics(mp)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	e := newEnv(t, Options{Observers: []Observer{m, rec}}, baseMesh()...)
	c := newSotW(t, e.addr, node("p", "demo", false))
	c.subscribe(cds)
	c.recvType(cds)
	e.update(destinationRule("demo", "a", "a.demo"))
	c.send(nack(c.recvRaw(), nil))
	rec.waitLines(t, 6) // connected, responded, ACK, responded, NACK, pushed

	got := collect(t, reader)
	type want struct {
		labels string
		value  float64
		count  uint64
	}
	for name, w := range map[string]want{
		"pilot_xds":                    {labels: "type=sidecar,version=", value: 1},
		"pilot_xds_pushes":             {labels: "type=cds", value: 2},
		"pilot_total_xds_rejects":      {labels: "type=cds", value: 1},
		"pilot_xds_push_time":          {labels: "type=cds", count: 2},
		"pilot_xds_send_time":          {count: 2},
		"pilot_xds_config_size_bytes":  {labels: "type=cds", count: 2},
		"pilot_proxy_convergence_time": {count: 1},
		"pilot_proxy_queue_time":       {count: 1},
	} {
		ps := got[name]
		if len(ps) != 1 || ps[0].labels != w.labels || ps[0].value != w.value || ps[0].count != w.count {
			t.Errorf("%s = %+v, want %+v", name, ps, w)
		}
	}
	if b := got["pilot_proxy_convergence_time"][0].bounds; len(b) == 0 || b[0] != 0.01 || b[len(b)-1] != 30 {
		t.Errorf("convergence buckets = %v, want 10 ms to 30 s", b)
	}

	if err := c.s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	rec.waitLines(t, 7)
	if ps := collect(t, reader)["pilot_xds"]; len(ps) != 1 || ps[0].value != 0 {
		t.Errorf("pilot_xds after disconnecting = %+v, want 0", ps)
	}
}

// A push that failed to send counts as istiod's <type>_senderr, unless the stream was closing.
func TestMetricsSendErrors(t *testing.T) {
	mp, reader := meterReader(t)
	m, err := NewMetrics(mp)
	if err != nil {
		t.Fatal(err)
	}
	stream := StreamInfo{ID: 1, Proxy: &model.Proxy{Type: model.SidecarProxy}}
	for _, err := range []error{
		&SendError{TypeURL: lds, Err: status.Error(codes.Unavailable, "transport is closing")},
		&SendError{TypeURL: lds, Err: status.Error(codes.Canceled, "context canceled")},
		errStreamClosed,
		&SendError{TypeURL: lds, Err: errors.New("connection reset")},
		fmt.Errorf("push: %w", &SendError{TypeURL: cds, Err: status.Error(codes.ResourceExhausted, "too large")}),
	} {
		m.Pushed(Push{Stream: stream, Request: &PushRequest{}, Err: err})
	}
	got := map[string]float64{}
	for _, p := range collect(t, reader)["pilot_xds_pushes"] {
		got[p.labels] = p.value
	}
	if want := map[string]float64{"type=lds_senderr": 1, "type=cds_senderr": 1}; !maps.Equal(got, want) {
		t.Errorf("pilot_xds_pushes = %v, want %v", got, want)
	}
	if ps := collect(t, reader)["pilot_proxy_convergence_time"]; len(ps) != 0 {
		t.Errorf("failed pushes converged: %+v", ps)
	}
}
