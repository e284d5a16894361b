package conformance

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"sigs.k8s.io/gateway-api/conformance/utils/roundtripper"

	"sailplane.dev/tools/xdsdiff"
	"sailplane.dev/tools/xdssim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo answers like the suite's echo backend: the request it saw, as JSON, and its name.
func echo(t *testing.T, name string) (string, uint32) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(roundtripper.CapturedRequest{
			Path: r.URL.RequestURI(), Host: r.Host, Method: r.Method, Protocol: r.Proto, Headers: r.Header, Pod: name})
	}))
	t.Cleanup(srv.Close)
	h, p, _ := net.SplitHostPort(srv.Listener.Addr().String())
	n, _ := strconv.Atoi(p)
	return h, uint32(n)
}

func addr(ip string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port}}}}
}

func edsCluster(name string) *clusterv3.Cluster {
	return &clusterv3.Cluster{Name: name, ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{ServiceName: name}}
}

func cla(name, ip string, port uint32) *endpointv3.ClusterLoadAssignment {
	return &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
		LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: addr(ip, port)}}}}}}}
}

func gatewaySnapshot(t *testing.T) xdsdiff.Snapshot {
	ipA, portA := echo(t, "a")
	ipB, portB := echo(t, "b")
	route := func(prefix string, action *routev3.Route) *routev3.Route {
		action.Match = &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: prefix}}
		return action
	}
	fwd := func(c string) *routev3.Route {
		return &routev3.Route{Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: c}}}}
	}
	rewrite := fwd("a")
	rewrite.GetRoute().PrefixRewrite = "/b"
	split := &routev3.Route{Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_WeightedClusters{
		WeightedClusters: &routev3.WeightedCluster{Clusters: []*routev3.WeightedCluster_ClusterWeight{
			{Name: "a", Weight: wrapperspb.UInt32(1)}, {Name: "b", Weight: wrapperspb.UInt32(1)}}}}}}}
	redirect := &routev3.Route{Action: &routev3.Route_Redirect{Redirect: &routev3.RedirectAction{
		PathRewriteSpecifier: &routev3.RedirectAction_PathRedirect{PathRedirect: "/target"}, ResponseCode: routev3.RedirectAction_FOUND}}}
	rc := &routev3.RouteConfiguration{Name: "http.80", IgnorePortInHostMatching: true, VirtualHosts: []*routev3.VirtualHost{{
		Name: "example", Domains: []string{"example.com"}, Routes: []*routev3.Route{
			route("/a", rewrite), route("/split", split), route("/redirect", redirect), route("/target", fwd("b")),
		}}}}
	hcm := &hcmv3.HttpConnectionManager{RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{RouteConfigName: "http.80"}}}
	l := &listenerv3.Listener{Name: "0.0.0.0_80", Address: addr("0.0.0.0", 80), FilterChains: []*listenerv3.FilterChain{{
		Filters: []*listenerv3.Filter{{Name: "envoy.filters.network.http_connection_manager",
			ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, hcm)}}}}}}
	s := xdsdiff.Snapshot{}
	for _, m := range []proto.Message{l, rc, edsCluster("a"), edsCluster("b"), cla("a", ipA, portA), cla("b", ipB, portB)} {
		a := mustAny(t, m)
		s[a.TypeUrl] = append(s[a.TypeUrl], a)
	}
	return s
}

func mustAny(t *testing.T, m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestCaptureRoundTrip(t *testing.T) {
	snap := gatewaySnapshot(t)
	const gw = "198.18.0.1:80" // only simulated: nothing dials it
	fetches := 0
	rt := &RoundTripper{Fetch: func(_ context.Context, a string) (xdsdiff.Snapshot, error) {
		if a != gw {
			return nil, errors.New("unknown gateway " + a)
		}
		fetches++
		return snap, nil
	}}
	do := func(t *testing.T, path string, unfollow bool) (*roundtripper.CapturedRequest, *roundtripper.CapturedResponse) {
		t.Helper()
		creq, cres, err := rt.CaptureRoundTrip(roundtripper.Request{T: t, URL: url.URL{Scheme: "http", Host: gw, Path: path},
			Host: "example.com", UnfollowRedirect: unfollow, Headers: map[string][]string{"X-Test": {"1", "2"}}})
		if err != nil {
			t.Fatal(err)
		}
		return creq, cres
	}
	t.Run("rewritten request reaches the backend", func(t *testing.T) {
		creq, cres := do(t, "/a/x", true)
		if cres.StatusCode != 200 || creq.Path != "/b/x" || creq.Host != "example.com" || creq.Pod != "a" {
			t.Errorf("got %d %+v", cres.StatusCode, creq)
		}
		if got := creq.Headers["X-Test"]; len(got) != 1 || got[0] != "1" {
			t.Errorf("X-Test = %v, want the first value only", got)
		}
	})
	t.Run("redirect not followed", func(t *testing.T) {
		_, cres := do(t, "/redirect", true)
		if cres.StatusCode != 302 || cres.RedirectRequest == nil || cres.RedirectRequest.Path != "/target" || cres.RedirectRequest.Host != "example.com" {
			t.Errorf("got %d %+v", cres.StatusCode, cres.RedirectRequest)
		}
	})
	t.Run("redirect followed through the gateway", func(t *testing.T) {
		creq, cres := do(t, "/redirect", false)
		if cres.StatusCode != 200 || creq.Pod != "b" || creq.Path != "/target" {
			t.Errorf("got %d %+v", cres.StatusCode, creq)
		}
	})
	t.Run("no route is 404", func(t *testing.T) {
		if _, cres := do(t, "/nothing", true); cres.StatusCode != 404 {
			t.Errorf("status %d, want 404", cres.StatusCode)
		}
	})
	t.Run("weights spread the requests", func(t *testing.T) {
		seen := map[string]int{}
		for range 64 {
			creq, _ := do(t, "/split", true)
			seen[creq.Pod]++
		}
		if seen["a"] == 0 || seen["b"] == 0 {
			t.Errorf("backends seen %v, want both", seen)
		}
	})
	t.Run("unknown gateway", func(t *testing.T) {
		if _, _, err := rt.CaptureRoundTrip(roundtripper.Request{T: t, URL: url.URL{Scheme: "http", Host: "198.18.0.2:80", Path: "/"}}); err == nil {
			t.Error("no error for a gateway the control plane does not know")
		}
	})
	if fetches == 0 || fetches > 10 {
		t.Errorf("%d fetches, want a few (cached)", fetches)
	}
}

// TestPassthrough: a TLS chain picked by SNI whose tcp_proxy goes to a TLS backend; the
// client's handshake is with the backend, whose certificate is verified and reported.
func TestPassthrough(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(roundtripper.CapturedRequest{Path: r.URL.RequestURI(), Host: r.Host, Pod: "tls-backend"})
	}))
	defer srv.Close()
	h, p, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(p)
	tp := &tcpv3.TcpProxy{StatPrefix: "tls", ClusterSpecifier: &tcpv3.TcpProxy_Cluster{Cluster: "tls-be"}}
	l := &listenerv3.Listener{
		Name: "0.0.0.0_443", Address: addr("0.0.0.0", 443),
		ListenerFilters: []*listenerv3.ListenerFilter{{Name: "envoy.filters.listener.tls_inspector"}},
		FilterChains: []*listenerv3.FilterChain{{
			FilterChainMatch: &listenerv3.FilterChainMatch{ServerNames: []string{"example.com"}},
			Filters: []*listenerv3.Filter{{Name: "envoy.filters.network.tcp_proxy",
				ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: mustAny(t, tp)}}},
		}},
	}
	snap := xdsdiff.Snapshot{}
	for _, m := range []proto.Message{l, edsCluster("tls-be"), cla("tls-be", h, uint32(port))} {
		a := mustAny(t, m)
		snap[a.TypeUrl] = append(snap[a.TypeUrl], a)
	}
	rt := &RoundTripper{Fetch: func(context.Context, string) (xdsdiff.Snapshot, error) { return snap, nil }}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	req := func(sni string) roundtripper.Request {
		return roundtripper.Request{T: t, URL: url.URL{Scheme: "https", Host: "198.18.0.1:443", Path: "/p"}, Host: sni,
			Protocol: roundtripper.HTTPSProtocol, ServerName: sni, ServerCertificate: certPEM, UnfollowRedirect: true}
	}
	creq, cres, err := rt.CaptureRoundTrip(req("example.com"))
	if err != nil {
		t.Fatal(err)
	}
	if cres.StatusCode != 200 || creq.Pod != "tls-backend" || creq.Path != "/p" || len(cres.PeerCertificates) == 0 {
		t.Errorf("got %d %+v, %d peer certificates", cres.StatusCode, creq, len(cres.PeerCertificates))
	}
	if _, _, err := rt.CaptureRoundTrip(req("other.example.com")); !errors.Is(err, xdssim.ErrNoFilterChain) {
		t.Errorf("unknown SNI: err = %v, want ErrNoFilterChain", err)
	}
}
