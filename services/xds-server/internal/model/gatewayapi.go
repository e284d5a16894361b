package model

import (
	"fmt"
	"maps"
	"slices"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/gatewayapi"
	"sailplane.dev/shared/schema"
)

// The Gateway API reaches proxies as the Istio config it translates to (shared/gatewayapi):
// Gateways, VirtualServices and DestinationRules appended to each full snapshot, which
// envoygen and grpcgen serve like the user's own. Objects are decoded once, when they arrive;
// translation runs only when a Gateway API object or a registry service changed, so endpoint
// pushes never pay for it, and a change pushes only what its generated config touches. A
// namespace's labels count too: listeners' allowedRoutes selectors match them.

// gatewayAPIState is the Store's share of Gateway API work; guarded by Store.mu.
type gatewayAPIState struct {
	// objects are the decoded objects by kind, then bus name.
	objects map[string]map[string]metav1.Object
	// dirty: translate again at the next full snapshot.
	dirty bool
	out   gatewayapi.Output
	// served are the generated configs of the last snapshot Next built, by key, for diffing.
	served map[ConfigKey]proto.Message
	// Translations counts translations run (tests and the benchmark read it).
	translations int
	// selectorHosts are the services manually deployed Gateways run behind: their endpoints'
	// labels select the gateway pods, so a change of those endpoints translates again.
	selectorHosts map[string]bool
}

func isGatewayAPI(kind schema.Kind) bool {
	return slices.ContainsFunc(schema.GatewayAPI, func(k schema.Kind) bool { return k.TypeURL == kind.TypeURL })
}

// applyGatewayAPI decodes a change of a Gateway API kind, all or nothing, and stores the
// objects; s.mu is held by the caller only for the store part.
func (s *Store) decodeGatewayAPIChange(kind schema.Kind, c bus.Change) (map[string]metav1.Object, error) {
	out := make(map[string]metav1.Object, len(c.Updated))
	for _, r := range c.Updated {
		obj, err := gatewayapi.DecodeAny(kind, r)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrRejected, err)
		}
		out[r.Name] = obj
	}
	return out, nil
}

// storeGatewayAPI records decoded objects and removals; s.mu is held.
func (s *Store) storeGatewayAPI(kind schema.Kind, updated map[string]metav1.Object, removed []string) {
	if s.gw.objects == nil {
		s.gw.objects = map[string]map[string]metav1.Object{}
	}
	m := s.gw.objects[kind.Kind]
	if m == nil {
		m = map[string]metav1.Object{}
		s.gw.objects[kind.Kind] = m
	}
	for _, name := range removed {
		delete(m, name)
	}
	for name, obj := range updated {
		m[name] = obj
	}
	s.gw.dirty = true
}

func objectsOf[T any](s *Store, kind schema.Kind) []*T {
	m := s.gw.objects[kind.Kind]
	out := make([]*T, 0, len(m))
	for _, o := range m {
		out = append(out, any(o).(*T))
	}
	return out
}

// gatewayAPIOutput is the translation of the current objects against snap's registry, run
// again only when something it reads changed; s.mu is held.
func (s *Store) gatewayAPIOutput(snap *Snapshot) gatewayapi.Output {
	if !s.gw.dirty {
		return s.gw.out
	}
	s.gw.dirty = false
	if len(s.gw.objects) == 0 {
		s.gw.out = gatewayapi.Output{}
		return s.gw.out
	}
	s.gw.translations++
	s.gw.selectorHosts = map[string]bool{}
	for _, o := range s.gw.objects[schema.KubernetesGateway.Kind] {
		for _, h := range gatewayapi.ManualGatewayHosts(o.(*gwv1.Gateway), DomainSuffix) {
			s.gw.selectorHosts[h] = true
		}
	}
	s.gw.out = gatewayapi.Translate(gatewayapi.Input{
		GatewayClasses:     objectsOf[gwv1.GatewayClass](s, schema.GatewayClass),
		Gateways:           objectsOf[gwv1.Gateway](s, schema.KubernetesGateway),
		ListenerSets:       objectsOf[gwv1.ListenerSet](s, schema.ListenerSet),
		HTTPRoutes:         objectsOf[gwv1.HTTPRoute](s, schema.HTTPRoute),
		GRPCRoutes:         objectsOf[gwv1.GRPCRoute](s, schema.GRPCRoute),
		TCPRoutes:          objectsOf[gwv1.TCPRoute](s, schema.TCPRoute),
		TLSRoutes:          objectsOf[gwv1.TLSRoute](s, schema.TLSRoute),
		ReferenceGrants:    objectsOf[gwv1.ReferenceGrant](s, schema.ReferenceGrant),
		BackendTLSPolicies: objectsOf[gwv1.BackendTLSPolicy](s, schema.BackendTLSPolicy),
		Services:           registry{snap: snap, entries: s.state[schema.ServiceEntry.TypeURL]},
		DomainSuffix:       DomainSuffix,
		NamespaceLabels:    namespaceLabels(s.state[schema.Namespace.TypeURL]),
	})
	return s.gw.out
}

// namespaceLabels are the namespaces' labels config-ingest publishes from Kubernetes, for the
// listeners' allowedRoutes selectors to match as its status writer does. Nil without any (config
// from files): translation then knows only the routes' namespaces, by name.
func namespaceLabels(nss map[string]*bus.Resource) map[string]map[string]string {
	if len(nss) == 0 {
		return nil
	}
	out := make(map[string]map[string]string, len(nss))
	for name, r := range nss {
		out[name] = r.Body.(*discoveryv1.Namespace).GetLabels()
	}
	return out
}

// withGatewayAPI appends the translated config to a snapshot being built, keeping each list
// in Istio's order of precedence.
func withGatewayAPI(snap *Snapshot, out gatewayapi.Output) {
	if len(out.Gateways)+len(out.VirtualServices)+len(out.DestinationRules) == 0 {
		return
	}
	snap.Gateways = mergeConfigs(snap.Gateways, out.Gateways)
	snap.VirtualServices = mergeConfigs(snap.VirtualServices, out.VirtualServices)
	snap.DestinationRules = mergeConfigs(snap.DestinationRules, out.DestinationRules)
}

func mergeConfigs[T proto.Message](own []Config[T], gen []gatewayapi.Config[T]) []Config[T] {
	if len(gen) == 0 {
		return own
	}
	out := slices.Grow(slices.Clone(own), len(gen))
	for _, g := range gen {
		out = append(out, Config[T]{Namespace: g.Namespace, Name: g.Name, CreateTime: g.CreateTime, Spec: g.Spec, GatewayAPI: true})
	}
	slices.SortStableFunc(out, compareConfigs[T])
	return out
}

// noteGatewayAPI records, in ch, the generated configs that differ from those last served, as
// changes of those kinds: a route edit pushes what its VirtualService touches, not everything.
func (s *Store) noteGatewayAPI(ch *Change, out gatewayapi.Output) {
	next := map[ConfigKey]proto.Message{}
	for _, c := range out.Gateways {
		next[ConfigKey{Kind: schema.Gateway.Kind, Namespace: c.Namespace, Name: c.Name}] = c.Spec
	}
	for _, c := range out.VirtualServices {
		next[ConfigKey{Kind: schema.VirtualService.Kind, Namespace: c.Namespace, Name: c.Name}] = c.Spec
	}
	for _, c := range out.DestinationRules {
		next[ConfigKey{Kind: schema.DestinationRule.Kind, Namespace: c.Namespace, Name: c.Name}] = c.Spec
	}
	kinds := map[string]schema.Kind{schema.Gateway.Kind: schema.Gateway, schema.VirtualService.Kind: schema.VirtualService,
		schema.DestinationRule.Kind: schema.DestinationRule}
	res := func(k ConfigKey, m proto.Message) *bus.Resource {
		if m == nil {
			return nil
		}
		return &bus.Resource{Name: schema.Name(k.Namespace, k.Name), Body: m}
	}
	for k, m := range next {
		if old, ok := s.gw.served[k]; !ok || !proto.Equal(old, m) {
			ch.record(kinds[k.Kind], res(k, s.gw.served[k]), res(k, m))
		}
	}
	for k, old := range s.gw.served {
		if _, ok := next[k]; !ok {
			ch.record(kinds[k.Kind], res(k, old), nil)
		}
	}
	s.gw.served = next
}

// GatewayAPITranslations is how many times the Gateway API was translated (for tests).
func (s *Store) GatewayAPITranslations() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gw.translations
}

// GatewayAPIStatus is the status the last translation computed (for tools; the status writer
// is config-ingest's).
func (s *Store) GatewayAPIStatus() []gatewayapi.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.gw.out.Status)
}

// registry is a snapshot's services as translation reads them, and the ServiceEntries by name.
type registry struct {
	snap    *Snapshot
	entries map[string]*bus.Resource
}

var (
	_ gatewayapi.Services       = registry{}
	_ gatewayapi.ServiceEntries = registry{}
)

func (r registry) ServiceEntryHosts(namespace, name string) ([]string, bool) {
	res, ok := r.entries[schema.Name(namespace, name)]
	if !ok {
		return nil, false
	}
	return res.Body.(*networking.ServiceEntry).GetHosts(), true
}

func (r registry) Service(hostname, namespace string) (gatewayapi.Service, bool) {
	var pick *Service
	for _, c := range append([]*Service{r.snap.Services[hostname]}, r.snap.shadowed[hostname]...) {
		if c == nil || !r.snap.ServiceVisible(c, namespace) {
			continue
		}
		if pick == nil || c.Spec.GetNamespace() == namespace {
			pick = c
		}
		if c.Spec.GetNamespace() == namespace {
			break
		}
	}
	if pick == nil {
		return gatewayapi.Service{}, false
	}
	out := gatewayapi.Service{Hostname: hostname, Addresses: pick.Spec.GetAddresses(), Ready: len(pick.Endpoints) > 0,
		Selector: commonLabels(pick.Endpoints)}
	for _, p := range pick.Spec.GetPorts() {
		out.Ports = append(out.Ports, gatewayapi.ServicePort{Name: p.GetName(), Number: p.GetNumber(), Protocol: p.GetProtocol()})
	}
	return out, true
}

func compareConfigs[T proto.Message](a, b Config[T]) int {
	if c := a.CreateTime.Compare(b.CreateTime); c != 0 {
		return c
	}
	if a.Namespace != b.Namespace {
		if a.Namespace < b.Namespace {
			return -1
		}
		return 1
	}
	switch {
	case a.Name < b.Name:
		return -1
	case a.Name > b.Name:
		return 1
	}
	return 0
}

// commonLabels are the labels all endpoints share: the registry carries no Service selector,
// and these select no fewer pods (a manually deployed Gateway's Istio Gateways select its
// Service's pods with them). None without endpoints, so that nothing is selected by accident.
func commonLabels(eps []*discoveryv1.Endpoint) map[string]string {
	if len(eps) == 0 {
		return nil
	}
	out := maps.Clone(eps[0].GetLabels())
	for _, ep := range eps[1:] {
		for k, v := range out {
			if ep.GetLabels()[k] != v {
				delete(out, k)
			}
		}
	}
	return out
}
