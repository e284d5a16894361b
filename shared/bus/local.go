package bus

import (
	"context"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// LocalOption configures the in-process transport.
type LocalOption func(*localSource)

// WithLocalConsumer names the consumer in the Store's Rejections (default "local").
func WithLocalConsumer(name string) LocalOption {
	return func(l *localSource) { l.consumer = name }
}

// Local is the in-process transport: no serialization, handlers receive the Store's own
// *Resource values (which they must not modify).
func Local(s *Store, opts ...LocalOption) Source {
	l := &localSource{store: s, consumer: "local"}
	for _, o := range opts {
		o(l)
	}
	return l
}

type localSource struct {
	store    *Store
	consumer string
}

var _ Source = (*localSource)(nil)

// consumerView is what one consumer holds of one type: the versions it accepted and the
// versions it rejected (never delivered again). Every transport's consumer side keeps one.
type consumerView struct {
	canonical string
	wireURL   string // the type URL as the consumer spelled it
	have      map[string]string
	rejected  map[string]string
	// held counts have in sailplane_bus_consumer_resources.
	held  metric.Int64UpDownCounter
	attrs metric.AddOption
}

func newConsumerView(wireURL string, held consumerResources, consumer string) *consumerView {
	return &consumerView{
		canonical: canonicalType(wireURL), wireURL: wireURL, have: map[string]string{}, rejected: map[string]string{},
		held:  held.held,
		attrs: metric.WithAttributes(attribute.String("type", typeLabel(wireURL)), attribute.String("consumer", consumer)),
	}
}

// release uncounts what the consumer held, when its subscription ends.
func (v *consumerView) release() { v.held.Add(context.Background(), -int64(len(v.have)), v.attrs) }

// wants reports whether a resource version is news to the consumer.
func (v *consumerView) wants(name, version string) bool {
	if have, ok := v.have[name]; ok && have == version {
		return false
	}
	if rej, ok := v.rejected[name]; ok && rej == version {
		return false
	}
	return true
}

// accepted records a change the handler applied.
func (v *consumerView) accepted(c Change) {
	before := len(v.have)
	for _, r := range c.Updated {
		v.have[r.Name] = r.Version
		delete(v.rejected, r.Name)
	}
	for _, n := range c.Removed {
		delete(v.have, n)
	}
	if n := len(v.have) - before; n != 0 {
		v.held.Add(context.Background(), int64(n), v.attrs)
	}
}

// rejectedChange records a change the handler refused, returning one Rejection per resource.
func (v *consumerView) rejectedChange(consumer string, c Change, err error) []Rejection {
	now := time.Now()
	out := make([]Rejection, 0, len(c.Updated)+len(c.Removed))
	for _, r := range c.Updated {
		v.rejected[r.Name] = r.Version
		out = append(out, Rejection{Consumer: consumer, TypeURL: v.canonical, Name: r.Name,
			Version: r.Version, Err: err.Error(), At: now})
	}
	for _, n := range c.Removed {
		out = append(out, Rejection{Consumer: consumer, TypeURL: v.canonical, Name: n, Err: err.Error(), At: now})
	}
	return out
}

func (l *localSource) Subscribe(ctx context.Context, typeURLs []string, h Handler) error {
	w := newWatcher()
	views := map[string]*consumerView{}
	var order []string
	held := newConsumerResources(l.store.meterProvider)
	for _, t := range typeURLs {
		typ := canonicalType(t)
		if _, dup := views[typ]; !dup {
			views[typ] = newConsumerView(t, held, l.consumer)
			defer views[typ].release()
			order = append(order, typ)
		}
	}
	defer l.store.unwatch(w, order...)

	for _, typ := range order {
		if ctx.Err() != nil {
			return nil
		}
		entries, _, err := l.store.watch(ctx, w, typ)
		if err != nil {
			return nil // ctx ended while the producer was still loading
		}
		l.deliver(h, views[typ], entries, nil, true)
	}
	if ctx.Err() != nil {
		return nil
	}
	h.Synced()

	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.notify:
		}
		dirty, since := w.take()
		for typ, names := range dirty {
			if ctx.Err() != nil {
				return nil
			}
			v := views[typ]
			if v == nil {
				continue
			}
			found, missing := l.store.lookup(typ, names)
			if l.deliver(h, v, found, missing, false) {
				l.store.metrics.delivered(typ, since[typ])
			}
		}
	}
}

// deliver applies what is new to the consumer among found and missing, reporting whether it
// called the handler; the first delivery of a type is applied even when empty so the handler
// sees every type before Synced.
func (l *localSource) deliver(h Handler, v *consumerView, found []*entry, missing []string, first bool) bool {
	c := Change{TypeURL: v.wireURL}
	for _, e := range found {
		if v.wants(e.res.Name, e.res.Version) {
			c.Updated = append(c.Updated, e.res)
		}
	}
	for _, n := range missing {
		if _, ok := v.have[n]; ok {
			c.Removed = append(c.Removed, n)
		}
	}
	if !first && len(c.Updated) == 0 && len(c.Removed) == 0 {
		return false
	}
	slices.SortFunc(c.Updated, func(a, b *Resource) int { return strings.Compare(a.Name, b.Name) })
	slices.Sort(c.Removed)
	span := startDelivery(&c, l.consumer)
	err := h.Apply(c)
	endDelivery(span, err)
	if err != nil {
		for _, r := range v.rejectedChange(l.consumer, c, err) {
			l.store.reject(r)
		}
		return true
	}
	v.accepted(c)
	return true
}
