package agent

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"sailplane.dev/shared/golden"
	"sailplane.dev/shared/grpcbootstrap"
)

// TestEnvoyBootstrap: the bootstrap of a sidecar, against its golden file.
func TestEnvoyBootstrap(t *testing.T) {
	b, err := envoyBootstrap(grpcbootstrap.Workload{
		IP: "10.0.0.1", Pod: "web-0", Namespace: "demo", ServiceAccount: "web", Labels: map[string]string{"app": "web"},
	}, grpcbootstrap.Sidecar, "web.demo", "127.0.0.1:15000", "/etc/istio/proxy/XDS", "/var/run/secrets/workload-spiffe-uds/socket")
	if err != nil {
		t.Fatal(err)
	}
	golden.Compare(t, filepath.Join("testdata", "envoy-bootstrap.golden.json"), stableJSON(t, b))
}

// TestEnvoyBootstrapRouter: a gateway's agent (--proxy-type router) presents a router node, as
// pilot-agent's `proxy router`, so the xDS server sends it the Gateways that select it.
func TestEnvoyBootstrapRouter(t *testing.T) {
	b, err := envoyBootstrap(grpcbootstrap.Workload{IP: "10.0.0.1", Pod: "web-istio-5d8f", Namespace: "apps", ServiceAccount: "web-istio"},
		grpcbootstrap.Router, "web-istio.apps", "127.0.0.1:15000", "/etc/istio/proxy/XDS", "/var/run/secrets/workload-spiffe-uds/socket")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := b.GetNode().GetId(), "router~10.0.0.1~web-istio-5d8f.apps~apps.svc.cluster.local"; got != want {
		t.Errorf("node ID %q, want %q", got, want)
	}
	if _, err := New(Config{ProxyType: "gateway"}, Deps{}); err == nil || !strings.Contains(err.Error(), `proxy type "gateway"`) {
		t.Errorf("New with proxy type gateway: %v, want it refused", err)
	}
}

// stableJSON is protojson with fixed spacing (protojson varies it on purpose).
func stableJSON(t *testing.T, b *bootstrapv3.Bootstrap) []byte {
	t.Helper()
	raw, err := protojson.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := json.Indent(&out, raw, "", "  "); err != nil {
		t.Fatal(err)
	}
	return append(out.Bytes(), '\n')
}

// readEnvoyBootstrap reads and validates a written Envoy bootstrap.
func readEnvoyBootstrap(t *testing.T, path string) *bootstrapv3.Bootstrap {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(data, b); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return b
}
