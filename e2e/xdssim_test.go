package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/tools/xdssim"
)

// TestSimulatedGatewayTraffic drives requests through what hyper serves an ingress gateway,
// with the simulator standing in for the gateway's Envoy: the listener, virtual host and route
// it picks from the served xDS, and then real HTTP to the backends the served endpoints name.
// It is how Gateway traffic is checked where no Envoy can run.
func TestSimulatedGatewayTraffic(t *testing.T) {
	backend := func(name string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{"backend": name, "path": r.URL.RequestURI(), "host": r.Host, "headers": r.Header})
		}))
		t.Cleanup(srv.Close)
		_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
		return port
	}
	v1, v2 := backend("v1"), backend("v2")
	dir := t.TempDir()
	framework.WriteFile(t, dir, "etc/sailplane/mesh.yaml", meshYAML)
	framework.WriteFile(t, dir, "etc/sailplane/conf/web.yaml", fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: web, namespace: demo}
spec:
  hosts: [web.demo.svc.cluster.local]
  resolution: STATIC
  ports: [{name: http, number: 8080, protocol: HTTP}]
  workloadSelector: {labels: {app: web}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: web-v1, namespace: demo}
spec: {address: 127.0.0.1, ports: {http: %s}, labels: {app: web, version: v1}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: web-v2, namespace: demo}
spec: {address: 127.0.0.1, ports: {http: %s}, labels: {app: web, version: v2}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: web, namespace: demo}
spec:
  host: web.demo.svc.cluster.local
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: ingress, namespace: demo}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: ["*.example.com"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: web, namespace: demo}
spec:
  hosts: [web.example.com]
  gateways: [ingress]
  http:
  - match: [{uri: {prefix: /v2/}}]
    rewrite: {uri: /}
    headers: {request: {set: {x-via: gateway}}}
    route: [{destination: {host: web.demo.svc.cluster.local, subset: v2, port: {number: 8080}}}]
  - match: [{uri: {exact: /old}}]
    redirect: {uri: /new, redirectCode: 302}
  - route: [{destination: {host: web.demo.svc.cluster.local, subset: v1, port: {number: 8080}}}]
`, v1, v2))
	xdsAddr, _ := topologies[0].start(t, dir) // hyper
	node := framework.XDSNode{
		ID:       "router~198.18.0.20~ingress-1.istio-system~istio-system.svc.cluster.local",
		Metadata: map[string]any{"NAMESPACE": "istio-system", "LABELS": map[string]any{"istio": "ingressgateway"}},
	}
	fwd := &xdssim.Forwarder{}
	send := func(ctx context.Context, req xdssim.Request) (*http.Response, *xdssim.Result, error) {
		snap, err := framework.FetchXDS(ctx, xdsAddr, node, 300*time.Millisecond)
		if err != nil {
			return nil, nil, err
		}
		sim, err := xdssim.New(snap)
		if err != nil {
			return nil, nil, err
		}
		res, err := sim.Simulate(req)
		if err != nil {
			// Envoy's own answer (404 NR, 503 UH…) when there is one.
			if resp := xdssim.ErrorResponse(err); resp != nil {
				return resp, &xdssim.Result{}, nil
			}
			return nil, nil, err
		}
		resp, err := fwd.Send(ctx, res, nil)
		return resp, res, err
	}
	type echoed struct {
		Backend, Path, Host string
		Headers             http.Header
	}
	expect := func(t *testing.T, req xdssim.Request, check func(*http.Response, echoed) error) {
		t.Helper()
		framework.Eventually(t, time.Minute, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, res, err := send(ctx, req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			var e echoed
			if resp.Header.Get("Content-Type") == "application/json" {
				if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
					return err
				}
			}
			if err := check(resp, e); err != nil {
				return fmt.Errorf("%w (route %s, cluster %s, endpoint %s)", err, res.Route, res.Cluster, res.Endpoint)
			}
			return nil
		})
	}
	base := xdssim.Request{Port: 80, DestinationIP: "198.18.0.20", Host: "web.example.com"}
	t.Run("default route to v1", func(t *testing.T) {
		req := base
		req.Path = "/shop?item=1"
		expect(t, req, func(resp *http.Response, e echoed) error {
			if resp.StatusCode != 200 || e.Backend != "v1" || e.Path != "/shop?item=1" || e.Host != "web.example.com" {
				return fmt.Errorf("got %d %+v", resp.StatusCode, e)
			}
			return nil
		})
	})
	t.Run("prefix match, rewrite and header to v2", func(t *testing.T) {
		req := base
		req.Path = "/v2/cart"
		expect(t, req, func(resp *http.Response, e echoed) error {
			if resp.StatusCode != 200 || e.Backend != "v2" || e.Path != "/cart" || e.Headers.Get("x-via") != "gateway" {
				return fmt.Errorf("got %d %+v", resp.StatusCode, e)
			}
			return nil
		})
	})
	t.Run("redirect answered by the gateway", func(t *testing.T) {
		req := base
		req.Path = "/old"
		expect(t, req, func(resp *http.Response, e echoed) error {
			if resp.StatusCode != 302 || resp.Header.Get("Location") != "http://web.example.com/new" || e.Backend != "" {
				return fmt.Errorf("got %d %v %+v", resp.StatusCode, resp.Header, e)
			}
			return nil
		})
	})
	t.Run("host the gateway does not serve", func(t *testing.T) {
		req := base
		req.Host = "other.example.com"
		expect(t, req, func(resp *http.Response, e echoed) error {
			if resp.StatusCode != 404 {
				return fmt.Errorf("got %d %+v", resp.StatusCode, e)
			}
			return nil
		})
	})
}
