package testenv

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"go.uber.org/goleak"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// klog starts its flush daemon in init; client-go imports klog.
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
	)
}

// The first run builds the binaries (minutes); later runs use the cache.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var (
	nsGVR  = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	podGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	vsGVR  = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "virtualservices"}
)

func dynamicClient(t *testing.T, cfg *rest.Config) *dynamic.DynamicClient {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hc.CloseIdleConnections)
	dc, err := dynamic.NewForConfigAndClient(cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	return dc
}

func TestKube(t *testing.T) {
	ctx := testCtx(t)
	k := KubeForTest(t)

	// The kubeconfig must describe the same server as RestConfig.
	fromFile, err := clientcmd.BuildConfigFromFlags("", k.KubeconfigPath())
	if err != nil {
		t.Fatal(err)
	}
	if fromFile.Host != k.Host() || fromFile.BearerToken != k.Token() {
		t.Fatalf("kubeconfig host/token = %s/%s, want %s/%s", fromFile.Host, fromFile.BearerToken, k.Host(), k.Token())
	}
	dc := dynamicClient(t, fromFile)

	ns := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Namespace",
		"metadata": map[string]any{"name": "testenv"},
	}}
	if _, err := dc.Resource(nsGVR).Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	vs := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
		"metadata": map[string]any{"name": "reviews", "namespace": "testenv"},
		"spec": map[string]any{
			"hosts": []any{"reviews"},
			"http": []any{map[string]any{
				"route": []any{map[string]any{"destination": map[string]any{"host": "reviews", "subset": "v2"}}},
			}},
		},
	}}
	if _, err := dc.Resource(vsGVR).Namespace("testenv").Create(ctx, vs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	checkVS := func() {
		t.Helper()
		got, err := dc.Resource(vsGVR).Namespace("testenv").Get(ctx, "reviews", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		hosts, _, _ := unstructured.NestedStringSlice(got.Object, "spec", "hosts")
		if len(hosts) != 1 || hosts[0] != "reviews" {
			t.Fatalf("hosts = %v, want [reviews]", hosts)
		}
	}
	checkVS()

	// Without a controller manager there are no "default" service
	// accounts; a Pod must still be accepted.
	pod := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": "reviews-v2", "namespace": "testenv", "labels": map[string]any{"app": "reviews"}},
		"spec":     map[string]any{"containers": []any{map[string]any{"name": "app", "image": "none"}}},
	}}
	if _, err := dc.Resource(podGVR).Namespace("testenv").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Down and up again: the data lives in etcd, the address is unchanged.
	k.StopAPIServer()
	if _, err := dc.Resource(vsGVR).Namespace("testenv").Get(ctx, "reviews", metav1.GetOptions{}); err == nil {
		t.Fatal("Get succeeded with the API server stopped")
	}
	if err := k.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	checkVS()

	// kubectl, built from the same release, reads it with the kubeconfig and knows its version.
	kubectl := KubectlForTest(t)
	out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", k.KubeconfigPath(),
		"get", "virtualservice", "reviews", "-n", "testenv", "-o", "jsonpath={.spec.hosts[0]}").CombinedOutput()
	if err != nil || string(out) != "reviews" {
		t.Fatalf("kubectl get virtualservice: %q, %v; want reviews", out, err)
	}
	out, err = exec.CommandContext(ctx, kubectl, "--kubeconfig", k.KubeconfigPath(), "version", "-o", "json").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl version: %v\n%s", err, out)
	}
	var v struct{ ClientVersion, ServerVersion struct{ GitVersion string } }
	if err := json.Unmarshal(out, &v); err != nil || v.ClientVersion.GitVersion != KubeVersion || v.ServerVersion.GitVersion != KubeVersion {
		t.Fatalf("kubectl version: %+v, %v; want client and server %s\n%s", v, err, KubeVersion, out)
	}
}

func TestConsul(t *testing.T) {
	ctx := testCtx(t)
	c := ConsulForTest(t)
	client := consulClient(t, c)
	registerWeb(ctx, t, client)
	checkWeb(ctx, t, client)
}

// With WithConsulOnDisk, what was registered survives the agent's stop and start.
func TestConsulOnDiskRestart(t *testing.T) {
	ctx := testCtx(t)
	c := ConsulForTest(t, WithConsulOnDisk())
	client := consulClient(t, c)
	registerWeb(ctx, t, client)
	c.StopAgent()
	if _, _, err := client.Catalog().Services((&consulapi.QueryOptions{}).WithContext(ctx)); err == nil {
		t.Fatal("the catalog answers with the agent stopped")
	}
	if err := c.StartAgent(ctx); err != nil {
		t.Fatal(err)
	}
	checkWeb(ctx, t, client)
}

func consulClient(t *testing.T, c *Consul) *consulapi.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client, err := consulapi.NewClient(&consulapi.Config{
		Address:    c.Addr(),
		HttpClient: &http.Client{Transport: tr, Timeout: 10 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	return client
}

func registerWeb(ctx context.Context, t *testing.T, client *consulapi.Client) {
	_, err := client.Catalog().Register(&consulapi.CatalogRegistration{
		Node:    "external-node",
		Address: "198.18.0.10",
		Service: &consulapi.AgentService{ID: "web-1", Service: "web", Port: 8080, Tags: []string{"v1"}},
	}, (&consulapi.WriteOptions{}).WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
}

func checkWeb(ctx context.Context, t *testing.T, client *consulapi.Client) {
	services, _, err := client.Catalog().Services((&consulapi.QueryOptions{}).WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := services["web"]; !ok {
		t.Fatalf("services = %v, want web", services)
	}
	inst, _, err := client.Catalog().Service("web", "", (&consulapi.QueryOptions{}).WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if len(inst) != 1 || inst[0].ServicePort != 8080 || inst[0].Address != "198.18.0.10" {
		t.Fatalf("instances = %+v", inst)
	}
}

func TestRenderGoMod(t *testing.T) {
	tests := []struct {
		spec buildSpec
		want []string
	}{
		{etcdSpec, []string{"require go.etcd.io/etcd/server/v3 " + EtcdVersion}},
		{kubeSpec, []string{
			"require k8s.io/kubernetes " + KubeVersion,
			"replace k8s.io/client-go => k8s.io/client-go " + KubeStagingVersion,
			"replace k8s.io/apiserver => k8s.io/apiserver " + KubeStagingVersion,
			"replace k8s.io/kms => k8s.io/kms " + KubeStagingVersion,
		}},
		{kubectlSpec, []string{"require k8s.io/kubernetes " + KubeVersion, "replace k8s.io/kubectl => k8s.io/kubectl " + KubeStagingVersion}},
		{consulSpec, []string{"require github.com/hashicorp/consul " + ConsulVersion}},
	}
	for _, tt := range tests {
		t.Run(tt.spec.name, func(t *testing.T) {
			got, err := tt.spec.renderGoMod()
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(got, w+"\n") {
					t.Errorf("go.mod lacks %q:\n%s", w, got)
				}
			}
		})
	}
}

func TestCacheDir(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("SAILPLANE_CACHE", dir)
	got, err := CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "bin"); got != want {
		t.Fatalf("CacheDir = %s, want %s", got, want)
	}
}

func TestLockFileSerializes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	ctx := context.Background()
	unlock, err := lockFile(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	// A second holder must wait until the first releases.
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	var waitErr error
	go func() {
		defer wg.Done()
		_, waitErr = lockFile(cctx, path)
	}()
	cancel()
	wg.Wait()
	if waitErr == nil {
		t.Fatal("second lock acquired while the first was held")
	}
	unlock()
	unlock2, err := lockFile(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	unlock2()
}

func TestBuildErrorKeepsOutput(t *testing.T) {
	t.Setenv("SAILPLANE_CACHE", t.TempDir())
	spec := buildSpec{name: "nothing", version: "v0.0.0", pkg: "sailplane.dev/throwaway/none",
		gomod: "module sailplane.dev/throwaway/none\n\ngo 1.26.0\n"}
	_, err := ensure(context.Background(), tLogger(t), spec)
	var be *BuildError
	if err == nil || !errors.As(err, &be) || be.Output == "" {
		t.Fatalf("err = %v, want a BuildError with output", err)
	}
	if _, statErr := os.Stat(filepath.Join(os.Getenv("SAILPLANE_CACHE"), "bin", "nothing-v0.0.0")); statErr == nil {
		t.Fatal("a failed build left a binary")
	}
}

// TestIstiod starts Istio's istiod against a test API server: it becomes ready, serves the mesh
// config it was given, listens on loopback only (its xDS address), and Stop ends it.
func TestIstiod(t *testing.T) {
	k := KubeForTest(t)
	i := IstiodForTest(t, k, "rootNamespace: istio-system\ningressClass: testenv\n")
	if !strings.HasPrefix(i.XDSAddr(), "127.0.0.1:") || !strings.HasPrefix(i.DebugAddr(), "127.0.0.1:") {
		t.Fatalf("istiod listens on %s and %s, want loopback", i.XDSAddr(), i.DebugAddr())
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	body, err := httpGet(testCtx(t), hc, "http://"+i.DebugAddr()+"/debug/mesh", nil)
	if err != nil {
		t.Fatal(err)
	}
	var mesh struct{ IngressClass string }
	if err := json.Unmarshal(body, &mesh); err != nil || mesh.IngressClass != "testenv" {
		t.Fatalf("istiod's mesh config %s (%v), want ingressClass testenv", body, err)
	}
	conn, err := net.DialTimeout("tcp", i.XDSAddr(), 5*time.Second)
	if err != nil {
		t.Fatalf("istiod's xDS port: %v", err)
	}
	conn.Close()
	i.Stop()
	if conn, err := net.DialTimeout("tcp", i.XDSAddr(), 5*time.Second); err == nil {
		conn.Close()
		t.Fatal("istiod's xDS port still answers after Stop")
	}
}

// GatewayAPIVersion is the version of sigs.k8s.io/gateway-api Sailplane's Go code pins: the
// CRDs installed in tests are those the code was written for.
func TestGatewayAPIVersionPinned(t *testing.T) {
	mod, err := os.ReadFile("../../shared/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if want := "sigs.k8s.io/gateway-api " + GatewayAPIVersion + "\n"; !strings.Contains(string(mod), want) {
		t.Errorf("shared/go.mod does not require %q", strings.TrimSpace(want))
	}
}

// WithGatewayAPICRDs serves the Gateway API kinds, with their CEL rules; without it they are
// not served, as in a cluster where nobody installed them.
func TestKubeGatewayAPICRDs(t *testing.T) {
	ctx := testCtx(t)
	start := time.Now()
	k := KubeForTest(t, WithGatewayAPICRDs())
	t.Logf("started with Istio's and the Gateway API's CRDs in %v", time.Since(start).Round(time.Millisecond))
	dc := dynamicClient(t, k.RestConfig())
	routes := dc.Resource(schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "httproutes"}).Namespace("default")
	route := func(backend map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
			"metadata": map[string]any{"name": "r"},
			"spec":     map[string]any{"rules": []any{map[string]any{"backendRefs": []any{backend}}}},
		}}
	}
	if _, err := routes.Create(ctx, route(map[string]any{"name": "svc"}), metav1.CreateOptions{}); err == nil ||
		!strings.Contains(err.Error(), "Must have port for Service reference") {
		t.Errorf("a backendRef without port: %v, want the CRD's CEL rule to refuse it", err)
	}
	if _, err := routes.Create(ctx, route(map[string]any{"name": "svc", "port": int64(80)}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
