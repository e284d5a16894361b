package xdsdiff

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// The type URLs of the four xDS resource types.
const (
	ClusterType  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	EndpointType = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
	ListenerType = "type.googleapis.com/envoy.config.listener.v3.Listener"
	RouteType    = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
)

// Snapshot is what one control plane sent one node: every resource, by type URL.
type Snapshot map[string][]*anypb.Any

// Difference is one property on which istiod and Sailplane disagree. Case and Node are the
// caller's (Compare leaves them empty). Path is empty when a whole resource is on one side only.
// A value is "<absent>" on the side that does not set the property (Envoy's default applies).
type Difference struct{ Case, Node, Type, Resource, Path, Istiod, Ours string }

// String is one readable block, for test logs.
func (d Difference) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "case %s, node %s\n", or(d.Case, "-"), or(d.Node, "-"))
	fmt.Fprintf(&b, "  %s %s", d.Type, d.Resource)
	if d.Path != "" {
		fmt.Fprintf(&b, " %s", d.Path)
	}
	fmt.Fprintf(&b, "\n  istiod: %s\n  ours:   %s\n", indent(d.Istiod), indent(d.Ours))
	return b.String()
}

func or(s, dflt string) string {
	if s == "" {
		return dflt
	}
	return s
}

func indent(s string) string { return strings.ReplaceAll(s, "\n", "\n          ") }

// Stats says how much was compared: resources (of both sides, counted once) and leaf properties.
type Stats struct{ Resources, Properties int }

// Compare projects both snapshots and returns their differences, sorted by type, resource and
// path. It fails only on a resource that cannot be decoded or two resources of one type with
// the same name.
func Compare(istiod, ours Snapshot) ([]Difference, Stats, error) {
	is, err := decode("istiod", istiod)
	if err != nil {
		return nil, Stats{}, err
	}
	us, err := decode("ours", ours)
	if err != nil {
		return nil, Stats{}, err
	}
	c := &comparison{}
	c.compareTrees("CDS", projectAll(is.clusters), projectAll(us.clusters))
	c.compareEndpoints(is, us)
	il, ul := is.projectListeners(), us.projectListeners()
	c.compareTrees("LDS", il.trees, ul.trees)
	c.compareRoutes(is, us, il.refs, ul.refs)
	for _, t := range unionKeys(toAny(is.other), toAny(us.other)) {
		c.compareByName(t, is.other[t], us.other[t])
	}
	// By type (CDS, EDS, LDS, RDS sort that way), then resource; within a resource the walk's
	// order (sorted keys) is kept.
	sort.SliceStable(c.diffs, func(i, j int) bool {
		a, b := c.diffs[i], c.diffs[j]
		return a.Type < b.Type || a.Type == b.Type && a.Resource < b.Resource
	})
	return c.diffs, Stats{Resources: c.resources, Properties: c.d.leaves}, nil
}

type comparison struct {
	diffs     []Difference
	resources int
	d         differ
}

func (c *comparison) compareTrees(typ string, a, b map[string]any) {
	for _, name := range unionKeys(a, b) {
		c.compare(typ, name, a[name], b[name])
	}
}

func (c *comparison) compareByName(typ string, a, b map[string]proto.Message) {
	c.compareTrees(typ, projectAll(a), projectAll(b))
}

func projectAll[M proto.Message](ms map[string]M) map[string]any {
	out := make(map[string]any, len(ms))
	for n, m := range ms {
		out[n] = (&projector{}).project("", m)
	}
	return out
}

// compare diffs one resource; one missing is a single Difference with an empty path.
func (c *comparison) compare(typ, name string, a, b any) {
	if a == nil && b == nil {
		return // a reference neither side can follow: nothing to compare
	}
	c.resources++
	if a == nil || b == nil {
		c.d.leaves += countLeaves(a) + countLeaves(b)
		c.diffs = append(c.diffs, Difference{Type: typ, Resource: name, Istiod: presence(a), Ours: presence(b)})
		return
	}
	c.d.emit = func(path, x, y string) {
		c.diffs = append(c.diffs, Difference{Type: typ, Resource: name, Path: path, Istiod: x, Ours: y})
	}
	c.d.diff("", a, b)
}

func presence(v any) string {
	if v == nil {
		return absent
	}
	if n := countLeaves(v); n != 1 {
		return fmt.Sprintf("<present: %d properties>", n)
	}
	return "<present: 1 property>"
}

// compareEndpoints follows each cluster to its load assignment (EDS service name, or the
// cluster's own name), so endpoints are compared under the cluster's name whatever the
// assignment is called. Assignments no cluster uses are compared by their own names.
func (c *comparison) compareEndpoints(is, us *side) {
	ia, ib := is.assignments(), us.assignments()
	for _, name := range unionKeys(toAny(ia.used), toAny(ib.used)) {
		if a, b := ia.used[name], ib.used[name]; a != nil || b != nil {
			c.compare("EDS", name, projectCLA(a), projectCLA(b))
		}
	}
	c.compareTrees("EDS", projectAll(ia.unused), projectAll(ib.unused))
}

func projectCLA(m *endpointv3.ClusterLoadAssignment) any {
	if m == nil {
		return nil
	}
	return (&projector{}).project("", m)
}

type assignments struct {
	used   map[string]*endpointv3.ClusterLoadAssignment // by the name of the EDS cluster using it; nil if missing
	unused map[string]*endpointv3.ClusterLoadAssignment
}

func (s *side) assignments() assignments {
	a := assignments{used: map[string]*endpointv3.ClusterLoadAssignment{}, unused: maps.Clone(s.endpoints)}
	for n, cl := range s.clusters {
		if cl.GetType() != clusterv3.Cluster_EDS {
			continue
		}
		ref := cl.GetEdsClusterConfig().GetServiceName()
		if ref == "" {
			ref = n
		}
		a.used[n] = s.endpoints[ref] // nil if missing
		delete(a.unused, ref)
	}
	return a
}

type projectedListeners struct {
	trees map[string]any
	refs  map[string]routeRef // by listener name + path of the HTTP connection manager
}

func (s *side) projectListeners() projectedListeners {
	out := projectedListeners{trees: map[string]any{}, refs: map[string]routeRef{}}
	for n, m := range s.listeners {
		p := &projector{refs: map[string]routeRef{}}
		out.trees[n] = p.project("", m)
		for path, ref := range p.refs {
			out.refs[n+" "+path] = ref
		}
	}
	return out
}

// compareRoutes compares route configurations as reached from the connection managers that use
// them, so neither their names nor RDS-versus-inline matter: at each place both sides have a
// connection manager, the two route configurations are compared, under istiod's name. Route
// configurations no connection manager reaches are compared by name.
func (c *comparison) compareRoutes(is, us *side, ia, ib map[string]routeRef) {
	type pair struct{ a, b string }
	seen := map[pair]bool{}
	usedA, usedB := map[string]bool{}, map[string]bool{}
	for _, site := range unionKeys(toAny(ia), nil) {
		ra := ia[site]
		rb, ok := ib[site]
		if !ok {
			continue // the listener diff already shows the missing connection manager
		}
		na, nb := refName(ra, site), refName(rb, site)
		usedA[ra.rds], usedB[rb.rds] = true, true
		if seen[pair{na, nb}] {
			continue
		}
		seen[pair{na, nb}] = true
		c.compare("RDS", na, is.route(ra), us.route(rb))
	}
	c.compareTrees("RDS", projectAll(unused(is.routes, usedA)), projectAll(unused(us.routes, usedB)))
}

func unused[M any](ms map[string]M, used map[string]bool) map[string]M {
	out := map[string]M{}
	for n, m := range ms {
		if !used[n] {
			out[n] = m
		}
	}
	return out
}

// refName names a route configuration in reports: its RDS name, or where it is inlined.
func refName(r routeRef, site string) string {
	if r.inline != nil {
		return "inline in " + site
	}
	return r.rds
}

func (s *side) route(r routeRef) any {
	if r.inline != nil {
		return (&projector{}).project("", r.inline)
	}
	if m, ok := s.routes[r.rds]; ok {
		return (&projector{}).project("", m)
	}
	return nil
}

// side is one snapshot, decoded and indexed by resource name.
type side struct {
	clusters  map[string]*clusterv3.Cluster
	endpoints map[string]*endpointv3.ClusterLoadAssignment
	listeners map[string]*listenerv3.Listener
	routes    map[string]*routev3.RouteConfiguration
	other     map[string]map[string]proto.Message // by type URL
}

func decode(who string, s Snapshot) (*side, error) {
	d := &side{clusters: map[string]*clusterv3.Cluster{}, endpoints: map[string]*endpointv3.ClusterLoadAssignment{},
		listeners: map[string]*listenerv3.Listener{}, routes: map[string]*routev3.RouteConfiguration{},
		other: map[string]map[string]proto.Message{}}
	for _, url := range slices.Sorted(maps.Keys(s)) {
		for i, a := range s[url] {
			if a.GetTypeUrl() != url {
				return nil, fmt.Errorf("%s: %s resource %d is a %s", who, url, i, a.GetTypeUrl())
			}
			m, err := a.UnmarshalNew()
			if err != nil {
				return nil, fmt.Errorf("%s: %s resource %d: %w", who, url, i, err)
			}
			if name, ok := d.add(url, m); !ok {
				return nil, fmt.Errorf("%s: %s: two resources named %q", who, url, name)
			}
		}
	}
	return d, nil
}

// add indexes a resource by the name it is known by (a load assignment's is its cluster_name);
// false if the name is taken.
func (d *side) add(url string, m proto.Message) (string, bool) {
	switch m := m.(type) {
	case *clusterv3.Cluster:
		return m.GetName(), put(d.clusters, m.GetName(), m)
	case *endpointv3.ClusterLoadAssignment:
		return m.GetClusterName(), put(d.endpoints, m.GetClusterName(), m)
	case *listenerv3.Listener:
		return m.GetName(), put(d.listeners, m.GetName(), m)
	case *routev3.RouteConfiguration:
		return m.GetName(), put(d.routes, m.GetName(), m)
	}
	if d.other[url] == nil {
		d.other[url] = map[string]proto.Message{}
	}
	name := ""
	if fd := m.ProtoReflect().Descriptor().Fields().ByName("name"); fd != nil && fd.Kind() == protoreflect.StringKind && !fd.IsList() {
		name = m.ProtoReflect().Get(fd).String()
	}
	return name, put(d.other[url], name, m)
}

func put[M any](ms map[string]M, name string, m M) bool {
	if _, dup := ms[name]; dup {
		return false
	}
	ms[name] = m
	return true
}

func toAny[V any](m map[string]V) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
