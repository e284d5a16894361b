// Package conformance lets the Gateway API conformance suite send its traffic through the
// simulator: RoundTripper implements the suite's roundtripper.RoundTripper (set it as
// suite.ConformanceOptions.RoundTripper). For a request to a gateway address it fetches what
// the control plane serves that gateway's proxy, simulates what the proxy's Envoy would do,
// and sends the request to the real backend the simulation picked (or answers a redirect,
// direct response, 404 NR or 503 itself, as Envoy would).
//
// TLS passthrough (a tcp_proxy chain picked by SNI) is real: the client's TLS goes to the
// backend, whose certificate is checked and reported. What it cannot do, by construction:
// verify the certificate a gateway terminates TLS with (no handshake happens with the gateway;
// CapturedResponse.PeerCertificates stays empty), validate client certificates, upgrade to
// websockets, or run HTTP filters other than the router (faults, CORS, ext_authz, …).
package conformance

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/gateway-api/conformance/utils/roundtripper"

	"sailplane.dev/tools/xdsdiff"
	"sailplane.dev/tools/xdssim"
)

// Fetch returns what the control plane serves the proxy behind a gateway address (host:port
// of the request URL), e.g. e2e/framework.FetchXDS as the gateway's router node.
type Fetch func(ctx context.Context, gatewayAddr string) (xdsdiff.Snapshot, error)

// RoundTripper simulates the gateway for the conformance suite.
type RoundTripper struct {
	Fetch Fetch
	// MaxAge is how long a fetched snapshot is reused (default 1s): the suite retries until
	// the config converges, so a short age follows the control plane closely.
	MaxAge time.Duration
	// Forwarder sends to backends (its Dial maps endpoint addresses, if needed).
	Forwarder xdssim.Forwarder
	// RequestTimeout bounds each request (default 10s).
	RequestTimeout time.Duration

	mu    sync.Mutex
	cache map[string]cached
	rand  *rand.Rand
}

type cached struct {
	sim *xdssim.Simulator
	at  time.Time
}

var _ roundtripper.RoundTripper = (*RoundTripper)(nil)

// ErrGatewayTLS: the request needs something of the TLS handshake with the gateway that a
// simulation cannot give (a client certificate to be validated).
var ErrGatewayTLS = errors.New("not simulated: TLS handshake with the gateway")

func (rt *RoundTripper) simulator(ctx context.Context, addr string) (*xdssim.Simulator, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	maxAge := rt.MaxAge
	if maxAge == 0 {
		maxAge = time.Second
	}
	if c, ok := rt.cache[addr]; ok && time.Since(c.at) < maxAge {
		return c.sim, nil
	}
	snap, err := rt.Fetch(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("fetch xDS for gateway %s: %w", addr, err)
	}
	sim, err := xdssim.New(snap)
	if err != nil {
		return nil, fmt.Errorf("gateway %s: %w", addr, err)
	}
	if rt.cache == nil {
		rt.cache = map[string]cached{}
	}
	rt.cache[addr] = cached{sim, time.Now()}
	return sim, nil
}

func (rt *RoundTripper) pick() uint64 {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.rand == nil {
		rt.rand = rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	}
	return rt.rand.Uint64()
}

// CaptureRoundTrip simulates one request and returns what the echo backend saw and the
// response, as the suite's DefaultRoundTripper does for a real gateway.
func (rt *RoundTripper) CaptureRoundTrip(r roundtripper.Request) (*roundtripper.CapturedRequest, *roundtripper.CapturedResponse, error) {
	timeout := rt.RequestTimeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	u := r.URL
	host := r.Host
	if host == "" {
		host = u.Host
	}
	// A followed redirect is simulated again against the same gateway, up to 10 times.
	for range 10 {
		creq, cres, next, err := rt.once(ctx, r, u, host)
		if err != nil || next == nil || r.UnfollowRedirect {
			return creq, cres, err
		}
		u, host = next.gateway, next.host
	}
	return nil, nil, errors.New("stopped after 10 redirects")
}

// followUp is where a redirect leads: the URL on the gateway, and the Host it names.
type followUp struct {
	gateway url.URL
	host    string
}

func (rt *RoundTripper) once(ctx context.Context, r roundtripper.Request, u url.URL, host string) (*roundtripper.CapturedRequest, *roundtripper.CapturedResponse, *followUp, error) {
	gw := u.Host
	req, err := simRequest(r, u, host)
	if err != nil {
		return nil, nil, nil, err
	}
	sim, err := rt.simulator(ctx, gw)
	if err != nil {
		return nil, nil, nil, err
	}
	req.Pick = rt.pick()
	res, err := sim.Simulate(req)
	var resp *http.Response
	switch {
	case err != nil:
		if resp = xdssim.ErrorResponse(err); resp == nil {
			return nil, nil, nil, err // no listener, no chain, TLS mismatch: the connection fails
		}
	default:
		if res.DownstreamTLS != nil && res.DownstreamTLS.RequireClientCert && r.GetClientCertificateHook == nil {
			return nil, nil, nil, fmt.Errorf("%w: the listener requires a client certificate", ErrGatewayTLS)
		}
		if res.DownstreamTLS != nil && r.GetClientCertificateHook != nil {
			return nil, nil, nil, fmt.Errorf("%w: client certificate validation", ErrGatewayTLS)
		}
		var body io.Reader
		if r.Body != "" {
			body = strings.NewReader(r.Body)
		}
		if res.NetworkFilter == "envoy.filters.network.tcp_proxy" {
			resp, err = rt.passthrough(ctx, res, r, req, body)
		} else {
			resp, err = rt.Forwarder.Send(ctx, res, body)
		}
		if err != nil {
			return nil, nil, nil, err
		}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, nil, err
	}
	creq := &roundtripper.CapturedRequest{}
	if resp.Header.Get("Content-Type") == "application/json" {
		if err := json.Unmarshal(data, creq); err != nil {
			return nil, nil, nil, fmt.Errorf("unexpected error reading response: %w", err)
		}
	} else {
		creq.Method = req.Method
	}
	cres := &roundtripper.CapturedResponse{
		StatusCode: resp.StatusCode, ContentLength: int64(len(data)), Protocol: resp.Proto, Headers: resp.Header,
	}
	if resp.TLS != nil {
		cres.PeerCertificates = resp.TLS.PeerCertificates // a passthrough backend's
	}
	var next *followUp
	if roundtripper.IsRedirect(resp.StatusCode) {
		loc, err := url.Parse(resp.Header.Get("Location"))
		if err != nil {
			return nil, nil, nil, err
		}
		cres.RedirectRequest = &roundtripper.RedirectRequest{Scheme: loc.Scheme, Host: loc.Hostname(), Port: loc.Port(), Path: loc.Path}
		// A redirect is followed through the same gateway, on the port the Location names.
		n := *loc
		port := loc.Port()
		if port == "" {
			port = map[string]string{"https": "443"}[loc.Scheme]
			if port == "" {
				port = "80"
			}
		}
		gwHost, _, _ := net.SplitHostPort(gw)
		n.Host = net.JoinHostPort(gwHost, port)
		next = &followUp{gateway: n, host: loc.Host}
	}
	return creq, cres, next, nil
}

// passthrough sends the client's own connection to the endpoint tcp_proxy picked: the
// client's TLS (SNI, trusted roots) then ends at the backend, as with TLS passthrough, so the
// backend's certificate is the one checked and reported.
func (rt *RoundTripper) passthrough(ctx context.Context, res *xdssim.Result, r roundtripper.Request, req xdssim.Request, body io.Reader) (*http.Response, error) {
	target := res.Endpoint
	if rt.Forwarder.Dial != nil {
		target = rt.Forwarder.Dial(target)
	}
	scheme := "http"
	tr := &http.Transport{DisableKeepAlives: true}
	if req.TLS {
		if len(r.ServerCertificate) == 0 {
			return nil, errors.New("https request has no trusted certificates configured")
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(r.ServerCertificate) {
			return nil, errors.New("unexpected error adding trusted certificates failed")
		}
		scheme = "https"
		tr.TLSClientConfig = &tls.Config{ServerName: r.ServerName, RootCAs: roots, GetClientCertificate: r.GetClientCertificateHook}
	}
	hr, err := http.NewRequestWithContext(ctx, req.Method, scheme+"://"+target+req.Path, body)
	if err != nil {
		return nil, err
	}
	hr.Host, hr.Header = req.Host, req.Headers
	client := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return client.Do(hr)
}

// simRequest maps the suite's request to the simulator's.
func simRequest(r roundtripper.Request, u url.URL, host string) (xdssim.Request, error) {
	gwHost, portStr, err := net.SplitHostPort(u.Host)
	if err != nil {
		gwHost, portStr = u.Host, map[string]string{"https": "443"}[u.Scheme]
		if portStr == "" {
			portStr = "80"
		}
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return xdssim.Request{}, fmt.Errorf("gateway address %q: %w", u.Host, err)
	}
	req := xdssim.Request{
		Port: uint32(port), DestinationIP: gwHost, Host: host, Method: r.Method, Path: u.RequestURI(),
		Headers: http.Header{}, Protocol: xdssim.HTTP1,
	}
	for name, vs := range r.Headers {
		if len(vs) > 0 {
			req.Headers.Set(name, vs[0]) // the suite sends the first value only
		}
	}
	switch {
	case r.Protocol == roundtripper.H2CPriorKnowledgeProtocol:
		req.Protocol = xdssim.HTTP2
	case r.Protocol == roundtripper.H2Protocol:
		req.Protocol, req.TLS = xdssim.HTTP2, true
	case r.Protocol == roundtripper.HTTPSProtocol || u.Scheme == "https":
		req.TLS = true
	}
	if req.TLS {
		req.SNI = r.ServerName
	}
	return req, nil
}
