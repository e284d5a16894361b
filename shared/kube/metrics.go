package kube

import (
	"context"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"sailplane.dev/shared/telemetry"
)

const meterScope = "sailplane.dev/kube"

// CountWatchErrors wraps cfg's transport so that every list or watch request that failed (no
// answer, or an error status such as RBAC's 403) counts in
// sailplane_kube_watch_errors_total{resource} and attrs (the cluster, where there are several).
// The transport is where they all show: an informer retries a refused watch quietly, without
// calling its watch error handler.
func CountWatchErrors(cfg *rest.Config, provider metric.MeterProvider, attrs ...attribute.KeyValue) {
	errs, err := telemetry.Meter(provider, meterScope).Int64Counter("sailplane_kube_watch_errors_total",
		metric.WithDescription("Kubernetes list and watch requests that failed (no answer or an error status), by resource."))
	telemetry.Handle(err)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(req)
			failed := (err != nil && req.Context().Err() == nil) || (err == nil && resp.StatusCode >= http.StatusBadRequest)
			if failed && isListOrWatch(req) {
				errs.Add(context.Background(), 1, metric.WithAttributes(append(attrs, attribute.String("resource", resourceOf(req)))...))
			}
			return resp, err
		})
	})
}

// isListOrWatch reports whether req reads a collection as informers do.
func isListOrWatch(req *http.Request) bool {
	q := req.URL.Query()
	return req.Method == http.MethodGet && (q.Has("watch") || q.Has("limit") || q.Has("resourceVersion"))
}

// resourceOf is the resource of a collection request: "pods" in /api/v1/namespaces/ns/pods.
func resourceOf(req *http.Request) string {
	path := strings.TrimSuffix(req.URL.Path, "/")
	return path[strings.LastIndex(path, "/")+1:]
}

// EventCounter counts informer events as istiod does, by type (istiod's names: "Services",
// "Pods", "VirtualService") and event: add, update, updatesame (a resync, same resourceVersion),
// delete.
type EventCounter struct{ events metric.Int64Counter }

// RegistryEvents counts in istiod's pilot_k8s_reg_events (service registry informers).
func RegistryEvents(provider metric.MeterProvider) EventCounter {
	return newEventCounter(provider, "pilot_k8s_reg_events", "Events from k8s registry.")
}

// ConfigEvents counts in istiod's pilot_k8s_cfg_events (config informers).
func ConfigEvents(provider metric.MeterProvider) EventCounter {
	return newEventCounter(provider, "pilot_k8s_cfg_events", "Events from k8s config.")
}

func newEventCounter(provider metric.MeterProvider, name, description string) EventCounter {
	events, err := telemetry.Meter(provider, meterScope).Int64Counter(name, metric.WithDescription(description))
	telemetry.Handle(err)
	return EventCounter{events: events}
}

// Counted returns h counting each event as one of typ.
func (c EventCounter) Counted(typ string, h cache.ResourceEventHandlerFuncs) cache.ResourceEventHandlerFuncs {
	event := func(e string) metric.AddOption {
		return metric.WithAttributes(attribute.String("type", typ), attribute.String("event", e))
	}
	add, update, same, del := event("add"), event("update"), event("updatesame"), event("delete")
	ctx := context.Background()
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			c.events.Add(ctx, 1, add)
			if h.AddFunc != nil {
				h.AddFunc(o)
			}
		},
		UpdateFunc: func(o, n any) {
			if resourceVersion(o) != "" && resourceVersion(o) == resourceVersion(n) {
				c.events.Add(ctx, 1, same)
			} else {
				c.events.Add(ctx, 1, update)
			}
			if h.UpdateFunc != nil {
				h.UpdateFunc(o, n)
			}
		},
		DeleteFunc: func(o any) {
			c.events.Add(ctx, 1, del)
			if h.DeleteFunc != nil {
				h.DeleteFunc(o)
			}
		},
	}
}

func resourceVersion(o any) string {
	if m, err := meta.Accessor(o); err == nil {
		return m.GetResourceVersion()
	}
	return ""
}
