package mesh

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"sailplane.dev/shared/config"
	"sailplane.dev/shared/testlog"
	"sailplane.dev/shared/testwait"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testLogger(t *testing.T) *slog.Logger {
	return testlog.New(t, slog.LevelDebug)
}

func TestDefault(t *testing.T) {
	m := Default()
	if m.RootNamespace != "istio-system" || m.TrustDomain != "cluster.local" ||
		m.DefaultConfig.DiscoveryAddress != "istiod.istio-system.svc:15012" || !m.EnableAutoMtls.GetValue() ||
		m.OutboundTrafficPolicy.Mode != meshv1alpha1.MeshConfig_OutboundTrafficPolicy_ALLOW_ANY ||
		m.ConnectTimeout.AsDuration() != 10*time.Second || m.DnsRefreshRate.AsDuration() != time.Minute ||
		m.IngressClass != "istio" || m.IngressService != "istio-ingressgateway" || m.AccessLogFile != "" {
		t.Fatalf("Default() = %v", m)
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, yaml string
		check      func(*meshv1alpha1.MeshConfig) bool
	}{
		{"empty", "", func(m *meshv1alpha1.MeshConfig) bool { return m.RootNamespace == "istio-system" }},
		{"comment only", "# nothing\n", func(m *meshv1alpha1.MeshConfig) bool { return m.TrustDomain == "cluster.local" }},
		{"overrides", "rootNamespace: sailplane\ntrust_domain: example.org\naccessLogFile: /dev/stdout\nconnectTimeout: 500ms\nenableAutoMtls: false\n",
			func(m *meshv1alpha1.MeshConfig) bool {
				return m.RootNamespace == "sailplane" && m.TrustDomain == "example.org" && m.AccessLogFile == "/dev/stdout" &&
					m.ConnectTimeout.AsDuration() == 500*time.Millisecond && m.EnableAutoMtls != nil && !m.EnableAutoMtls.Value &&
					m.IngressClass == "istio"
			}},
		{"nested merge", "defaultConfig:\n  proxyMetadata: {ISTIO_META_DNS_CAPTURE: \"true\"}\n  drainDuration: 10s\noutboundTrafficPolicy: {mode: REGISTRY_ONLY}\n",
			func(m *meshv1alpha1.MeshConfig) bool {
				return m.DefaultConfig.DiscoveryAddress == "istiod.istio-system.svc:15012" &&
					m.DefaultConfig.ProxyMetadata["ISTIO_META_DNS_CAPTURE"] == "true" &&
					m.DefaultConfig.DrainDuration.AsDuration() == 10*time.Second &&
					m.OutboundTrafficPolicy.Mode == meshv1alpha1.MeshConfig_OutboundTrafficPolicy_REGISTRY_ONLY
			}},
		{"lists replace", "defaultServiceExportTo: [.]\nconfigSources:\n- address: fs:///etc/config\n",
			func(m *meshv1alpha1.MeshConfig) bool {
				return len(m.DefaultServiceExportTo) == 1 && m.DefaultServiceExportTo[0] == "." && m.ConfigSources[0].Address == "fs:///etc/config"
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name+".yaml")
			write(t, p, tc.yaml)
			m, err := Load(p)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(m) {
				t.Fatalf("unexpected config: %v", m)
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, yaml, field, text string }{
		{"unknown", "rootNamespace: a\ndefaultConfig:\n  discoveryAdress: x\n", "defaultConfig.discoveryAdress", "unknown field"},
		{"enum", "outboundTrafficPolicy: {mode: ALLOW}\n", "outboundTrafficPolicy.mode", "unknown value"},
		{"duration", "connectTimeout: soon\n", "connectTimeout", "invalid duration"},
		{"malformed", "rootNamespace: [\n", "", "malformed"},
		{"not a map", "- a\n", "", "expected an object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name+".yaml")
			write(t, p, tc.yaml)
			_, err := Load(p)
			var ce *config.Error
			if !errors.As(err, &ce) {
				t.Fatalf("got %T %v", err, err)
			}
			if ce.File != p || ce.Field != tc.field || !strings.Contains(err.Error(), tc.text) || !strings.HasPrefix(err.Error(), p+": ") {
				t.Fatalf("got %q (field %q)", err, ce.Field)
			}
		})
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

func TestConfigSourceDirs(t *testing.T) {
	m := &meshv1alpha1.MeshConfig{ConfigSources: []*meshv1alpha1.ConfigSource{
		{Address: "fs:///etc/sailplane/config"},
		{Address: "fs://conf/extra"},
		{Address: "k8s://"},
		{Address: "xds://istiod:15010"},
	}}
	dirs, err := ConfigSourceDirs(m, "/base")
	if len(dirs) != 2 || dirs[0] != "/etc/sailplane/config" || dirs[1] != "/base/conf/extra" {
		t.Fatalf("dirs = %v", dirs)
	}
	var ue *UnsupportedSourcesError
	if !errors.As(err, &ue) || len(ue.Addresses) != 1 || ue.Addresses[0] != "k8s://" || !strings.Contains(err.Error(), "not supported") {
		t.Fatalf("err = %v", err)
	}
	// No configSources: the conf folder beside the mesh file, as `hyper` with no flags expects.
	if dirs, err := ConfigSourceDirs(Default(), "/base"); err != nil || len(dirs) != 1 || dirs[0] != "/base/conf" {
		t.Fatalf("default: %v %v", dirs, err)
	}
	// Only unsupported sources: no folder, and the error says why.
	m = &meshv1alpha1.MeshConfig{ConfigSources: []*meshv1alpha1.ConfigSource{{Address: "k8s://"}}}
	if dirs, err := ConfigSourceDirs(m, "/base"); !errors.As(err, &ue) || len(dirs) != 0 {
		t.Fatalf("unsupported only: %v %v", dirs, err)
	}
}

func TestXDSSources(t *testing.T) {
	m := &meshv1alpha1.MeshConfig{ConfigSources: []*meshv1alpha1.ConfigSource{
		{Address: "fs://conf"},
		{Address: "xds://istiod.istio-system:15012", TlsSettings: &networking.ClientTLSSettings{Mode: networking.ClientTLSSettings_ISTIO_MUTUAL}},
		{Address: "xds://[::1]:15010"},
		{Address: "xds://no-port"},
		{Address: "xds://host:1/path"},
	}}
	got, err := XDSSources(m)
	if len(got) != 2 || got[0].Target != "istiod.istio-system:15012" || got[0].TLS.GetMode() != networking.ClientTLSSettings_ISTIO_MUTUAL ||
		got[1].Target != "[::1]:15010" || got[1].Address != "xds://[::1]:15010" || got[1].TLS != nil {
		t.Fatalf("sources = %+v", got)
	}
	var ue *UnsupportedSourcesError
	if !errors.As(err, &ue) || !slices.Equal(ue.Addresses, []string{"xds://no-port", "xds://host:1/path"}) {
		t.Fatalf("err = %v", err)
	}
}

// eventually waits for cond, failing the test after a deadline.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testwait.Until(t, 10*time.Second, what, cond)
}

func TestWatcher(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "mesh.yaml")
	write(t, p, "rootNamespace: one\n")

	var mu sync.Mutex
	var got []string
	w := NewWatcher(p, func(m *meshv1alpha1.MeshConfig) {
		mu.Lock()
		got = append(got, m.RootNamespace)
		mu.Unlock()
	}, WithLogger(testLogger(t)), WithDebounce(20*time.Millisecond))
	last := func() string {
		mu.Lock()
		defer mu.Unlock()
		if len(got) == 0 {
			return ""
		}
		return got[len(got)-1]
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	eventually(t, "initial config", func() bool { return last() == "one" })

	// In-place write.
	write(t, p, "rootNamespace: two\n")
	eventually(t, "in-place write", func() bool { return last() == "two" })

	// Editor-style: write a temp file and rename it over the original.
	tmp := filepath.Join(dir, ".mesh.yaml.swp")
	write(t, tmp, "rootNamespace: three\n")
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	eventually(t, "rename write", func() bool { return last() == "three" })

	// A broken file keeps the last good config; the next good one is picked up.
	write(t, p, "rootNamespace: [broken\n")
	write(t, filepath.Join(dir, "marker"), "x") // an unrelated event after the broken write
	write(t, p, "rootNamespace: four\n")
	eventually(t, "recovery", func() bool { return last() == "four" })
	mu.Lock()
	for _, ns := range got {
		if ns != "one" && ns != "two" && ns != "three" && ns != "four" {
			t.Errorf("callback got %q", ns)
		}
	}
	mu.Unlock()
	if w.Current().RootNamespace != "four" {
		t.Fatalf("current = %v", w.Current())
	}
}

// runWatcher runs a Watcher of p until stop, which checks Run's result; it returns the root
// namespaces handed to the callback and the reload errors, in order.
func runWatcher(t *testing.T, p string, opts ...WatcherOption) (w *Watcher, calls chan string, reloadErrs chan error, stop func()) {
	t.Helper()
	calls, reloadErrs = make(chan string, 10), make(chan error, 10)
	opts = append([]WatcherOption{WithLogger(testLogger(t)), WithDebounce(10 * time.Millisecond),
		WithReloadErrors(func(err error) { reloadErrs <- err })}, opts...)
	w = NewWatcher(p, func(m *meshv1alpha1.MeshConfig) { calls <- m.RootNamespace }, opts...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	return w, calls, reloadErrs, func() {
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

func TestWatcherKeepsLastGood(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "mesh.yaml")
	write(t, p, "rootNamespace: good\n")
	w, calls, reloadErrs, stop := runWatcher(t, p)
	if ns := <-calls; ns != "good" {
		t.Fatalf("first = %q", ns)
	}
	write(t, p, "rootNamespace: {bad: map}\n")
	for err := range reloadErrs {
		if err != nil {
			if !strings.Contains(err.Error(), "rootNamespace") {
				t.Fatalf("reload error %v does not name the field", err)
			}
			break
		}
	}
	if w.Current().RootNamespace != "good" {
		t.Fatal("bad file replaced the config")
	}
	// An empty file is a write in progress: no callback, no error, the config stays.
	write(t, p, "")
	// A valid but identical write must not call back, a different one must.
	write(t, p, "rootNamespace: good\n")
	write(t, p, "rootNamespace: better\n")
	if ns := <-calls; ns != "better" {
		t.Fatalf("second = %q", ns)
	}
	stop()
	if w.Current().RootNamespace != "better" {
		t.Fatal(w.Current())
	}
}

// A mesh file that is empty from the start holds Istio's defaults: reloads of it change
// nothing and report no problem. Once it had content, emptying it is a write in progress.
func TestWatcherEmptyAtStart(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "mesh.yaml")
	write(t, p, "")
	_, calls, reloadErrs, stop := runWatcher(t, p)
	if ns := <-calls; ns != "istio-system" {
		t.Fatalf("first = %q, want the defaults", ns)
	}
	write(t, p, "\n") // still empty: reloaded as the defaults, without error
	if err := <-reloadErrs; err != nil {
		t.Fatalf("reload of an empty mesh file: %v", err)
	}
	write(t, p, "rootNamespace: set\n")
	if ns := <-calls; ns != "set" {
		t.Fatalf("second = %q", ns)
	}
	<-reloadErrs
	// Emptied after it had content: a write in progress, the config stays (no reload at all).
	write(t, p, "")
	write(t, filepath.Join(dir, "marker"), "x")
	write(t, p, "rootNamespace: again\n")
	if ns := <-calls; ns != "again" {
		t.Fatalf("third = %q", ns)
	}
	stop()
}

// With a fallback, a mesh file that cannot be loaded at start is reported, the fallback used,
// and the file reloaded once fixed.
func TestWatcherFallback(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "mesh.yaml")
	write(t, p, "nope: 1\n")
	fallback := Default()
	fallback.RootNamespace = "saved"
	_, calls, reloadErrs, stop := runWatcher(t, p, WithFallback(fallback))
	if err := <-reloadErrs; err == nil || !strings.Contains(err.Error(), `unknown field "nope"`) {
		t.Fatalf("start error = %v", err)
	}
	if ns := <-calls; ns != "saved" {
		t.Fatalf("first = %q, want the fallback", ns)
	}
	write(t, p, "rootNamespace: fixed\n")
	if ns := <-calls; ns != "fixed" {
		t.Fatalf("second = %q", ns)
	}
	stop()
}

func TestWatcherInitialError(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "mesh.yaml")
	write(t, p, "nope: 1\n")
	err := NewWatcher(p, func(*meshv1alpha1.MeshConfig) { t.Error("called") }).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), `unknown field "nope"`) {
		t.Fatalf("err = %v", err)
	}
}

// A mesh file whose folder is missing is an error naming the file (fsnotify's names no path).
func TestWatcherMissingFolder(t *testing.T) {
	p := filepath.Join(t.TempDir(), "etc/sailplane/mesh.yaml")
	err := NewWatcher(p, func(*meshv1alpha1.MeshConfig) { t.Error("called") }).Run(context.Background())
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), p) {
		t.Fatalf("err = %v, want one naming %s", err, p)
	}
}

func TestRoot(t *testing.T) {
	for _, tc := range []struct{ mesh, want string }{
		{"", "."},
		{"etc/sailplane/mesh.yaml", "."},
		{"./etc/sailplane/mesh.yaml", "."},
		{"/srv/a/etc/sailplane/mesh.yaml", "/srv/a"},
		{"/etc/sailplane/mesh.yaml", "/"},
		{"b/etc/sailplane/other.yaml", "b"},
		{"/tmp/x/mesh.yaml", "/tmp/x"},
		{"mesh.yaml", "."},
		{"/srv/notetc/sailplane/mesh.yaml", "/srv/notetc/sailplane"},
	} {
		if got := Root(tc.mesh); got != tc.want {
			t.Errorf("Root(%q) = %q, want %q", tc.mesh, got, tc.want)
		}
	}
}

func TestParseNetworks(t *testing.T) {
	m, err := ParseNetworks([]byte(`
networks:
  net1:
    endpoints: [{fromRegistry: cluster1}, {fromCidr: 10.1.0.0/16}, {fromRegistry: Kubernetes}]
    gateways: [{address: 198.18.1.1, port: 15443}, {registryServiceName: istio-eastwestgateway.istio-system.svc.cluster.local, port: 15443}]
`))
	if err != nil {
		t.Fatal(err)
	}
	nw := m.GetNetworks()["net1"]
	if nw.GetEndpoints()[0].GetFromRegistry() != "cluster1" || nw.GetEndpoints()[1].GetFromCidr() != "10.1.0.0/16" ||
		nw.GetGateways()[0].GetAddress() != "198.18.1.1" || nw.GetGateways()[1].GetPort() != 15443 {
		t.Errorf("ParseNetworks = %v", m)
	}
	if m, err := ParseNetworks([]byte("  \n")); m != nil || err != nil {
		t.Errorf("empty: %v, %v; want nil, nil", m, err)
	}
	for _, tc := range []struct{ in, want string }{
		{`networks: {net9: {endpoints: [{fromCidr: 10.1.0.0}]}}`, "networks.net9.endpoints[0].fromCidr"},
		{`networks: {net9: {endpoints: [{fromRegistry: Not_A_Label}]}}`, "networks.net9.endpoints[0].fromRegistry"},
		{`networks: {net9: {gateways: [{address: gw.example.com, port: 15443}]}}`, "networks.net9.gateways[0].address"},
		{`networks: {net9: {gateways: [{address: 198.18.1.1}]}}`, "networks.net9.gateways[0].port"},
		{`networks: {net9: {gateways: [{registryServiceName: "a b", port: 1}]}}`, "networks.net9.gateways[0].registryServiceName"},
		{`networks: {net9: {endpoint: []}}`, "endpoint"},
	} {
		if _, err := ParseNetworks([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseNetworks(%s) = %v, want an error naming %s", tc.in, err, tc.want)
		}
	}
}
