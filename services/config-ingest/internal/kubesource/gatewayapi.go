package kubesource

import (
	"context"
	"encoding/json"
	"maps"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	k8sschema "k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"

	"sailplane.dev/shared/schema"
)

// The Gateway API is optional, as in istiod: its CRDs may not be installed (istiod then waits
// for them and starts its Gateway API controllers when they appear). Here a Gateway API kind
// is watched only while the API server serves it as v1; the others publish nothing. A watch on
// the CustomResourceDefinitions notices the CRDs being installed, upgraded or removed, and the
// informers are then replaced by a generation watching what is served now (resync): what
// appeared is published, what went away deleted.

var crdGVR = k8sschema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// gatewayAPIGroupVersion is what the API server serves the Gateway API kinds Sailplane reads as.
var gatewayAPIGroupVersion = schema.GatewayAPIGroup + "/" + schema.KubernetesGateway.Version

// gatewayAPIServed asks the API server which Gateway API kinds it serves as v1, by plural.
func (s *Source) gatewayAPIServed(ctx context.Context) (map[string]bool, error) {
	served := map[string]bool{}
	var list struct {
		Resources []struct {
			Name string `json:"name"`
		} `json:"resources"`
	}
	// The discovery document of the group version, as client-go's discovery reads it (with the
	// request's context, which ServerResourcesForGroupVersion has not).
	body, err := s.clients.Kube.Discovery().RESTClient().Get().AbsPath("/apis", gatewayAPIGroupVersion).Do(ctx).Raw()
	if apierrors.IsNotFound(err) {
		return served, nil // no Gateway API CRD serves v1
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, err
	}
	for _, r := range list.Resources {
		if !strings.Contains(r.Name, "/") { // not a subresource ("gateways/status")
			served[r.Name] = true
		}
	}
	return served, nil
}

// gatewayAPIServedRetrying is gatewayAPIServed, retried until the API server answers or ctx is
// done: watching a kind that is not served would never sync, and not watching one that is
// would delete its objects from the bus.
func (s *Source) gatewayAPIServedRetrying(ctx context.Context) (map[string]bool, error) {
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		served, err := s.gatewayAPIServed(ctx)
		if err == nil {
			return served, nil
		}
		s.log.Warn("cannot ask the API server which Gateway API kinds it serves; retrying", "error", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
	}
}

// servedGatewayAPI returns the Gateway API kinds watched now.
func (s *Source) servedGatewayAPI() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.gwServed)
}

// logGatewayAPI says which Gateway API kinds are read, when that changes from old (nil at start).
func (s *Source) logGatewayAPI(old, served map[string]bool) {
	var read, missing []string
	for _, k := range schema.GatewayAPI {
		if served[k.Plural] {
			read = append(read, k.Kind)
		} else {
			missing = append(missing, k.Kind)
		}
	}
	switch {
	case old != nil && maps.Equal(old, served):
	case len(read) == 0:
		s.log.Info("Gateway API CRDs not installed: the Gateway API kinds are not read until they are "+
			"(kubectl apply -k deploy/crds/gateway-api, or the Gateway API's standard-install.yaml)",
			"group-version", gatewayAPIGroupVersion)
	case len(missing) > 0:
		s.log.Warn("some Gateway API kinds are not served by the API server as "+gatewayAPIGroupVersion+
			" (their CRDs are missing or older than Sailplane's): they are not read until they are",
			"read", read, "not-read", missing)
	default:
		s.log.Info("Gateway API CRDs installed: reading the Gateway API kinds", "kinds", read)
	}
}

// watchCRDs starts a metadata-only watch of the CustomResourceDefinitions that signals
// crdChanged on any change of a Gateway API one. It returns a function stopping it. Without the
// RBAC to watch them, Gateway API CRDs installed later are read only after a restart.
func (s *Source) watchCRDs(ctx context.Context) func() {
	f := metadatainformer.NewSharedInformerFactory(s.crds, 0)
	inf := f.ForResource(crdGVR).Informer()
	signal := func(obj any) {
		name, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
		if err != nil || !strings.HasSuffix(name, "."+schema.GatewayAPIGroup) {
			return
		}
		select {
		case s.crdChanged <- struct{}{}:
		default:
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    signal,
		UpdateFunc: func(_, obj any) { signal(obj) },
		DeleteFunc: signal,
	})
	warned := false
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		if !warned {
			warned = true
			s.log.Warn("cannot watch CustomResourceDefinitions: Gateway API CRDs installed or removed from now on are noticed after an API server outage or a restart only", "error", err)
		}
	})
	ctx, cancel := context.WithCancel(ctx)
	f.Start(ctx.Done())
	return func() {
		cancel()
		f.Shutdown()
	}
}

// followCRDs replaces the informers when the Gateway API kinds served change, until ctx is
// done. It starts once the initial state is published, and looks once at start for what changed
// before.
func (s *Source) followCRDs(ctx context.Context) {
	check := func() {
		served, err := s.gatewayAPIServed(ctx)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("cannot ask the API server which Gateway API kinds it serves", "error", err)
			}
			return
		}
		old := s.servedGatewayAPI()
		if maps.Equal(old, served) {
			return
		}
		s.logGatewayAPI(old, served)
		// Bounded: a kind that cannot be listed (RBAC) must not hold the outage resyncs back.
		until, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := s.resync(ctx, until, served); err != nil && ctx.Err() == nil {
			s.log.Warn("cannot follow the Gateway API CRDs' change; retrying", "error", err)
			time.AfterFunc(5*time.Second, func() {
				select {
				case s.crdChanged <- struct{}{}:
				default:
				}
			})
		}
	}
	check()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.crdChanged:
			check()
		}
	}
}
