// Package xdsdiff compares, semantically, the xDS resources two control planes send one node:
// istiod's (the reference) and Sailplane's. It is the core of the differential e2e tests.
//
// Each resource is projected onto a tree of plain values, then the two trees are diffed; a
// difference names its resource and a path such as
// "filter_chains[port=8080 sni=foo.com].filters[tcp_proxy].cluster".
//
// Identity. Resources are keyed by name: Istio's names are what users see and what Sailplane
// reproduces (0.0.0.0_8080, virtualOutbound, virtualInbound, BlackHoleCluster,
// outbound|80|v1|reviews.default.svc.cluster.local, …). Within a resource, list items are keyed
// by what identifies them: filter chains by their match, endpoints by address:port, virtual
// hosts by name (host:port, allow_any, block_all, as istiod names them), routes by their match,
// filters by name (envoy.filters.<kind>. left out), weighted clusters by cluster name, circuit
// breaker thresholds by priority, transport socket matches by their match, SAN matchers by
// themselves. Where Envoy honours order (routes of a virtual host, HTTP, network and listener
// filters, transport socket matches) the order is compared on its own, reported at
// "<list> (order)", so one moved route is one difference. Lists of plain values are one leaf,
// sorted where they are sets to Envoy (domains; a chain match's SNI names, ALPN, CIDR ranges,
// source ports), as are comma-separated sets (retry_on, CORS methods and headers). Any other
// list is compared item by item, in order.
//
// References whose names are an internal choice are followed, not compared: a route
// configuration is compared as reached from the HTTP connection manager using it (by RDS name or
// inline; also from a proxyless gRPC API listener), under istiod's name; a load assignment
// through the EDS cluster using it (by service name or the cluster's own), under the cluster's
// name. Route configurations and load assignments nothing reaches are compared by name.
//
// Properties. Everything else a resource sets is compared, field by field: the discovery type,
// load balancing, timeouts, circuit breakers, outlier detection, HTTP protocol options,
// transport sockets (SNI, SANs, SDS secret names, validation context, ALPN, TLS parameters),
// static and DNS endpoints; per endpoint its locality, priority, weights, health and tlsMode
// (Envoy's defaults stated equal them left out: weight 1, empty locality, HEALTHY);
// listener addresses and flags, filter chain matches, filter configs (tcp_proxy clusters and
// weights, connection manager settings, RBAC policies as trees, downstream TLS); routes' match,
// action, timeouts, retries, mirrors, redirects, direct responses, header mutations and per-filter
// configs (fault, CORS, …). An Any is decoded with the global registry (the extensions Istio
// uses are linked in, see register.go) and shown as properties of what it configures:
// filters[tcp_proxy].cluster, not filters[tcp_proxy].typed_config.cluster. A TypedStruct is
// compared as the message it names. An Any of a type not registered is compared by type URL and
// a hash of its bytes, and reported as such. A raw_buffer transport socket equals none. A
// property one side does not set is "<absent>" there (Envoy's default applies).
//
// Left out as noise: telemetry (stat_prefix and other stat names, access logs, tracing, route
// decorators; Istio's stats, metadata exchange and peer metadata filters, in filter lists and in
// per-filter configs), metadata of clusters, listeners, chains, virtual hosts and routes (an
// endpoint's tlsMode is kept), names of generated internals (filter chains, route
// configurations, routes, transport sockets and their matches) and the followed references
// (EDS service names, RDS names). Versions and nonces are not part of a resource.
package xdsdiff
