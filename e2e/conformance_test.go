package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	clientset "k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/gateway-api/apis/v1alpha2"
	"sigs.k8s.io/gateway-api/apis/v1alpha3"
	"sigs.k8s.io/gateway-api/apis/v1beta1"
	gwconformance "sigs.k8s.io/gateway-api/conformance"
	confv1 "sigs.k8s.io/gateway-api/conformance/apis/v1"
	"sigs.k8s.io/gateway-api/conformance/utils/config"
	"sigs.k8s.io/gateway-api/conformance/utils/suite"
	"sigs.k8s.io/gateway-api/pkg/features"
	"sigs.k8s.io/yaml"

	"sailplane.dev/e2e/framework"
	"sailplane.dev/tools/testenv"
	"sailplane.dev/tools/xdsdiff"
	"sailplane.dev/tools/xdssim/conformance"
)

// conformanceReport is where the suite's report for a topology (hyper, microservices) is
// written, relative to the e2e module.
func conformanceReport(mode string) string {
	return "../docs/conformance/gateway-api-v1.6.3-" + mode + ".yaml"
}

// conformanceSkips are the suite's tests that cannot run here, with why (docs/gateway-api.md):
// the simulator is the gateway's proxy, so what needs a real handshake with the gateway or a
// filter other than the router is not run, and never counted as passed.
var conformanceSkips = map[string]string{}

// conformanceKnownFailures fail against Sailplane today. They are skipped in make test, so
// that any other test failing is noticed, and run when the report is refreshed
// (UPDATE_GOLDEN=1), so that docs/conformance records them as failed.
var conformanceKnownFailures = map[string]string{}

// TestGatewayAPIConformance runs the upstream Gateway API conformance suite (v1.6.3) against
// Sailplane on the test environment's API server, in both topologies (kubeTopologies), each
// on its own API server. conformanceKubelet runs the suite's echo backends as real processes
// in test hosts and stands in for the controllers an API server alone lacks;
// tools/xdssim/conformance is the gateway's Envoy, over the xDS Sailplane serves the gateway's
// router node. It writes the suite's report for each topology to docs/conformance.
func TestGatewayAPIConformance(t *testing.T) {
	echo := buildEchoBasic(t)
	for _, top := range kubeTopologies {
		t.Run(top.name, func(t *testing.T) { runGatewayAPIConformance(t, top.name, top.start, echo) })
	}
}

func runGatewayAPIConformance(t *testing.T, mode string, startSailplane func(*testing.T, *testenv.Kube, *framework.Kube) sailplaneOnKube, echoBin string) {
	start := time.Now()
	k := testenv.KubeForTest(t, testenv.WithGatewayAPICRDs())
	kube := framework.NewKube(t, k.RestConfig())
	kube.EnsureNamespace(t, "istio-system")
	sp := startSailplane(t, k, kube)
	kube.Apply(t, `apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: istio}
spec: {controllerName: istio.io/gateway-controller}
`)
	kl := startConformanceKubelet(t, kube, echoBin)

	rt := &conformance.RoundTripper{Fetch: func(ctx context.Context, gatewayAddr string) (xdsdiff.Snapshot, error) {
		ip, _, err := net.SplitHostPort(gatewayAddr)
		if err != nil {
			ip = gatewayAddr
		}
		key, ok := kl.gateway(ip)
		if !ok {
			return xdsdiff.Snapshot{}, fmt.Errorf("no gateway has address %s", ip)
		}
		ns, name, _ := strings.Cut(key, "/")
		dep, err := kube.Clientset.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return xdsdiff.Snapshot{}, err
		}
		// The router node a pod of the generated Deployment runs, as its agent announces it.
		lbls := map[string]any{}
		for k, v := range dep.Spec.Template.Labels {
			lbls[k] = v
		}
		node := framework.XDSNode{
			ID: fmt.Sprintf("router~%s~%s-0.%s~%s.svc.cluster.local", ip, name, ns, ns),
			Metadata: map[string]any{"NAMESPACE": ns, "LABELS": lbls, "SERVICE_ACCOUNT": dep.Spec.Template.Spec.ServiceAccountName,
				"CLUSTER_ID": "Kubernetes"},
		}
		return framework.FetchXDS(ctx, sp.xds, node, 300*time.Millisecond)
	}}

	cfg := kl.withPodLogs(k.RestConfig())
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, install := range []func(*runtime.Scheme) error{v1alpha3.Install, v1alpha2.Install, v1beta1.Install, gwv1.Install, apiextensionsv1.AddToScheme} {
		if err := install(c.Scheme()); err != nil {
			t.Fatal(err)
		}
	}
	cs, err := clientset.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	report, err := filepath.Abs(conformanceReport(mode))
	if err != nil {
		t.Fatal(err)
	}
	tmpReport := filepath.Join(t.TempDir(), "report.yaml")
	timeouts := config.DefaultTimeoutConfig()
	var skips []string
	for name := range conformanceSkips {
		skips = append(skips, name)
	}
	update := os.Getenv("UPDATE_GOLDEN") != ""
	if !update {
		for name := range conformanceKnownFailures {
			skips = append(skips, name)
		}
	}
	opts := suite.ConformanceOptions{
		ConfigurableOptions: suite.ConfigurableOptions{
			GatewayClassName:     "istio",
			CleanupBaseResources: false,
			CleanupTestResources: true,
			TimeoutConfig:        timeouts,
			SupportedFeatures:    sailplaneGatewayFeatures.UnsortedList(),
			ConformanceProfiles:  []suite.ConformanceProfileName{suite.GatewayHTTPConformanceProfileName, suite.GatewayGRPCConformanceProfileName},
			SkipTests:            skips,
			ReportOutputPath:     tmpReport,
			RunTest:              os.Getenv("CONFORMANCE_RUN_TEST"),
			// For GatewayStaticAddresses: a Gateway's static address is a Hostname, the Service
			// of that name serving it, as istiod's conformance run gives them.
			UsableNetworkAddresses:   []gwv1.GatewaySpecAddress{{Type: ptr(gwv1.HostnameAddressType), Value: "infra-backend-v1.gateway-conformance-infra.svc.cluster.local"}},
			UnusableNetworkAddresses: []gwv1.GatewaySpecAddress{{Type: ptr(gwv1.HostnameAddressType), Value: "foo"}},
			Implementation: confv1.Implementation{
				Organization: "sailplane", Project: "sailplane", URL: "https://sailplane.dev", Version: "main",
				Contact: []string{"https://sailplane.dev"},
			},
			Mode: mode,
		},
		Client: c, Clientset: cs, RestConfig: cfg,
		RoundTripper: rt, GRPCClient: &conformance.GRPCClient{RT: rt},
	}
	t.Run("suite", func(t *testing.T) { gwconformance.RunConformanceWithOptions(t, opts) })
	t.Logf("conformance suite (%s) took %s", mode, time.Since(start).Round(time.Second))
	data, err := os.ReadFile(tmpReport)
	if err != nil {
		t.Fatalf("suite report: %v", err)
	}
	var got confv1.ConformanceReport
	if err := yaml.Unmarshal(data, &got); err != nil {
		t.Fatalf("suite report: %v", err)
	}
	if update && opts.RunTest == "" {
		if err := os.MkdirAll(filepath.Dir(report), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(report, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// sailplaneGatewayFeatures are the features Sailplane claims for the Gateway HTTP and gRPC
// profiles: each one's tests pass here in both topologies. Standard channel only, as the test
// environment installs the standard CRDs. Not claimed, and why (docs/gateway-api.md):
//   - GatewayHTTPSListenerDetectMisdirectedRequests, GatewayFrontendClientCertificateValidation
//     (and its InsecureFallback), GatewayBackendClientCertificate, BackendTLSPolicy: they need a
//     TLS handshake with the gateway or from it to the backend, which the simulator does not make;
//   - HTTPRouteBackendProtocolWebSocket: the suite dials the gateway address itself, with no
//     round tripper to simulate it;
//   - HTTPRouteCORS: the simulator runs no HTTP filter but the router;
//   - HTTPRouteDestinationPortMatching, HTTPRouteRetry*: experimental channel.
var sailplaneGatewayFeatures = sets.New(
	features.SupportGateway,
	features.SupportReferenceGrant,
	features.SupportHTTPRoute,
	features.SupportGRPCRoute,

	features.SupportGatewayPort8080,
	features.SupportGatewayHTTPListenerIsolation,
	features.SupportGatewayInfrastructure,
	features.SupportGatewayAddressEmpty,
	features.SupportGatewayStaticAddresses,
	features.SupportListenerSet,

	features.SupportHTTPRouteQueryParamMatching,
	features.SupportHTTPRouteMethodMatching,
	features.SupportHTTPRouteResponseHeaderModification,
	features.SupportHTTPRouteBackendRequestHeaderModification,
	features.SupportHTTPRoutePortRedirect,
	features.SupportHTTPRouteSchemeRedirect,
	features.SupportHTTPRoutePathRedirect,
	features.SupportHTTPRoute303RedirectStatusCode,
	features.SupportHTTPRoute307RedirectStatusCode,
	features.SupportHTTPRoute308RedirectStatusCode,
	features.SupportHTTPRouteHostRewrite,
	features.SupportHTTPRoutePathRewrite,
	features.SupportHTTPRouteRequestMirror,
	features.SupportHTTPRouteRequestMultipleMirrors,
	features.SupportHTTPRouteRequestPercentageMirror,
	features.SupportHTTPRouteRequestTimeout,
	features.SupportHTTPRouteBackendTimeout,
	features.SupportHTTPRouteParentRefPort,
	features.SupportHTTPRouteBackendProtocolH2C,
	features.SupportHTTPRouteNamedRouteRule,

	features.SupportGRPCRouteNamedRouteRule,
)

func buildEchoBasic(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "echo-basic")
	cmd := exec.Command("go", "build", "-o", bin, "sigs.k8s.io/gateway-api/conformance/echo-basic")
	cmd.Dir = "../tools"
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build echo-basic: %v\n%s", err, out)
	}
	return bin
}
