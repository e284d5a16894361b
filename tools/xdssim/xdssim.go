package xdssim

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"

	"sailplane.dev/tools/xdsdiff"
)

// Protocol is what the client speaks on the connection (inside TLS when Request.TLS is set).
type Protocol string

// The protocols a Request can use. GRPC is HTTP/2 with content-type application/grpc.
const (
	HTTP1 Protocol = "HTTP/1.1"
	HTTP2 Protocol = "HTTP/2"
	GRPC  Protocol = "gRPC"
	TCP   Protocol = "TCP"
)

// Request is one client request, as the proxy sees it arrive.
type Request struct {
	// Port and DestinationIP are where the connection is addressed (the original destination
	// for captured traffic). An empty DestinationIP matches only wildcard listeners and chains
	// without destination ranges.
	Port uint32 `json:"port,omitempty"`
	// ListenerPort is the port the connection was captured to when it is not Port: 15006 for
	// inbound traffic (the chain then matches on Port, the original destination), 15001 for
	// outbound. Zero: the listener bound to Port, else the use_original_dst listener.
	ListenerPort  uint32   `json:"listenerPort,omitempty"`
	DestinationIP string   `json:"destinationIP,omitempty"`
	SourceIP      string   `json:"sourceIP,omitempty"`
	Protocol      Protocol `json:"protocol,omitempty"`
	// TLS: the client opens TLS with SNI and ALPN (ALPN defaults to h2 for HTTP/2 and gRPC,
	// http/1.1 for HTTP/1.1, none for TCP).
	TLS  bool     `json:"tls,omitempty"`
	SNI  string   `json:"sni,omitempty"`
	ALPN []string `json:"alpn,omitempty"`
	// HTTP only. Host is the authority (may carry a port); Path includes the query.
	Host    string      `json:"host,omitempty"`
	Method  string      `json:"method,omitempty"`
	Path    string      `json:"path,omitempty"`
	Headers http.Header `json:"headers,omitempty"`
	// Pick chooses among weighted clusters and endpoints: Envoy draws a random number; the
	// simulation uses Pick (taken modulo the total weight, or the number of endpoints), so a
	// test is deterministic by default (0: the first) and can sweep or randomise.
	Pick uint64 `json:"pick,omitempty"`
}

// Action is what the matched route does.
type Action string

// The route actions.
const (
	Forward        Action = "forward"
	Redirect       Action = "redirect"
	DirectResponse Action = "direct_response"
)

// Result is what the proxy does with a Request.
type Result struct {
	Listener         string            `json:"listener"`
	FilterChain      string            `json:"filterChain"` // its name, else "#<index>", or "default"
	DownstreamTLS    *DownstreamTLS    `json:"downstreamTLS,omitempty"`
	NetworkFilter    string            `json:"networkFilter"`
	RouteConfig      string            `json:"routeConfig,omitempty"` // RDS name, or "<inline>"
	VirtualHost      string            `json:"virtualHost,omitempty"`
	Route            string            `json:"route,omitempty"` // its name, else "#<index>"
	Action           Action            `json:"action"`
	Redirect         *RedirectResult   `json:"redirect,omitempty"`
	Direct           *DirectResult     `json:"directResponse,omitempty"`
	Cluster          string            `json:"cluster,omitempty"`
	WeightedClusters []WeightedCluster `json:"weightedClusters,omitempty"`
	// Upstream is the request as Envoy sends it to the cluster (HTTP only).
	Upstream *UpstreamRequest `json:"upstream,omitempty"`
	// ResponseHeaders are the mutations Envoy applies to the response, in order.
	ResponseHeaders []HeaderOp `json:"responseHeaders,omitempty"`
	Timeout         *Duration  `json:"timeout,omitempty"`
	IdleTimeout     *Duration  `json:"idleTimeout,omitempty"`
	Retry           *Retry     `json:"retry,omitempty"`
	Mirrors         []Mirror   `json:"mirrors,omitempty"`
	ClusterType     string     `json:"clusterType,omitempty"`
	// Endpoints are the healthy endpoints of the priority that takes traffic; Endpoint is the
	// one picked.
	Endpoints        []string     `json:"endpoints,omitempty"`
	Endpoint         string       `json:"endpoint,omitempty"`
	UpstreamTLS      *UpstreamTLS `json:"upstreamTLS,omitempty"`
	UpstreamProtocol Protocol     `json:"upstreamProtocol,omitempty"`
	// PerFilterConfig names the HTTP filters the route or virtual host configures
	// (typed_per_filter_config: faults, CORS, …); their effect is not simulated.
	PerFilterConfig []string `json:"perFilterConfig,omitempty"`

	endpointHost string // for auto_host_rewrite
	downstreamH2 bool   // for upstreams that use the downstream protocol
}

// DownstreamTLS is the TLS the filter chain terminates.
type DownstreamTLS struct {
	Certificates      []string `json:"certificates,omitempty"` // SDS secret names or "<inline>"
	ALPN              []string `json:"alpn,omitempty"`
	RequireClientCert bool     `json:"requireClientCert,omitempty"`
}

// UpstreamTLS is the TLS Envoy opens to the endpoint.
type UpstreamTLS struct {
	SNI  string   `json:"sni,omitempty"`
	ALPN []string `json:"alpn,omitempty"`
	// Match names the transport_socket_matches entry used, if any.
	Match string `json:"match,omitempty"`
}

// RedirectResult is a redirect Envoy answers itself.
type RedirectResult struct {
	Status   int    `json:"status"`
	Location string `json:"location"`
}

// DirectResult is a response Envoy answers itself.
type DirectResult struct {
	Status int    `json:"status"`
	Body   string `json:"body,omitempty"`
}

// WeightedCluster is one of a route's (or tcp_proxy's) weighted clusters.
type WeightedCluster struct {
	Name   string `json:"name"`
	Weight uint32 `json:"weight"`
}

// UpstreamRequest is the HTTP request Envoy sends upstream.
type UpstreamRequest struct {
	Method  string      `json:"method"`
	Scheme  string      `json:"scheme"`
	Host    string      `json:"host"`
	Path    string      `json:"path"`
	Headers http.Header `json:"headers,omitempty"`
}

// HeaderOp is one header mutation: set (overwrite), append, add-if-absent, or remove.
type HeaderOp struct {
	Op    string `json:"op"` // "remove", "append", "set", "add_if_absent", "overwrite_if_exists"
	Name  string `json:"name"`
	Value string `json:"value,omitempty"`
	// KeepEmpty: Envoy drops a header whose value is empty unless keep_empty_value is set.
	KeepEmpty bool `json:"keepEmpty,omitempty"`
}

// Duration is a time.Duration that reads as "1.5s" in JSON and YAML.
type Duration time.Duration

// MarshalJSON writes the duration as Go's String.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Retry is the route's (or virtual host's) retry policy.
type Retry struct {
	RetryOn       string    `json:"retryOn,omitempty"`
	NumRetries    uint32    `json:"numRetries"`
	PerTryTimeout *Duration `json:"perTryTimeout,omitempty"`
}

// Mirror is a request mirror policy: the cluster copies are sent to, the share (percent),
// the endpoint the copy would go to (empty when the cluster has none), and the Host the copy
// carries (Envoy appends "-shadow" unless disable_shadow_host_suffix_append).
type Mirror struct {
	Cluster  string  `json:"cluster"`
	Percent  float64 `json:"percent"`
	Endpoint string  `json:"endpoint,omitempty"`
	Host     string  `json:"host,omitempty"`
}

// The failures a test tells apart. Each is returned wrapped in an *Error with the status and
// response flag Envoy would answer with (none for connection-level failures).
var (
	ErrNoListener        = errors.New("no listener")
	ErrNoFilterChain     = errors.New("no filter chain matched")
	ErrTLSMismatch       = errors.New("TLS mismatch") // plaintext to a TLS chain, or TLS to a plaintext HTTP chain
	ErrNoVirtualHost     = errors.New("no virtual host matched")
	ErrNoRoute           = errors.New("no route matched")
	ErrClusterNotFound   = errors.New("cluster not found")
	ErrNoHealthyUpstream = errors.New("no healthy endpoint")
	ErrUnsupported       = errors.New("not simulated")
	ErrInvalid           = errors.New("invalid config")
)

// Error is a simulation failure: Err is one of the sentinels, Status and Flag what Envoy
// answers (404 NR, 503 NC, 503 UH; 0 and "" when the connection is refused or reset), and
// Result what was decided before the failure.
type Error struct {
	Err    error
	Status int
	Flag   string
	Detail string
	Result *Result
}

func (e *Error) Error() string {
	s := e.Err.Error()
	if e.Status != 0 {
		s = fmt.Sprintf("%s (%d %s)", s, e.Status, e.Flag)
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

func fail(res *Result, err error, format string, args ...any) *Error {
	e := &Error{Err: err, Detail: fmt.Sprintf(format, args...), Result: res}
	switch err {
	case ErrNoVirtualHost, ErrNoRoute:
		e.Status, e.Flag = http.StatusNotFound, "NR"
	case ErrClusterNotFound:
		e.Status, e.Flag = http.StatusServiceUnavailable, "NC"
	case ErrNoHealthyUpstream:
		e.Status, e.Flag = http.StatusServiceUnavailable, "UH"
	}
	return e
}

// Simulator holds one proxy's decoded resources.
type Simulator struct {
	listeners []*listenerv3.Listener
	routes    map[string]*routev3.RouteConfiguration
	clusters  map[string]*clusterv3.Cluster
	endpoints map[string]*endpointv3.ClusterLoadAssignment
}

// New decodes a snapshot. It fails on a resource that does not decode or a duplicate name.
func New(snap xdsdiff.Snapshot) (*Simulator, error) {
	s := &Simulator{
		routes:    map[string]*routev3.RouteConfiguration{},
		clusters:  map[string]*clusterv3.Cluster{},
		endpoints: map[string]*endpointv3.ClusterLoadAssignment{},
	}
	for typeURL, anys := range snap {
		for i, a := range anys {
			var m proto.Message
			switch typeURL {
			case xdsdiff.ListenerType:
				m = &listenerv3.Listener{}
			case xdsdiff.RouteType:
				m = &routev3.RouteConfiguration{}
			case xdsdiff.ClusterType:
				m = &clusterv3.Cluster{}
			case xdsdiff.EndpointType:
				m = &endpointv3.ClusterLoadAssignment{}
			default:
				continue // secrets, NDS, …: not needed to route
			}
			if err := a.UnmarshalTo(m); err != nil {
				return nil, fmt.Errorf("%s #%d: %w", typeURL, i, err)
			}
			var dup bool
			switch r := m.(type) {
			case *listenerv3.Listener:
				s.listeners = append(s.listeners, r)
			case *routev3.RouteConfiguration:
				_, dup = s.routes[r.GetName()]
				s.routes[r.GetName()] = r
			case *clusterv3.Cluster:
				_, dup = s.clusters[r.GetName()]
				s.clusters[r.GetName()] = r
			case *endpointv3.ClusterLoadAssignment:
				_, dup = s.endpoints[r.GetClusterName()]
				s.endpoints[r.GetClusterName()] = r
			}
			if dup {
				return nil, fmt.Errorf("%s: two resources named %q", typeURL, nameOf(m))
			}
		}
	}
	return s, nil
}

func nameOf(m proto.Message) string {
	if c, ok := m.(*endpointv3.ClusterLoadAssignment); ok {
		return c.GetClusterName()
	}
	if n, ok := m.(interface{ GetName() string }); ok {
		return n.GetName()
	}
	return ""
}

// Simulate runs one request through the proxy. On failure the error is an *Error (errors.Is
// tells the kind; errors.As gives the status and the partial Result).
func (s *Simulator) Simulate(req Request) (*Result, error) {
	req = withDefaults(req)
	res := &Result{downstreamH2: req.Protocol == HTTP2 || req.Protocol == GRPC}
	lis, err := s.matchListener(req)
	if err != nil {
		return nil, fail(res, err, "port %d", req.Port)
	}
	res.Listener = lis.GetName()
	fc, name, err := matchFilterChain(lis, req)
	if err != nil {
		return nil, fail(res, err, "listener %s: %s", lis.GetName(), describeConn(req))
	}
	res.FilterChain = name
	if err := s.network(res, fc, req); err != nil {
		return nil, err
	}
	return res, nil
}

func withDefaults(req Request) Request {
	if req.Protocol == "" {
		req.Protocol = HTTP1
	}
	if req.Protocol != TCP {
		if req.Method == "" {
			req.Method = http.MethodGet
		}
		if req.Path == "" {
			req.Path = "/"
		}
	}
	if req.TLS && req.ALPN == nil {
		switch req.Protocol {
		case HTTP1:
			req.ALPN = []string{"http/1.1"}
		case HTTP2, GRPC:
			req.ALPN = []string{"h2"}
		}
	}
	// Header names are case-insensitive; keep them canonical so lookups and mutations meet.
	h := http.Header{}
	for k, vs := range req.Headers {
		for _, v := range vs {
			h.Add(k, v)
		}
	}
	req.Headers = h
	if req.Protocol == GRPC && req.Headers.Get("content-type") == "" {
		req.Headers.Set("content-type", "application/grpc")
	}
	return req
}

func describeConn(req Request) string {
	s := fmt.Sprintf("%s to %s:%d", req.Protocol, req.DestinationIP, req.Port)
	if req.TLS {
		s += fmt.Sprintf(" over TLS (SNI %q, ALPN %v)", req.SNI, req.ALPN)
	}
	return s
}
