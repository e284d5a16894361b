package gatewaystatus

import (
	"errors"

	networking "istio.io/api/networking/v1alpha3"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/config"
	"sailplane.dev/shared/gatewayapi"
	"sailplane.dev/shared/schema"
)

// FromConfigs computes the status of the Gateway API objects among configs (files mode: there
// is no API server to write it to, so it is only shown), with ServiceEntries as the registry.
// The bus carries no generation: observedGeneration is 0. A resource that does not decode is
// reported in the error and left out.
func FromConfigs(configs []config.Config, translate func(gatewayapi.Input) gatewayapi.Output) ([]Computed, error) {
	var (
		in      gatewayapi.Input
		entries []serviceEntry
		errs    []error
	)
	for _, c := range configs {
		if c.Kind.TypeURL == schema.ServiceEntry.TypeURL {
			if se, ok := c.Spec.(*networking.ServiceEntry); ok {
				entries = append(entries, serviceEntry{ns: c.Namespace, spec: se})
			}
			continue
		}
		r := c.Resource()
		var err error
		switch c.Kind.TypeURL {
		case schema.GatewayClass.TypeURL:
			err = add(&in.GatewayClasses, gatewayapi.Decode[gwv1.GatewayClass], r)
		case schema.KubernetesGateway.TypeURL:
			err = add(&in.Gateways, gatewayapi.Decode[gwv1.Gateway], r)
		case schema.ListenerSet.TypeURL:
			err = add(&in.ListenerSets, gatewayapi.Decode[gwv1.ListenerSet], r)
		case schema.HTTPRoute.TypeURL:
			err = add(&in.HTTPRoutes, gatewayapi.Decode[gwv1.HTTPRoute], r)
		case schema.GRPCRoute.TypeURL:
			err = add(&in.GRPCRoutes, gatewayapi.Decode[gwv1.GRPCRoute], r)
		case schema.TCPRoute.TypeURL:
			err = add(&in.TCPRoutes, gatewayapi.Decode[gwv1.TCPRoute], r)
		case schema.TLSRoute.TypeURL:
			err = add(&in.TLSRoutes, gatewayapi.Decode[gwv1.TLSRoute], r)
		case schema.ReferenceGrant.TypeURL:
			err = add(&in.ReferenceGrants, gatewayapi.Decode[gwv1.ReferenceGrant], r)
		case schema.BackendTLSPolicy.TypeURL:
			err = add(&in.BackendTLSPolicies, gatewayapi.Decode[gwv1.BackendTLSPolicy], r)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(in.GatewayClasses)+len(in.Gateways)+len(in.HTTPRoutes)+len(in.GRPCRoutes)+len(in.TCPRoutes)+len(in.TLSRoutes)+len(in.ListenerSets)+len(in.BackendTLSPolicies) == 0 {
		return nil, errors.Join(errs...)
	}
	in.DomainSuffix = "cluster.local"
	in.Services = newRegistry(nil, entries, in.DomainSuffix, nil)
	return computed(translate(in).Status), errors.Join(errs...)
}

func add[P any](list *[]P, decode func(*bus.Resource) (P, error), r *bus.Resource) error {
	obj, err := decode(r)
	if err != nil {
		return err
	}
	*list = append(*list, obj)
	return nil
}
