package translate

import (
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/authn"
	"sailplane.dev/services/xds-server/internal/model"
)

// EndpointMTLS tells which endpoints of a cluster EDS marks as taking Istio mTLS, as istiod
// does (dr is the DestinationRule that applies, nil if none; peerDisables false promises no
// PeerAuthentication disables mTLS, which spares the lookups): of those whose workload has a sidecar, all when the DestinationRule's TLS mode for the
// cluster is ISTIO_MUTUAL, none under another mode; without one, those whose PeerAuthentication
// does not DISABLE mTLS on the port they serve. (Under an explicit mode the cluster's transport
// socket does not depend on the mark.)
func EndpointMTLS(snap *model.Snapshot, dr *networking.DestinationRule, svc *model.Service, port *discoveryv1.Port,
	subset string, peerDisables bool) func(*discoveryv1.Endpoint) bool {
	if mode, ok := destinationRuleTLSMode(dr, port.GetNumber(), subset); ok {
		if mode != networking.ClientTLSSettings_ISTIO_MUTUAL {
			return nil
		}
		return func(ep *discoveryv1.Endpoint) bool {
			return ep.GetLabels()[model.TLSModeLabel] == TLSModeIstio
		}
	}
	ns := svc.Spec.GetNamespace()
	return func(ep *discoveryv1.Endpoint) bool {
		if ep.GetLabels()[model.TLSModeLabel] != TLSModeIstio {
			return false
		}
		if !peerDisables {
			return true
		}
		return authn.ForWorkload(snap, ns, ep.GetLabels()).ModeFor(EndpointPort(ep, port)) != authn.Disable
	}
}

// destinationRuleTLSMode is the TLS mode a DestinationRule sets for a cluster as istiod's EDS
// reads it (its mtls_checker, which differs from the cluster's policy merge): for a subset,
// the subset's policy, else the rule's; in a policy, the port's level setting, else its own;
// ok is false when none sets TLS (or the subset does not exist).
func destinationRuleTLSMode(dr *networking.DestinationRule, port uint32, subset string) (networking.ClientTLSSettings_TLSmode, bool) {
	if dr == nil {
		return 0, false
	}
	if subset != "" {
		ss := Subset(dr, subset)
		if ss == nil {
			return 0, false
		}
		if mode, ok := policyTLSMode(ss.GetTrafficPolicy(), port); ok {
			return mode, true
		}
	}
	return policyTLSMode(dr.GetTrafficPolicy(), port)
}

func policyTLSMode(tp *networking.TrafficPolicy, port uint32) (networking.ClientTLSSettings_TLSmode, bool) {
	for _, pls := range tp.GetPortLevelSettings() {
		if pls.GetPort().GetNumber() == port && pls.GetTls() != nil {
			return pls.GetTls().GetMode(), true
		}
	}
	if t := tp.GetTls(); t != nil {
		return t.GetMode(), true
	}
	return 0, false
}
