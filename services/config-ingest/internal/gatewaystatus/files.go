package gatewaystatus

import (
	"errors"

	networking "istio.io/api/networking/v1alpha3"

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
		if c.Kind.Group != schema.GatewayAPIGroup {
			continue
		}
		obj, err := gatewayapi.DecodeAny(c.Kind, c.Resource())
		if err == nil {
			in.Add(obj)
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
