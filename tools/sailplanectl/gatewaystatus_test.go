package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The shape config-ingest's /debug/gateway_status answers (TestGatewayAPIFilesStatus there reads it).
const gatewayStatusFixture = `[
 {"kind":"GatewayClass","name":"istio","ok":true,"conditions":["Accepted=True (Accepted)"],"status":{"conditions":[]}},
 {"kind":"HTTPRoute","namespace":"apps","name":"reviews","ok":false,
  "conditions":["parent apps/web: Accepted=True (Accepted)","parent apps/web: ResolvedRefs=False (BackendNotFound): backend reviews not found"],
  "status":{"parents":[{"controllerName":"istio.io/gateway-controller"}]}}
]`

func TestGatewayStatus(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/debug/gateway_status" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(gatewayStatusFixture))
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")

	out, err := run(t, "gateway-status", "--monitoring-address", addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"GatewayClass", "istio", "apps/reviews", "NO", "parent apps/web: ResolvedRefs=False (BackendNotFound): backend reviews not found"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}

	out, err = run(t, "gateway-status", "HTTPRoute/apps/", "--monitoring-address", addr, "-o", "yaml")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "GatewayClass") || !strings.Contains(out, "controllerName: istio.io/gateway-controller") {
		t.Errorf("filtered yaml:\n%s", out)
	}

	if _, err := run(t, "gateway-status", "--monitoring-address", addr+"0"); err == nil || !strings.Contains(err.Error(), "gateway status from") {
		t.Errorf("unreachable server: %v", err)
	}
}
