package xds

import (
	"context"
	"errors"
	"fmt"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"sailplane.dev/shared/xdstype"
)

// MeterName is the instrumentation scope of the xDS server's metrics.
const MeterName = "sailplane.dev/xds-server"

// bg is the context of measurements: observers are called without one.
var bg = context.Background()

// Bucket boundaries, in seconds, of istiod's xDS histograms (pilot/pkg/xds/monitoring.go).
var (
	istiodSeconds = []float64{.01, .1, 1, 3, 5, 10, 20, 30}
	queueSeconds  = []float64{.1, .5, 1, 3, 5, 10, 20, 30}
	// convergenceSeconds is istiod's (.1 to 30 s) with what resolves 10 to 100 ms, where
	// Sailplane's pushes land: dashboards' le="0.1" and above still match.
	convergenceSeconds = []float64{.01, .025, .05, .1, .25, .5, 1, 3, 5, 10, 20, 30}
	// configBytes: 10K, 1M, 4M (gRPC's default limit), 10M, 40M, as istiod's.
	configBytes = []float64{1, 10000, 1000000, 4000000, 10000000, 40000000}
)

// Metrics is the Observer recording istiod's xDS metrics, named and labelled as istiod's so
// that Istio's dashboards and alerts work on Sailplane; the debouncer reports to it too.
type Metrics struct {
	debounce    metric.Float64Histogram   // pilot_debounce_time: change to push queued
	clients     metric.Int64UpDownCounter // pilot_xds{type,version}: connected proxies
	pushes      metric.Int64Counter       // pilot_xds_pushes{type}: responses, and send errors as <type>_senderr
	pushTime    metric.Float64Histogram   // pilot_xds_push_time{type}: building and sending a response
	sendTime    metric.Float64Histogram   // pilot_xds_send_time: sending a response
	configSize  metric.Int64Histogram     // pilot_xds_config_size_bytes{type}
	rejects     metric.Int64Counter       // pilot_total_xds_rejects{type}: NACKs
	convergence metric.Float64Histogram   // pilot_proxy_convergence_time: change to proxy pushed
	queueTime   metric.Float64Histogram   // pilot_proxy_queue_time: waiting for a push worker

	// byType are the type label's options for the usual types, made once: a measurement
	// then allocates nothing.
	byType map[string]typeLabel
}

// typeLabel is istiod's type label, as options to pass.
type typeLabel struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

func newTypeLabel(label string) typeLabel {
	o := metric.WithAttributeSet(attribute.NewSet(attribute.String("type", label)))
	return typeLabel{add: []metric.AddOption{o}, rec: []metric.RecordOption{o}}
}

var _ Observer = (*Metrics)(nil)

// NewMetrics returns the Observer recording the xDS server's metrics with mp's meter, or with
// the global MeterProvider's when mp is nil.
func NewMetrics(mp metric.MeterProvider) (*Metrics, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(MeterName)
	m := &Metrics{byType: map[string]typeLabel{}}
	for _, t := range []string{resourcev3.ClusterType, resourcev3.EndpointType, resourcev3.ListenerType,
		resourcev3.RouteType, resourcev3.SecretType} {
		m.byType[t] = newTypeLabel(xdstype.MetricLabel(t))
	}
	var errs []error
	var err error
	m.debounce, err = meter.Float64Histogram("pilot_debounce_time", metric.WithUnit("s"),
		metric.WithDescription("Delay in seconds between the first config enters debouncing and the merged push request is pushed into the push queue (includes pushcontext_init_seconds)."),
		metric.WithExplicitBucketBoundaries(istiodSeconds...))
	errs = append(errs, err)
	m.clients, err = meter.Int64UpDownCounter("pilot_xds",
		metric.WithDescription("Number of endpoints connected to this pilot using XDS."))
	errs = append(errs, err)
	m.pushes, err = meter.Int64Counter("pilot_xds_pushes",
		metric.WithDescription("Pilot build and send errors for lds, rds, cds and eds."))
	errs = append(errs, err)
	m.pushTime, err = meter.Float64Histogram("pilot_xds_push_time", metric.WithUnit("s"),
		metric.WithDescription("Total time in seconds Pilot takes to push lds, rds, cds and eds."),
		metric.WithExplicitBucketBoundaries(istiodSeconds...))
	errs = append(errs, err)
	m.sendTime, err = meter.Float64Histogram("pilot_xds_send_time", metric.WithUnit("s"),
		metric.WithDescription("Total time in seconds Pilot takes to send generated configuration."),
		metric.WithExplicitBucketBoundaries(istiodSeconds...))
	errs = append(errs, err)
	m.configSize, err = meter.Int64Histogram("pilot_xds_config_size_bytes", metric.WithUnit("By"),
		metric.WithDescription("Distribution of configuration sizes pushed to clients"),
		metric.WithExplicitBucketBoundaries(configBytes...))
	errs = append(errs, err)
	m.rejects, err = meter.Int64Counter("pilot_total_xds_rejects",
		metric.WithDescription("Total number of XDS responses from pilot rejected by proxy."))
	errs = append(errs, err)
	m.convergence, err = meter.Float64Histogram("pilot_proxy_convergence_time", metric.WithUnit("s"),
		metric.WithDescription("Delay in seconds between config change and a proxy receiving all required configuration."),
		metric.WithExplicitBucketBoundaries(convergenceSeconds...))
	errs = append(errs, err)
	m.queueTime, err = meter.Float64Histogram("pilot_proxy_queue_time", metric.WithUnit("s"),
		metric.WithDescription("Time in seconds, a proxy is in the push queue before being dequeued."),
		metric.WithExplicitBucketBoundaries(queueSeconds...))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("xds metrics: %w", err)
	}
	return m, nil
}

func (m *Metrics) typeOf(typeURL string) typeLabel {
	if l, ok := m.byType[typeURL]; ok {
		return l
	}
	return newTypeLabel(xdstype.MetricLabel(typeURL))
}

func clientAttrs(s StreamInfo) metric.AddOption {
	return metric.WithAttributes(attribute.String("type", string(s.Proxy.Type)),
		attribute.String("version", s.Proxy.IstioVersion))
}

// Debounced records that changes first seen at since were queued for pushing.
func (m *Metrics) Debounced(since time.Time) {
	if since.IsZero() {
		return
	}
	m.debounce.Record(bg, time.Since(since).Seconds())
}

func (m *Metrics) Connected(s StreamInfo) {
	m.clients.Add(bg, 1, clientAttrs(s))
}

func (m *Metrics) Disconnected(s StreamInfo) {
	m.clients.Add(bg, -1, clientAttrs(s))
}

func (m *Metrics) Responded(r Response) {
	t := m.typeOf(r.TypeURL)
	m.pushes.Add(bg, 1, t.add...)
	m.pushTime.Record(bg, r.Sent.Sub(r.Began).Seconds(), t.rec...)
	m.sendTime.Record(bg, r.Sent.Sub(r.Built).Seconds())
	m.configSize.Record(bg, int64(r.Bytes), t.rec...)
}

func (m *Metrics) Answered(a Answer) {
	if a.Err != nil {
		m.rejects.Add(bg, 1, m.typeOf(a.Response.TypeURL).add...)
	}
}

func (m *Metrics) Pushed(p Push) {
	m.queueTime.Record(bg, p.Started.Sub(p.Queued).Seconds())
	if p.Err == nil {
		m.convergence.Record(bg, p.Done.Sub(p.Request.Start).Seconds())
		return
	}
	// As istiod, a stream closing (Unavailable, Canceled) is not a send error.
	var send *SendError
	if errors.As(p.Err, &send) && unexpected(send.Err) {
		m.pushes.Add(bg, 1, newTypeLabel(xdstype.MetricLabel(send.TypeURL)+"_senderr").add...)
	}
}

func unexpected(err error) bool {
	s, ok := status.FromError(err)
	return !ok || (s.Code() != codes.Unavailable && s.Code() != codes.Canceled)
}
