package translate

import (
	"maps"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"

	"sailplane.dev/services/xds-server/internal/model"
)

// WithDelegates is vs with each http route that delegates replaced by the delegate
// VirtualService's routes merged into it, as istiod does before building routes for Envoy and
// gRPC clients alike: the delegate (a VirtualService of snap without hosts, exported to vs's
// namespace) gives the routes, each match is the delegate's narrowed by the root's (a delegate
// match that no root match contains is a conflict, and drops that delegate route), and the
// root's settings fill what a delegate route leaves out. A delegate that is missing or not a
// delegate drops the root route. vs itself is never modified; destination hosts of delegate
// routes are resolved in the delegate's namespace.
func WithDelegates(snap *model.Snapshot, vs *model.Config[*networking.VirtualService],
	log interface{ Debug(string, ...any) }) *model.Config[*networking.VirtualService] {
	if !slices.ContainsFunc(vs.Spec.GetHttp(), func(hr *networking.HTTPRoute) bool { return hr.GetDelegate() != nil }) {
		return vs
	}
	spec := proto.CloneOf(vs.Spec)
	var routes []*networking.HTTPRoute
	for _, hr := range spec.GetHttp() {
		d := hr.GetDelegate()
		if d == nil {
			routes = append(routes, hr)
			continue
		}
		ns := d.GetNamespace()
		if ns == "" {
			ns = vs.Namespace
		}
		delegate := delegateVS(snap, ns, d.GetName(), vs.Namespace)
		if delegate == nil {
			log.Debug("skipping http route whose delegate VirtualService is missing, has hosts or is not exported to it",
				"virtualService", vs.Namespace+"/"+vs.Name, "delegate", ns+"/"+d.GetName())
			continue
		}
		for _, sub := range proto.CloneOf(delegate.Spec).GetHttp() {
			if sub.GetDelegate() != nil {
				continue // istiod supports one level of delegation
			}
			resolveRouteHosts(sub, ns)
			if merged := mergeDelegateRoute(hr, sub); merged != nil {
				routes = append(routes, merged)
			} else {
				log.Debug("skipping delegate http route whose matches conflict with the root's",
					"virtualService", vs.Namespace+"/"+vs.Name, "delegate", ns+"/"+d.GetName(), "route", sub.GetName())
			}
		}
	}
	spec.Http = routes
	out := *vs
	out.Spec = spec
	return &out
}

// delegateVS is the VirtualService ns/name of snap when it can be a delegate of a
// VirtualService in namespace viewer: it has no hosts and is exported there.
func delegateVS(snap *model.Snapshot, ns, name, viewer string) *model.Config[*networking.VirtualService] {
	for i := range snap.VirtualServices {
		vs := &snap.VirtualServices[i]
		if vs.Namespace != ns || vs.Name != name {
			continue
		}
		if len(vs.Spec.GetHosts()) > 0 ||
			!model.ExportedTo(ns, vs.Spec.GetExportTo(), snap.Mesh.GetDefaultVirtualServiceExportTo(), viewer) {
			return nil
		}
		return vs
	}
	return nil
}

// resolveRouteHosts writes a delegate route's short destination hosts as FQDNs of ns, where
// they were written, since the merged route is built in the root's namespace.
func resolveRouteHosts(hr *networking.HTTPRoute, ns string) {
	for _, rd := range hr.GetRoute() {
		if d := rd.GetDestination(); d != nil {
			d.Host = model.ResolveHost(d.GetHost(), ns)
		}
	}
	if m := hr.GetMirror(); m != nil {
		m.Host = model.ResolveHost(m.GetHost(), ns)
	}
	for _, m := range hr.GetMirrors() {
		if d := m.GetDestination(); d != nil {
			d.Host = model.ResolveHost(d.GetHost(), ns)
		}
	}
}

// mergeDelegateRoute merges root into delegate (a copy it may modify); nil on a match conflict.
func mergeDelegateRoute(root, delegate *networking.HTTPRoute) *networking.HTTPRoute {
	matches, ok := mergeDelegateMatches(root.GetMatch(), delegate.GetMatch())
	if !ok {
		return nil
	}
	delegate.Match = matches
	switch {
	case delegate.Name == "":
		delegate.Name = root.GetName()
	case root.GetName() != "":
		delegate.Name = root.GetName() + "-" + delegate.Name
	}
	if delegate.Rewrite == nil {
		delegate.Rewrite = root.GetRewrite()
	}
	if delegate.DirectResponse == nil {
		delegate.DirectResponse = root.GetDirectResponse()
	}
	if delegate.Timeout == nil {
		delegate.Timeout = root.GetTimeout()
	}
	if delegate.Retries == nil {
		delegate.Retries = root.GetRetries()
	}
	if delegate.Fault == nil {
		delegate.Fault = root.GetFault()
	}
	if delegate.Mirror == nil {
		delegate.Mirror = root.GetMirror()
	}
	if delegate.MirrorPercent == nil { //nolint:staticcheck // still honoured by Istio
		delegate.MirrorPercent = root.GetMirrorPercent() //nolint:staticcheck
	}
	if delegate.MirrorPercentage == nil {
		delegate.MirrorPercentage = root.GetMirrorPercentage()
	}
	if delegate.CorsPolicy == nil {
		delegate.CorsPolicy = root.GetCorsPolicy()
	}
	if delegate.Mirrors == nil {
		delegate.Mirrors = root.GetMirrors()
	}
	if delegate.Headers == nil {
		delegate.Headers = root.GetHeaders()
	}
	return delegate
}

// mergeDelegateMatches narrows each delegate match by every root match it does not conflict
// with; false when some delegate match fits no root match.
func mergeDelegateMatches(root, delegate []*networking.HTTPMatchRequest) ([]*networking.HTTPMatchRequest, bool) {
	if len(root) == 0 {
		return delegate, true
	}
	if len(delegate) == 0 {
		return root, true
	}
	var out []*networking.HTTPMatchRequest
	for _, leaf := range delegate {
		found := false
		for _, r := range root {
			if matchConflict(r, leaf) {
				continue
			}
			out = append(out, mergeMatch(r, leaf))
			found = true
		}
		if !found {
			return nil, false
		}
	}
	return out, len(out) > 0
}

func mergeMatch(root, leaf *networking.HTTPMatchRequest) *networking.HTTPMatchRequest {
	out := proto.CloneOf(leaf)
	switch {
	case out.Name == "":
		out.Name = root.GetName()
	case root.GetName() != "":
		out.Name = root.GetName() + "-" + out.Name
	}
	if out.Uri == nil {
		out.Uri = root.GetUri()
	}
	if out.Scheme == nil {
		out.Scheme = root.GetScheme()
	}
	if out.Method == nil {
		out.Method = root.GetMethod()
	}
	if out.Authority == nil {
		out.Authority = root.GetAuthority()
	}
	out.Headers = mergeMaps(root.GetHeaders(), leaf.GetHeaders())
	out.WithoutHeaders = mergeMaps(root.GetWithoutHeaders(), leaf.GetWithoutHeaders())
	out.QueryParams = mergeMaps(root.GetQueryParams(), leaf.GetQueryParams())
	out.SourceLabels = mergeMaps(root.GetSourceLabels(), leaf.GetSourceLabels())
	if out.Port == 0 {
		out.Port = root.GetPort()
	}
	if out.SourceNamespace == "" {
		out.SourceNamespace = root.GetSourceNamespace()
	}
	if len(out.Gateways) == 0 {
		out.Gateways = root.GetGateways()
	}
	if out.StatPrefix == "" {
		out.StatPrefix = root.GetStatPrefix()
	}
	return out
}

// mergeMaps is root's entries overridden by leaf's; nil when both are empty.
func mergeMaps[V any](root, leaf map[string]V) map[string]V {
	if len(root)+len(leaf) == 0 {
		return nil
	}
	out := maps.Clone(root)
	if out == nil {
		out = map[string]V{}
	}
	maps.Copy(out, leaf)
	return out
}

// matchConflict reports whether leaf asks for something root excludes, as istiod decides it.
func matchConflict(root, leaf *networking.HTTPMatchRequest) bool {
	pairs := [][2]*networking.StringMatch{{root.GetUri(), leaf.GetUri()}, {root.GetScheme(), leaf.GetScheme()},
		{root.GetMethod(), leaf.GetMethod()}, {root.GetAuthority(), leaf.GetAuthority()}}
	for _, p := range pairs {
		if stringMatchConflict(p[0], p[1]) {
			return true
		}
	}
	for k, v := range leaf.GetHeaders() {
		if stringMatchConflict(root.GetHeaders()[k], v) {
			return true
		}
	}
	for k, v := range leaf.GetWithoutHeaders() {
		if stringMatchConflict(root.GetWithoutHeaders()[k], v) {
			return true
		}
	}
	for k, v := range leaf.GetQueryParams() {
		if stringMatchConflict(root.GetQueryParams()[k], v) {
			return true
		}
	}
	if root.GetIgnoreUriCase() != leaf.GetIgnoreUriCase() {
		return true
	}
	if root.GetPort() > 0 && leaf.GetPort() > 0 && root.GetPort() != leaf.GetPort() {
		return true
	}
	if root.GetSourceNamespace() != "" && leaf.GetSourceNamespace() != root.GetSourceNamespace() {
		return true
	}
	for k, v := range leaf.GetSourceLabels() {
		if rv, ok := root.GetSourceLabels()[k]; ok && rv != v {
			return true
		}
	}
	if len(root.GetGateways()) > 0 && len(leaf.GetGateways()) > 0 {
		for _, g := range leaf.GetGateways() {
			if !slices.Contains(root.GetGateways(), g) {
				return true
			}
		}
	}
	return false
}

// stringMatchConflict: a regex on either side admits nothing else on the other; an exact root
// admits only the same exact; a prefix root admits a longer prefix or an exact it prefixes.
// Only a condition missing on one side never conflicts.
func stringMatchConflict(root, leaf *networking.StringMatch) bool {
	if root == nil || leaf == nil {
		return false
	}
	if root.GetRegex() != "" && (leaf.GetRegex() != "" || leaf.GetPrefix() != "" || leaf.GetExact() != "") {
		return true
	}
	if leaf.GetRegex() != "" && (root.GetRegex() != "" || root.GetPrefix() != "" || root.GetExact() != "") {
		return true
	}
	if exact := root.GetExact(); exact != "" {
		return leaf.GetPrefix() != "" || leaf.GetExact() != exact
	}
	if prefix := root.GetPrefix(); prefix != "" {
		if leaf.GetPrefix() != "" {
			return !strings.HasPrefix(leaf.GetPrefix(), prefix)
		}
		if leaf.GetExact() != "" {
			return !strings.HasPrefix(leaf.GetExact(), prefix)
		}
	}
	return true // as istiod: anything else (an empty match on either side) conflicts
}
