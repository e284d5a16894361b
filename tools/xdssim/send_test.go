package xdssim

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// backend echoes what it received in response headers.
func backend(t *testing.T, h2c bool) (*httptest.Server, string, uint32) {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Got-Path", r.URL.RequestURI())
		w.Header().Set("Got-Host", r.Host)
		w.Header().Set("Got-Proto", r.Proto)
		w.Header().Set("Got-X-Set", r.Header.Get("x-set"))
		w.Header().Set("Got-X-Gone", r.Header.Get("x-gone"))
		w.Header().Set("Server", "backend")
		w.Header().Set("X-Keep", "yes")
		_, _ = io.WriteString(w, "hello")
	}))
	if h2c {
		srv.Config.Protocols = &http.Protocols{}
		srv.Config.Protocols.SetHTTP1(true)
		srv.Config.Protocols.SetUnencryptedHTTP2(true)
	}
	srv.Start()
	t.Cleanup(srv.Close)
	host, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	return srv, host, uint32(p)
}

func TestForward(t *testing.T) {
	_, ip, port := backend(t, true)
	c := staticCluster("be", ip)
	c.LoadAssignment.Endpoints[0].LbEndpoints[0].GetEndpoint().Address = sockAddr(ip, port)
	h2 := staticCluster("be-h2", ip)
	h2.LoadAssignment.Endpoints[0].LbEndpoints[0].GetEndpoint().Address = sockAddr(ip, port)
	opts, _ := anypb.New(&httpv3.HttpProtocolOptions{UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{
		ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
			Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}}}}})
	h2.TypedExtensionProtocolOptions = map[string]*anypb.Any{httpProtocolOptions: opts}
	tlsC := staticCluster("be-tls", ip)
	tlsC.TransportSocket = &corev3.TransportSocket{Name: tlsSocket, ConfigType: &corev3.TransportSocket_TypedConfig{
		TypedConfig: mustAny(t, &tlsv3.UpstreamTlsContext{Sni: "be.example.com"})}}

	hv := func(k, v string, a corev3.HeaderValueOption_HeaderAppendAction) *corev3.HeaderValueOption {
		return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, Value: v}, AppendAction: a}
	}
	rewrite := prefixRoute("rewrite", "/old", "be")
	rewrite.GetRoute().PrefixRewrite = "/new"
	rewrite.GetRoute().HostRewriteSpecifier = &routev3.RouteAction_HostRewriteLiteral{HostRewriteLiteral: "rewritten.example.com"}
	rewrite.RequestHeadersToAdd = []*corev3.HeaderValueOption{hv("x-set", "route", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD)}
	rewrite.RequestHeadersToRemove = []string{"x-gone"}
	rewrite.ResponseHeadersToRemove = []string{"server"}
	rewrite.ResponseHeadersToAdd = []*corev3.HeaderValueOption{hv("x-resp", "1", corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD)}
	redirect := &routev3.Route{Name: "redirect", Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/go"}},
		Action: &routev3.Route_Redirect{Redirect: &routev3.RedirectAction{
			SchemeRewriteSpecifier: &routev3.RedirectAction_HttpsRedirect{HttpsRedirect: true},
			PathRewriteSpecifier:   &routev3.RedirectAction_PrefixRewrite{PrefixRewrite: "/gone"},
			ResponseCode:           routev3.RedirectAction_FOUND}}}
	vh := &routev3.VirtualHost{Name: "vh", Domains: []string{"*"}, Routes: []*routev3.Route{
		rewrite, redirect, prefixRoute("h2", "/h2", "be-h2"), prefixRoute("tls", "/tls", "be-tls")},
		// The virtual host's value is applied after the route's and wins.
		RequestHeadersToAdd: []*corev3.HeaderValueOption{hv("x-set", "vhost", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD)}}
	rc := &routev3.RouteConfiguration{VirtualHosts: []*routev3.VirtualHost{vh}}
	sim := simOf(t, httpListener(t, rc), c, h2, tlsC)
	f := &Forwarder{}
	ctx := context.Background()

	send := func(t *testing.T, req Request) *http.Response {
		t.Helper()
		res, err := sim.Simulate(req)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := f.Send(ctx, res, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	t.Run("rewrites and header mutations", func(t *testing.T) {
		resp := send(t, Request{Port: 80, Host: "orig.example.com", Path: "/old/x?q=1",
			Headers: http.Header{"X-Set": {"client"}, "X-Gone": {"secret"}}})
		want := map[string]string{"Got-Path": "/new/x?q=1", "Got-Host": "rewritten.example.com", "Got-X-Set": "vhost",
			"Got-X-Gone": "", "Server": "", "X-Resp": "1", "X-Keep": "yes", "Got-Proto": "HTTP/1.1"}
		for k, v := range want {
			if got := resp.Header.Get(k); got != v {
				t.Errorf("%s = %q, want %q", k, got, v)
			}
		}
	})
	t.Run("HTTP/2 upstream over h2c", func(t *testing.T) {
		if got := send(t, Request{Port: 80, Host: "h", Path: "/h2"}).Header.Get("Got-Proto"); got != "HTTP/2.0" {
			t.Errorf("proto %q, want HTTP/2.0", got)
		}
	})
	t.Run("redirect answered without a backend", func(t *testing.T) {
		resp := send(t, Request{Port: 80, Host: "h:80", Path: "/go/x?y"})
		if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "https://h/gone/x?y" || resp.Header.Get("Got-Path") != "" {
			t.Errorf("got %d %v", resp.StatusCode, resp.Header)
		}
	})
	t.Run("upstream TLS is refused, not sent in the clear", func(t *testing.T) {
		res, err := sim.Simulate(Request{Port: 80, Host: "h", Path: "/tls"})
		if err != nil {
			t.Fatal(err)
		}
		if res.UpstreamTLS == nil || res.UpstreamTLS.SNI != "be.example.com" {
			t.Errorf("upstream TLS %+v", res.UpstreamTLS)
		}
		if _, err := f.Send(ctx, res, nil); !errors.Is(err, ErrUpstreamTLS) {
			t.Errorf("err = %v, want ErrUpstreamTLS", err)
		}
	})
	t.Run("most_specific_header_mutations_wins", func(t *testing.T) {
		rc.MostSpecificHeaderMutationsWins = true
		defer func() { rc.MostSpecificHeaderMutationsWins = false }()
		sim := simOf(t, httpListener(t, rc), c)
		res, err := sim.Simulate(Request{Port: 80, Host: "h", Path: "/old"})
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Upstream.Headers.Get("x-set"); got != "route" {
			t.Errorf("x-set = %q, want the route's", got)
		}
	})
}

// TestApply covers the append actions and empty values.
func TestApply(t *testing.T) {
	h := http.Header{"A": {"1"}, "B": {"1"}, "C": {"1"}}
	Apply(h, []HeaderOp{
		{Op: "append", Name: "a", Value: "2"},
		{Op: "set", Name: "b", Value: "2"},
		{Op: "add_if_absent", Name: "c", Value: "2"},
		{Op: "add_if_absent", Name: "d", Value: "2"},
		{Op: "overwrite_if_exists", Name: "e", Value: "2"},
		{Op: "append", Name: "f", Value: ""},
		{Op: "append", Name: "g", Value: "", KeepEmpty: true},
		{Op: "remove", Name: "c"},
	})
	want := http.Header{"A": {"1", "2"}, "B": {"2"}, "D": {"2"}, "G": {""}}
	if len(h) != len(want) {
		t.Fatalf("got %v, want %v", h, want)
	}
	for k, v := range want {
		if got := h[k]; len(got) != len(v) || (len(v) > 0 && got[len(got)-1] != v[len(v)-1]) || (len(v) > 1 && got[0] != v[0]) {
			t.Errorf("%s = %v, want %v", k, got, v)
		}
	}
}

// TestTimeoutAndMirror: past the route timeout the answer is Envoy's 504; a mirror at 100%
// gets a copy with the -shadow host before the response returns.
func TestTimeoutAndMirror(t *testing.T) {
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // answers only once the client gives up
	}))
	defer slow.Close()
	mirrored := make(chan string, 1)
	shadow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { mirrored <- r.Host }))
	defer shadow.Close()
	_, ip, port := backend(t, false)
	cluster := func(name string, srv string) *clusterv3.Cluster {
		h, p, _ := net.SplitHostPort(srv)
		n, _ := strconv.Atoi(p)
		c := staticCluster(name, h)
		c.LoadAssignment.Endpoints[0].LbEndpoints[0].GetEndpoint().Address = sockAddr(h, uint32(n))
		return c
	}
	slowRoute := prefixRoute("slow", "/slow", "slow")
	slowRoute.GetRoute().Timeout = durationpb.New(50 * time.Millisecond)
	mirrorRoute := prefixRoute("mirror", "/m", "be")
	mirrorRoute.GetRoute().RequestMirrorPolicies = []*routev3.RouteAction_RequestMirrorPolicy{{Cluster: "shadow"}}
	rc := &routev3.RouteConfiguration{VirtualHosts: []*routev3.VirtualHost{{Name: "vh", Domains: []string{"*"}, Routes: []*routev3.Route{slowRoute, mirrorRoute}}}}
	sim := simOf(t, httpListener(t, rc), cluster("slow", slow.Listener.Addr().String()), cluster("shadow", shadow.Listener.Addr().String()),
		cluster("be", net.JoinHostPort(ip, strconv.Itoa(int(port)))))
	f := &Forwarder{}
	res, err := sim.Simulate(Request{Port: 80, Host: "h", Path: "/slow"})
	if err != nil {
		t.Fatal(err)
	}
	// The test's own deadline, far past the route's, so a missing timeout fails, not hangs.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := f.Send(ctx, res, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Errorf("status %d, want 504", resp.StatusCode)
	}
	res, err = sim.Simulate(Request{Port: 80, Host: "h:80", Path: "/m"})
	if err != nil {
		t.Fatal(err)
	}
	resp, err = f.Send(context.Background(), res, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	select {
	case host := <-mirrored:
		if host != "h-shadow:80" {
			t.Errorf("mirror host %q, want h-shadow:80", host)
		}
	default:
		t.Error("the mirror got no copy before the response")
	}
}

// TestMirrorShare: a mirror policy's runtime fraction is the share of requests copied, drawn
// per request (Forwarder.Sample); a policy without one copies every request.
func TestMirrorShare(t *testing.T) {
	var copies atomic.Int32
	shadow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { copies.Add(1) }))
	defer shadow.Close()
	_, ip, port := backend(t, false)
	h, p, _ := net.SplitHostPort(shadow.Listener.Addr().String())
	n, _ := strconv.Atoi(p)
	shadowCluster := staticCluster("shadow", h)
	shadowCluster.LoadAssignment.Endpoints[0].LbEndpoints[0].GetEndpoint().Address = sockAddr(h, uint32(n))
	be := staticCluster("be", ip)
	be.LoadAssignment.Endpoints[0].LbEndpoints[0].GetEndpoint().Address = sockAddr(ip, port)
	route := prefixRoute("mirror", "/", "be")
	route.GetRoute().RequestMirrorPolicies = []*routev3.RouteAction_RequestMirrorPolicy{{Cluster: "shadow",
		RuntimeFraction: &corev3.RuntimeFractionalPercent{DefaultValue: &typev3.FractionalPercent{Numerator: 25, Denominator: typev3.FractionalPercent_HUNDRED}}}}
	rc := &routev3.RouteConfiguration{VirtualHosts: []*routev3.VirtualHost{{Name: "vh", Domains: []string{"*"}, Routes: []*routev3.Route{route}}}}
	sim := simOf(t, httpListener(t, rc), shadowCluster, be)
	res, err := sim.Simulate(Request{Port: 80, Host: "h", Path: "/"})
	if err != nil {
		t.Fatal(err)
	}
	for _, draw := range []bool{true, false, false, true} {
		var asked float64
		f := &Forwarder{Sample: func(pct float64) bool { asked = pct; return draw }}
		before := copies.Load()
		resp, err := f.Send(context.Background(), res, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if asked != 25 {
			t.Errorf("sampled at %v%%, want 25%%", asked)
		}
		if got := copies.Load() - before; got != map[bool]int32{true: 1, false: 0}[draw] {
			t.Errorf("draw %v: %d copies", draw, got)
		}
	}
	// Drawn at random by default: about a quarter of 400 requests (a binomial's 6 sigma apart).
	copies.Store(0)
	f := &Forwarder{}
	for range 400 {
		resp, err := f.Send(context.Background(), res, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if got := copies.Load(); got < 100-52 || got > 100+52 {
		t.Errorf("%d of 400 requests mirrored at 25%%", got)
	}
}
