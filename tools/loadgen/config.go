package loadgen

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Mesh is the generated mesh: Services services in Namespace, each with Endpoints workloads
// (WorkloadEntry) on HTTP port 8080, selected by a ServiceEntry.
type Mesh struct {
	Namespace string
	Services  int
	Endpoints int
}

// ServicePort is the port every generated service serves HTTP on.
const ServicePort = 8080

// Host is the hostname of service i.
func (m Mesh) Host(i int) string {
	return fmt.Sprintf("svc-%d.%s.svc.cluster.local", i, m.Namespace)
}

// Cluster is Envoy's outbound cluster (and EDS) name of service i.
func (m Mesh) Cluster(i int) string {
	return fmt.Sprintf("outbound|%d||%s", ServicePort, m.Host(i))
}

// ServiceOf is the service whose workload proxy i is (proxies beyond the workloads wrap).
func (m Mesh) ServiceOf(proxy int) int {
	return (proxy % (m.Services * m.Endpoints)) / m.Endpoints
}

// Labels are the workload labels of proxy i, as its pod would carry them.
func (m Mesh) Labels(proxy int) map[string]string {
	return map[string]string{"app": fmt.Sprintf("svc-%d", m.ServiceOf(proxy)), "version": "v1"}
}

// IPOf is the address of proxy i: workload i of the mesh.
func (m Mesh) IPOf(proxy int) string { return ProxyIP(proxy % (m.Services * m.Endpoints)) }

// MeshFile is the mesh config, relative to the config folder.
const MeshFile = "mesh.yaml"

// Write creates dir/mesh.yaml and dir/conf/ with the services, 100 per file.
func (m Mesh) Write(dir string) error {
	if err := os.MkdirAll(filepath.Join(dir, "conf"), 0o755); err != nil {
		return err
	}
	mesh := "rootNamespace: istio-system\nconfigSources:\n  - address: fs://conf\n"
	if err := os.WriteFile(filepath.Join(dir, MeshFile), []byte(mesh), 0o644); err != nil {
		return err
	}
	const perFile = 100
	for start := 0; start < m.Services; start += perFile {
		var b strings.Builder
		for i := start; i < min(start+perFile, m.Services); i++ {
			fmt.Fprintf(&b, `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: svc-%d, namespace: %s}
spec:
  hosts: [%s]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{name: http, number: %d, protocol: HTTP}]
  workloadSelector: {labels: {app: svc-%d}}
---
`, i, m.Namespace, m.Host(i), ServicePort, i)
			for e := range m.Endpoints {
				fmt.Fprintf(&b, `apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: svc-%d-%d, namespace: %s}
spec: {address: %s, labels: {app: svc-%d, version: v1}, serviceAccount: default}
---
`, i, e, m.Namespace, ProxyIP(i*m.Endpoints+e), i)
			}
		}
		name := filepath.Join(dir, "conf", fmt.Sprintf("services-%04d.yaml", start/perFile))
		if err := os.WriteFile(name, []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// RouteMarkerYAML is a VirtualService on service svc whose first route matches a header
// carrying value: the value shows up in the RDS of every proxy that can reach svc.
func (m Mesh) RouteMarkerYAML(svc int, value string) string {
	return fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: loadgen-marker, namespace: %s}
spec:
  hosts: [%s]
  http:
    - match: [{headers: {x-loadgen-marker: {exact: %q}}}]
      route: [{destination: {host: %s}}]
    - route: [{destination: {host: %s}}]
`, m.Namespace, m.Host(svc), value, m.Host(svc), m.Host(svc))
}

// EndpointMarkerYAML is one more workload of service svc at address ip.
func (m Mesh) EndpointMarkerYAML(svc int, ip string) string {
	return fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: loadgen-marker, namespace: %s}
spec: {address: %s, labels: {app: svc-%d, version: v1}, serviceAccount: default}
`, m.Namespace, ip, svc)
}

// MarkerIP is the address of the n-th endpoint marker: 198.19.255.0/24, outside the workloads.
func MarkerIP(n int) string { return fmt.Sprintf("198.19.255.%d", 1+n%250) }

// WriteAtomic replaces dir/conf/name with content in one rename, so a watcher never reads half.
func WriteAtomic(dir, name, content string) error {
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "conf", name))
}
