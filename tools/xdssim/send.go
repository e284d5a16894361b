package xdssim

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"
)

// Forwarder sends simulated requests to the endpoints the simulation picked.
type Forwarder struct {
	// Client sends HTTP/1.1; its zero value is a plain http.Client without redirects.
	Client *http.Client
	// H2C sends HTTP/2 over cleartext (gRPC, or clusters whose upstream protocol is HTTP/2).
	H2C *http.Client
	// Dial, when set, maps an endpoint address to the address to connect to (a test whose
	// backends run elsewhere than the config says).
	Dial func(endpoint string) string
	// Sample decides whether a request is mirrored by a policy with a share below 100%
	// (percent in (0, 100)); nil draws at random, as Envoy does for each request.
	Sample func(percent float64) bool
}

// ErrUpstreamTLS: the cluster encrypts to its endpoint and the forwarder has no credentials
// to do the same; it refuses rather than send in the clear.
var ErrUpstreamTLS = errors.New("upstream TLS is not forwarded")

var errRouteTimeout = errors.New("route timeout")

func (f *Forwarder) client(h2 bool) *http.Client {
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if h2 {
		if f.H2C != nil {
			return f.H2C
		}
		p := &http.Protocols{}
		p.SetUnencryptedHTTP2(true)
		return &http.Client{Transport: &http.Transport{Protocols: p, DisableKeepAlives: true, TLSClientConfig: &tls.Config{}}, CheckRedirect: noRedirect}
	}
	if f.Client != nil {
		return f.Client
	}
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, CheckRedirect: noRedirect}
}

// UpstreamRequest builds the request Envoy sends to res.Endpoint: the rewritten path and
// host, the mutated headers.
func (f *Forwarder) UpstreamRequest(ctx context.Context, res *Result, body io.Reader) (*http.Request, error) {
	if res.Action != Forward || res.Upstream == nil || res.Endpoint == "" {
		return nil, fmt.Errorf("result is not an HTTP request forwarded to an endpoint (action %q)", res.Action)
	}
	if res.UpstreamTLS != nil {
		return nil, fmt.Errorf("%w: cluster %s (SNI %q)", ErrUpstreamTLS, res.Cluster, res.UpstreamTLS.SNI)
	}
	addr := res.Endpoint
	if f.Dial != nil {
		addr = f.Dial(addr)
	}
	u := res.Upstream
	r, err := http.NewRequestWithContext(ctx, u.Method, "http://"+addr+u.Path, body)
	if err != nil {
		return nil, err
	}
	r.Host = u.Host
	r.Header = u.Headers.Clone()
	return r, nil
}

// Send answers a simulated request: a redirect or direct response itself, a forwarded one
// by sending it upstream; the response headers are mutated as the route says.
func (f *Forwarder) Send(ctx context.Context, res *Result, body io.Reader) (*http.Response, error) {
	var resp *http.Response
	switch res.Action {
	case Redirect:
		resp = localReply(res.Redirect.Status, "")
		resp.Header.Set("Location", res.Redirect.Location)
	case DirectResponse:
		resp = localReply(res.Direct.Status, res.Direct.Body)
	case Forward:
		var payload []byte
		if body != nil {
			var err error
			if payload, err = io.ReadAll(body); err != nil {
				return nil, err
			}
		}
		f.mirror(ctx, res, payload)
		// The route timeout covers the whole response, as Envoy's does; past it Envoy answers
		// 504 itself.
		if res.Timeout != nil && *res.Timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeoutCause(ctx, time.Duration(*res.Timeout), errRouteTimeout)
			defer cancel()
		}
		r, err := f.UpstreamRequest(ctx, res, bytes.NewReader(payload))
		if err != nil {
			return nil, err
		}
		resp, err = f.client(res.UpstreamProtocol == HTTP2).Do(r)
		if err == nil {
			err = bufferBody(resp)
		}
		if err != nil && errors.Is(context.Cause(ctx), errRouteTimeout) {
			resp = localReply(http.StatusGatewayTimeout, "upstream request timeout")
		} else if err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("result has no action to send")
	}
	Apply(resp.Header, res.ResponseHeaders)
	return resp, nil
}

// mirror sends the copies of the request the route mirrors (each policy at its share of
// requests), and waits for them: a copy's response is dropped, as Envoy drops it.
func (f *Forwarder) mirror(ctx context.Context, res *Result, payload []byte) {
	for _, m := range res.Mirrors {
		if m.Endpoint == "" || !f.sample(m.Percent) {
			continue
		}
		shadow := *res
		shadow.Endpoint, shadow.Mirrors, shadow.UpstreamTLS = m.Endpoint, nil, nil
		up := *res.Upstream
		up.Host = m.Host
		shadow.Upstream = &up
		r, err := f.UpstreamRequest(ctx, &shadow, bytes.NewReader(payload))
		if err != nil {
			continue
		}
		if resp, err := f.client(false).Do(r); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
}

func (f *Forwarder) sample(percent float64) bool {
	switch {
	case percent >= 100:
		return true
	case percent <= 0:
		return false
	case f.Sample != nil:
		return f.Sample(percent)
	}
	return rand.Float64()*100 < percent
}

func bufferBody(resp *http.Response) error {
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return nil
}

// ErrorResponse is Envoy's local reply for a simulation failure that has one (404 NR,
// 503 NC, 503 UH), or nil when the connection itself fails.
func ErrorResponse(err error) *http.Response {
	var e *Error
	if !errors.As(err, &e) || e.Status == 0 {
		return nil
	}
	resp := localReply(e.Status, "")
	if e.Status == http.StatusServiceUnavailable {
		resp = localReply(e.Status, map[string]string{"NC": "no cluster", "UH": "no healthy upstream"}[e.Flag])
	}
	return resp
}

func localReply(status int, body string) *http.Response {
	h := http.Header{}
	if body != "" {
		h.Set("Content-Type", "text/plain")
	}
	return &http.Response{
		StatusCode: status, Status: fmt.Sprintf("%d %s", status, http.StatusText(status)),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)),
	}
}
