// Package bus is how Sailplane's services exchange resources: MCP over xDS. A producer keeps its
// resources in a Store; consumers subscribe to types, either in-process (Local, no serialization)
// or over gRPC (delta or state-of-the-world ADS, resources as istio.mcp.v1alpha1.Resource).
package bus

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
)

// Resource is one named, versioned resource. A published Resource and its Body are immutable:
// producers publish a new Resource for every change and consumers never modify what they get.
type Resource struct {
	// Name is "namespace/name", or "name" for cluster-scoped kinds.
	Name string
	// Version identifies the content; the Store derives it from the content when empty.
	Version     string
	Body        proto.Message
	Labels      map[string]string
	Annotations map[string]string
	CreateTime  time.Time
	// Trace is the span of the change that produced this version (see TraceMetadataKey); it is
	// not content: the version ignores it. Invalid (the zero value) when the change is not traced.
	Trace trace.SpanContext
}

// Change is one update of one type, as a consumer receives it.
type Change struct {
	TypeURL string
	Updated []*Resource
	Removed []string
	// Trace is the context of this delivery's "bus.deliver" span, set by the transport when an
	// updated resource carries a trace, for the handler to continue; invalid otherwise.
	Trace trace.SpanContext
}

// Handler consumes changes. Apply is called from a single goroutine per subscription, in order.
// A non-nil error from Apply rejects (NACKs) the change: the producer sees the error and does not
// send those versions again, and the consumer is expected to keep its last good state.
type Handler interface {
	Apply(Change) error
	// Synced is called once, after the first full state of every subscribed type was applied.
	Synced()
}

// Publisher is the producer's side of the bus. Upsert and Replace publish every acceptable
// resource; each one refused (over the size limit: a *TooLargeError, joined in the error) keeps
// its previous version, so a producer reports the error and carries on.
type Publisher interface {
	// Upsert adds or replaces resources of one type.
	Upsert(typeURL string, resources ...*Resource) error
	// Delete removes resources of one type by name; unknown names are ignored.
	Delete(typeURL string, names ...string)
	// Replace sets the whole state of one type: what is not in resources is deleted.
	Replace(typeURL string, resources []*Resource) error
}

// Source is where a consumer subscribes.
type Source interface {
	// Subscribe delivers the state of the given types to h, then every change, until ctx is
	// done. Transports that can lose their peer reconnect with backoff; Subscribe returns only
	// when ctx is done or on an error that retrying cannot fix.
	Subscribe(ctx context.Context, typeURLs []string, h Handler) error
}
