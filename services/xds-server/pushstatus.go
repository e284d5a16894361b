package xdsserver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	networking "istio.io/api/networking/v1alpha3"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/translate"
	"sailplane.dev/services/xds-server/internal/xds"
	"sailplane.dev/shared/monitoring"
)

// pushStatusMetrics are istiod's push status metrics Sailplane reports, with istiod's
// descriptions of their gauges (docs/metrics.md).
var pushStatusMetrics = []struct{ name, help string }{
	{model.MetricDupDomain, "Virtual services with dup domains."},
	{model.MetricOutboundTCPConflict, "Number of conflicting tcp listeners with current tcp listener."},
	{model.MetricInboundConflict, "Number of conflicting inbound listeners."},
	{model.MetricDestRuleSubsets, "Duplicate subsets across destination rules for same host"},
	{model.MetricDNSClusterNoEndpoints, "DNS clusters without endpoints caused by the endpoint field in STRICT_DNS type cluster is not set or the corresponding subset cannot select any endpoint"},
	{model.MetricEDSNoInstances, "Number of clusters without instances."},
	{model.MetricEndpointNotReady, "Endpoint found in unready state."},
	{model.MetricClusterTLSRefused, "Clusters left out because their DestinationRule asks for TLS the proxy cannot be given."},
	{model.MetricCredentialNotServed, "credentialName secrets proxies need that are not served over SDS (not authorized, missing or malformed)."},
}

// pushStatus is istiod's push status: the problems generation reported for the config version
// it last generated, and those of the served snapshot as a whole, computed from it.
//
// A new ConfigVersion starts afresh, as istiod starts a new PushContext: the proxies the change
// concerns have their configuration (but endpoints) generated again for it. The problems of the
// others are missing until they are, as in istiod.
type pushStatus struct {
	mu            sync.Mutex
	configVersion uint64
	found         map[string]map[string]model.Problem // metric -> key ->

	// mesh memoizes meshProblems of one snapshot.
	meshOf *model.Snapshot
	mesh   []model.Problem
}

var _ model.Problems = (*pushStatus)(nil)

func newPushStatus() *pushStatus {
	return &pushStatus{found: map[string]map[string]model.Problem{}}
}

// Report records p, found generating config for snap.
func (ps *pushStatus) Report(snap *model.Snapshot, p model.Problem) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	switch {
	case snap.ConfigVersion < ps.configVersion:
		return // a generation for config already replaced
	case snap.ConfigVersion > ps.configVersion:
		ps.configVersion = snap.ConfigVersion
		clear(ps.found)
	}
	byKey := ps.found[p.Metric]
	if byKey == nil {
		byKey = map[string]model.Problem{}
		ps.found[p.Metric] = byKey
	}
	byKey[p.Key] = p
}

// proxyPushStatus is istiod's push status entry (model.ProxyPushStatus).
type proxyPushStatus struct {
	Proxy   string `json:"proxy,omitempty"`
	Message string `json:"message,omitempty"`
}

// status is the push status of snap (the served snapshot), with proxies connected: metric ->
// key -> entry.
func (ps *pushStatus) status(snap *model.Snapshot, proxies []*model.Proxy) map[string]map[string]proxyPushStatus {
	ps.mu.Lock()
	if ps.meshOf != snap {
		ps.meshOf, ps.mesh = snap, meshProblems(snap)
	}
	found := slices.Clone(ps.mesh)
	if ps.configVersion == snap.ConfigVersion { // else found for other config
		for _, byKey := range ps.found {
			found = slices.AppendSeq(found, maps.Values(byKey))
		}
	}
	ps.mu.Unlock()
	out := map[string]map[string]proxyPushStatus{}
	add := func(p model.Problem) {
		if out[p.Metric] == nil {
			out[p.Metric] = map[string]proxyPushStatus{}
		}
		out[p.Metric][p.Key] = proxyPushStatus{Proxy: p.Proxy, Message: p.Message}
	}
	for _, p := range found {
		add(p)
	}
	for _, p := range proxies {
		if ep := snap.ProxyEndpoint(p); ep != nil && ep.GetHealth() == discoveryv1.Health_UNHEALTHY {
			add(model.Problem{Metric: model.MetricEndpointNotReady, Key: p.ID, Proxy: p.ID})
		}
	}
	return out
}

// meshProblems are the problems of snap as a whole, which istiod finds building its push
// context and endpoints, whoever asks.
func meshProblems(snap *model.Snapshot) []model.Problem {
	return append(duplicateSubsets(snap), clustersWithoutInstances(snap)...)
}

// duplicateSubsets: DestinationRules of one host that istiod merges (same namespace, same
// exportTo, no or the same workload selector) and that name a subset twice. Sailplane applies
// the oldest rule alone; istiod merges the others' new subsets in.
func duplicateSubsets(snap *model.Snapshot) []model.Problem {
	type group struct{ ns, host, exportTo, selector string }
	subsets := map[group]map[string]bool{}
	var out []model.Problem
	for _, dr := range snap.DestinationRules {
		host := model.ResolveHost(dr.Spec.GetHost(), dr.Namespace)
		g := group{ns: dr.Namespace, host: host, exportTo: strings.Join(slices.Sorted(slices.Values(dr.Spec.GetExportTo())), ","),
			selector: fmt.Sprint(dr.Spec.GetWorkloadSelector().GetMatchLabels())}
		seen := subsets[g]
		if seen == nil {
			seen = map[string]bool{}
			subsets[g] = seen
		}
		// Within one rule, validation refuses a repeated name; across rules, later ones repeat.
		var names []string
		for _, ss := range dr.Spec.GetSubsets() {
			if seen[ss.GetName()] {
				out = append(out, model.Problem{Metric: model.MetricDestRuleSubsets, Key: host, Message: fmt.Sprintf(
					"Duplicate subset %s found while merging destination rules for %s", ss.GetName(), host)})
			}
			names = append(names, ss.GetName())
		}
		for _, n := range names {
			seen[n] = true
		}
	}
	return out
}

// clustersWithoutInstances: the EDS clusters (of services resolved by their endpoints) whose
// load assignment is empty: no healthy endpoint, or none in the subset.
func clustersWithoutInstances(snap *model.Snapshot) []model.Problem {
	binds := snap.Bindings(nil)
	var out []model.Problem
	for _, h := range snap.Hostnames() {
		svc := snap.Services[h]
		if svc.Spec.GetResolution() != discoveryv1.Resolution_STATIC {
			continue
		}
		var empty []string // subsets ("" for the whole service) without an instance
		for _, ss := range append([]*networking.Subset{nil}, translate.Subsets(specOf(binds.DestinationRule(h)))...) {
			if !slices.ContainsFunc(svc.Endpoints, func(ep *discoveryv1.Endpoint) bool { return translate.Balanced(ep, ss) }) {
				empty = append(empty, ss.GetName())
			}
		}
		for _, port := range svc.Spec.GetPorts() {
			for _, subset := range empty {
				if port.GetNumber() != 0 {
					out = append(out, model.Problem{Metric: model.MetricEDSNoInstances, Key: translate.ClusterName(port.GetNumber(), subset, h)})
				}
			}
		}
	}
	return out
}

func specOf(dr *model.Config[*networking.DestinationRule]) *networking.DestinationRule {
	if dr == nil {
		return nil
	}
	return dr.Spec
}

// servePushStatus is istiod's /debug/push_status: the push status by metric, then key.
func (s *Server) servePushStatus(w http.ResponseWriter, r *http.Request) {
	monitoring.WriteJSON(w, r, s.pushStatus())
}

// pushStatus is the push status of the served snapshot and the proxies connected.
func (s *Server) pushStatus() map[string]map[string]proxyPushStatus {
	proxies := s.xds.ConnectedProxies()
	out := s.problems.status(s.servedSnapshot(), proxies)
	if s.secrets != nil {
		ids := make([]string, len(proxies))
		for i, p := range proxies {
			ids[i] = p.ID
		}
		for _, p := range s.secrets.Problems(ids) {
			if out[p.Metric] == nil {
				out[p.Metric] = map[string]proxyPushStatus{}
			}
			out[p.Metric][p.Key] = proxyPushStatus{Proxy: p.Proxy, Message: p.Message}
		}
	}
	return out
}

// registerPushStatusGauges exports each push status metric as istiod does: a gauge of how many
// keys it has. pilot_virt_services counts the VirtualServices served.
func (s *Server) registerPushStatusGauges(mp metric.MeterProvider) error {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(xds.MeterName)
	var gauges []metric.Observable
	byName := map[string]metric.Int64ObservableGauge{}
	var errs []error
	for _, m := range pushStatusMetrics {
		g, err := meter.Int64ObservableGauge(m.name, metric.WithDescription(m.help))
		errs = append(errs, err)
		byName[m.name] = g
		gauges = append(gauges, g)
	}
	virtServices, err := meter.Int64ObservableGauge("pilot_virt_services", metric.WithDescription("Total virtual services known to pilot."))
	errs = append(errs, err)
	gauges = append(gauges, virtServices)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		status := s.pushStatus()
		for _, name := range slices.Sorted(maps.Keys(byName)) {
			o.ObserveInt64(byName[name], int64(len(status[name])))
		}
		o.ObserveInt64(virtServices, int64(len(s.servedSnapshot().VirtualServices)))
		return nil
	}, gauges...)
	return err
}
