// Package xdsdiff compares, semantically, the xDS resources two control planes send one node:
// istiod's (the reference) and Sailplane's. It is the core of the differential e2e tests.
//
// Each resource is projected onto a tree of plain values, then the trees are diffed. Lists are
// keyed by what identifies their items, so a path reads like
// "filter_chains[port=8080 sni=foo.com].filters[tcp_proxy].cluster":
//
//   - listeners and clusters by name (Istio's names are what users see: 0.0.0.0_8080,
//     virtualOutbound, outbound|80|v1|reviews.default.svc.cluster.local, BlackHoleCluster, …);
//   - filter chains by their match, endpoints by address:port, virtual hosts by name, weighted
//     clusters by cluster name, circuit breaker thresholds by priority;
//   - where Envoy honours order (routes of a virtual host, HTTP filters, network and listener
//     filters, transport socket matches) items are still keyed (routes by their match, filters by
//     name) and their order is compared on its own, reported at "<list> (order)";
//   - lists of plain values are one leaf, sorted where they are sets to Envoy (domains, SNI names,
//     ALPN of a chain match, CIDR ranges).
//
// References whose names are an internal choice are followed, not compared: a route
// configuration is compared as reached from the HTTP connection manager using it (by RDS name or
// inline), a load assignment through the EDS cluster using it, under the cluster's name.
//
// Everything else in a resource is compared, field by field, Any values decoded with the global
// registry (the extensions Istio uses are linked in; see register.go). A typed config is shown as
// properties of what it configures (filters[tcp_proxy].cluster). An Any of a type not
// registered is compared by type URL and a hash of its bytes, and reported as such.
//
// Left out as noise: telemetry (stat_prefix, access logs, tracing, route decorators, Istio's
// stats and metadata exchange filters), metadata (except an endpoint's tlsMode), the names of
// generated internals (filter chains, route configurations, routes, transport socket matches),
// and the references that are followed. Versions and nonces are not part of a resource.
package xdsdiff
