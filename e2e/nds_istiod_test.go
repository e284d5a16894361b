package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sailplane.dev/e2e/framework"
	ndsv1 "sailplane.dev/proto/istio/networking/nds/v1"
	"sailplane.dev/shared/xdstype"
	"sailplane.dev/tools/testenv"
)

// ndsObjects: a ClusterIP service, a headless service of two StatefulSet-style pods (spec
// hostname and subdomain, one hostname not the pod's name) and a pod without subdomain (which
// gets no name of its own), a ServiceEntry with an address and one without.
const ndsObjects = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: mysql, namespace: demo}
spec:
  clusterIP: None
  selector: {app: mysql}
  ports: [{name: tcp-mysql, port: 3306}]
---
apiVersion: v1
kind: Pod
metadata: {name: mysql-0, namespace: demo, labels: {app: mysql}}
spec: {hostname: mysql-0, subdomain: mysql, containers: [{name: c, image: x}]}
---
apiVersion: v1
kind: Pod
metadata: {name: mysql-1, namespace: demo, labels: {app: mysql}}
spec: {hostname: replica-1, subdomain: mysql, containers: [{name: c, image: x}]}
---
apiVersion: v1
kind: Pod
metadata: {name: mysql-adhoc, namespace: demo, labels: {app: mysql}}
spec: {containers: [{name: c, image: x}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: mysql-1a, namespace: demo, labels: {kubernetes.io/service-name: mysql}}
addressType: IPv4
ports: [{name: tcp-mysql, port: 3306, protocol: TCP}]
endpoints:
- addresses: [198.18.0.11]
  hostname: mysql-0
  conditions: {ready: true, serving: true, terminating: false}
  targetRef: {kind: Pod, namespace: demo, name: mysql-0}
- addresses: [198.18.0.12]
  hostname: replica-1
  conditions: {ready: true, serving: true, terminating: false}
  targetRef: {kind: Pod, namespace: demo, name: mysql-1}
- addresses: [198.18.0.13]
  conditions: {ready: true, serving: true, terminating: false}
  targetRef: {kind: Pod, namespace: demo, name: mysql-adhoc}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db, namespace: demo}
spec:
  hosts: [db.corp.example]
  addresses: [192.0.2.10]
  resolution: STATIC
  ports: [{name: tcp-pg, number: 5432, protocol: TCP}]
  endpoints: [{address: 192.0.2.11}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: partner, namespace: demo}
spec:
  hosts: [api.partner.example]
  resolution: DNS
  location: MESH_EXTERNAL
  ports: [{name: tls, number: 443, protocol: TLS}]
`

// TestNameTableMatchesIstiod: istiod and hyper read the same API server; the name table each
// sends a sidecar capturing DNS, and one not capturing, is the same, host for host, but for
// the auto-allocated address of the ServiceEntry without one: istiod's allocator hands out
// 240.240.0.1 upwards in creation order and writes them in the ServiceEntry's status, ours
// derives them from the host (see ndsgen.Allocator); both are in 240.240.0.0/16.
func TestNameTableMatchesIstiod(t *testing.T) {
	k := testenv.KubeForTest(t)
	kube := framework.NewKube(t, k.RestConfig())
	kube.Apply(t, ndsObjects)
	for i, pod := range []string{"mysql-0", "mysql-1"} {
		ip := "198.18.0." + strconv.Itoa(11+i)
		p, err := kube.Clientset.CoreV1().Pods("demo").Get(context.Background(), pod, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}, {Type: corev1.ContainersReady, Status: corev1.ConditionTrue}}}
		if _, err := kube.Clientset.CoreV1().Pods("demo").UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	istiod := testenv.IstiodForTest(t, k, "rootNamespace: istio-system\n").XDSAddr()
	ours := startHyperOnKube(t, k, kube).xds

	for _, capture := range []bool{true, false} {
		t.Run(fmt.Sprintf("dns_capture=%v", capture), func(t *testing.T) {
			var ref, got *ndsv1.NameTable
			// istiod allocates the ServiceEntry's address shortly after it starts, and both
			// read the API server asynchronously: wait until the tables agree.
			framework.Eventually(t, 60*time.Second, func() error {
				var err error
				if ref, err = fetchNameTable(istiod, capture); err != nil {
					return fmt.Errorf("istiod: %w", err)
				}
				if got, err = fetchNameTable(ours, capture); err != nil {
					return fmt.Errorf("sailplane: %w", err)
				}
				return sameNameTables(ref, got, capture)
			})
		})
	}
}

// sameNameTables compares two tables, the auto-allocated addresses only by their range.
func sameNameTables(ref, got *ndsv1.NameTable, capture bool) error {
	auto := netip.MustParsePrefix("240.240.0.0/16")
	norm := func(nt *ndsv1.NameTable) *ndsv1.NameTable {
		out := proto.Clone(nt).(*ndsv1.NameTable)
		for _, info := range out.GetTable() {
			for i, ip := range info.GetIps() {
				if a, err := netip.ParseAddr(ip); err == nil && auto.Contains(a) {
					info.Ips[i] = "auto-allocated"
				}
			}
		}
		return out
	}
	r, g := norm(ref), norm(got)
	if !proto.Equal(r, g) {
		return fmt.Errorf("name tables differ:\nistiod:    %s\nsailplane: %s", protojson.Format(ref), protojson.Format(got))
	}
	// The comparison must cover the cases it is about.
	for _, host := range []string{"web.demo.svc.cluster.local", "mysql.demo.svc.cluster.local", "mysql-0.mysql.demo.svc.cluster.local", "db.corp.example"} {
		if r.GetTable()[host] == nil {
			return fmt.Errorf("istiod's table has no %s yet", host)
		}
	}
	if _, ok := r.GetTable()["api.partner.example"]; ok != capture {
		return fmt.Errorf("istiod's table has api.partner.example: %v, want %v", ok, capture)
	}
	return nil
}

// fetchNameTable asks addr for the name table of a sidecar of namespace demo.
func fetchNameTable(addr string, capture bool) (*ndsv1.NameTable, error) {
	md := map[string]any{"NAMESPACE": "demo", "CLUSTER_ID": "Kubernetes", "ISTIO_VERSION": "1.29.0"}
	if capture {
		md["DNS_CAPTURE"] = "true"
	}
	return nameTableOf(addr, framework.XDSNode{ID: "sidecar~198.18.0.5~web-0.demo~demo.svc.cluster.local", Metadata: md})
}

// nameTableOf asks addr for node's name table.
func nameTableOf(addr string, node framework.XDSNode) (*ndsv1.NameTable, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	s, err := structpb.NewStruct(node.Metadata)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	req := &discoveryv3.DiscoveryRequest{Node: &corev3.Node{Id: node.ID, Metadata: s}, TypeUrl: xdstype.NameTable}
	if err := stream.Send(req); err != nil {
		return nil, err
	}
	resp, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	if len(resp.GetResources()) != 1 {
		return nil, fmt.Errorf("%d resources, want one name table", len(resp.GetResources()))
	}
	nt := &ndsv1.NameTable{}
	return nt, resp.GetResources()[0].UnmarshalTo(nt)
}
