package xdsserver

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/shared/monitoring"
	"sailplane.dev/shared/schema"
	"sailplane.dev/shared/xdstype"
)

// Debug is what the server shows on the monitoring port: istiod's JSON debug endpoints, in
// istiod's shapes (what Kiali and scripts written for istiod parse), and the status page's
// proxies and convergence chart.
func (s *Server) Debug() monitoring.Debug {
	return monitoring.Debug{
		Endpoints: map[string]http.Handler{
			"/debug/syncz":       http.HandlerFunc(s.serveSyncz),
			"/debug/config_dump": http.HandlerFunc(s.serveConfigDump),
			"/debug/adsz":        http.HandlerFunc(s.serveAdsz),
			"/debug/registryz":   http.HandlerFunc(s.serveRegistryz),
			"/debug/configz":     http.HandlerFunc(s.serveConfigz),
			"/debug/mesh":        http.HandlerFunc(s.serveMesh),
			"/debug/push_status": http.HandlerFunc(s.servePushStatus),
		},
		Status: monitoring.StatusSources{Proxies: s.statusProxies, Pushes: s.pushes.list},
	}
}

// syncStatus is istiod's /debug/syncz entry: each core type's last nonce sent and ACKed (equal
// when SYNCED), and every watched type's under resources.
type syncStatus struct {
	ClusterID            string                    `json:"cluster_id,omitempty"`
	ProxyID              string                    `json:"proxy,omitempty"`
	ProxyType            string                    `json:"proxy_type,omitempty"`
	ProxyVersion         string                    `json:"proxy_version,omitempty"`
	IstioVersion         string                    `json:"istio_version,omitempty"`
	ClusterSent          string                    `json:"cluster_sent,omitempty"`
	ClusterAcked         string                    `json:"cluster_acked,omitempty"`
	ListenerSent         string                    `json:"listener_sent,omitempty"`
	ListenerAcked        string                    `json:"listener_acked,omitempty"`
	RouteSent            string                    `json:"route_sent,omitempty"`
	RouteAcked           string                    `json:"route_acked,omitempty"`
	EndpointSent         string                    `json:"endpoint_sent,omitempty"`
	EndpointAcked        string                    `json:"endpoint_acked,omitempty"`
	ExtensionConfigSent  string                    `json:"extensionconfig_sent,omitempty"`
	ExtensionConfigAcked string                    `json:"extensionconfig_acked,omitempty"`
	Resources            map[string]resourceStatus `json:"resources,omitempty"`
}

// resourceStatus is istiod's, plus the status Sailplane computes (SYNCED, STALE, NOT_SENT,
// ERROR).
type resourceStatus struct {
	Sent      string    `json:"sent,omitempty"`
	Acked     string    `json:"acked,omitempty"`
	SentTime  time.Time `json:"sentTime,omitzero"`
	LastError string    `json:"lastError,omitempty"`
	Status    string    `json:"status,omitempty"`
}

// serveSyncz lists every connected proxy's sync status (?namespace= keeps one namespace's).
func (s *Server) serveSyncz(w http.ResponseWriter, r *http.Request) {
	ns := r.URL.Query().Get("namespace")
	out := []syncStatus{}
	for _, ps := range s.xds.Proxies() {
		p := ps.Proxy
		if ns != "" && p.Namespace != ns {
			continue
		}
		st := syncStatus{ClusterID: p.ClusterID, ProxyID: p.ID, ProxyType: nodeType(p), IstioVersion: p.IstioVersion,
			Resources: map[string]resourceStatus{}}
		for _, ws := range ps.Watches {
			st.Resources[ws.TypeURL] = resourceStatus{Sent: ws.SentNonce, Acked: ws.AckedNonce, SentTime: ws.SentAt,
				LastError: ws.NackError, Status: ws.Status.String()}
			sent, acked := map[string][2]*string{
				resourcev3.ClusterType:         {&st.ClusterSent, &st.ClusterAcked},
				resourcev3.ListenerType:        {&st.ListenerSent, &st.ListenerAcked},
				resourcev3.RouteType:           {&st.RouteSent, &st.RouteAcked},
				resourcev3.EndpointType:        {&st.EndpointSent, &st.EndpointAcked},
				resourcev3.ExtensionConfigType: {&st.ExtensionConfigSent, &st.ExtensionConfigAcked},
			}[ws.TypeURL], true
			if sent[0] != nil && acked {
				*sent[0], *sent[1] = ws.SentNonce, ws.AckedNonce
			}
		}
		out = append(out, st)
	}
	monitoring.WriteJSON(w, r, out)
}

// nodeType is the node ID's first part (sidecar, router), as istiod reports a proxy's type.
func nodeType(p *model.Proxy) string {
	t, _, _ := strings.Cut(p.NodeID, "~")
	return t
}

// serveConfigDump answers ?proxyID=<pod>.<namespace> (or the node ID) with what that proxy
// holds, as Envoy's admin config dump (secrets without key material); 404 when the proxy is not
// connected to this server.
func (s *Server) serveConfigDump(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("proxyID")
	if id == "" {
		http.Error(w, "You must provide a proxyID in the query string", http.StatusBadRequest)
		return
	}
	dump, err := s.xds.ConfigDump(r.Context(), id)
	switch {
	case err != nil:
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	case dump == nil:
		http.Error(w, "Proxy not connected to this server. It may be connected to another replica.", http.StatusNotFound)
		return
	}
	writeProto(w, r, dump)
}

// adszClient is istiod's /debug/adsz entry.
type adszClient struct {
	ConnectionID string              `json:"connectionId"`
	ConnectedAt  time.Time           `json:"connectedAt"`
	PeerAddress  string              `json:"address"`
	Labels       map[string]string   `json:"labels,omitempty"`
	Metadata     map[string]any      `json:"metadata,omitempty"`
	Locality     *locality           `json:"locality,omitempty"`
	Watches      map[string][]string `json:"watches,omitempty"`
}

type locality struct {
	Region  string `json:"region,omitempty"`
	Zone    string `json:"zone,omitempty"`
	SubZone string `json:"sub_zone,omitempty"`
}

type adszClients struct {
	Total     int          `json:"totalClients"`
	Connected []adszClient `json:"clients,omitempty"`
}

// serveAdsz lists the connected proxies with their metadata and subscriptions (?proxyID= one).
// With ?push=true it instead pushes the current state again to every proxy, even what they
// hold unchanged, and answers as istiod does.
func (s *Server) serveAdsz(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("push") != "" {
		fmt.Fprintf(w, "Pushed to %d servers\n", s.xds.PushAll())
		return
	}
	id := r.URL.Query().Get("proxyID")
	out := adszClients{}
	for _, ps := range s.xds.Proxies() {
		p := ps.Proxy
		if id != "" && p.ID != id && p.NodeID != id {
			continue
		}
		c := adszClient{
			ConnectionID: fmt.Sprintf("%s-%d", p.ID, ps.Conn), ConnectedAt: ps.ConnectedAt, PeerAddress: ps.Address,
			Labels: p.Labels, Metadata: nodeMetadata(p), Watches: map[string][]string{},
		}
		if l := p.NodeLocality; l != nil {
			c.Locality = &locality{Region: l.GetRegion(), Zone: l.GetZone(), SubZone: l.GetSubZone()}
		}
		for _, ws := range ps.Watches {
			c.Watches[ws.TypeURL] = append([]string{}, ws.Names...)
		}
		out.Connected = append(out.Connected, c)
	}
	if id != "" && len(out.Connected) == 0 {
		http.Error(w, "Proxy not connected to this server. It may be connected to another replica.", http.StatusNotFound)
		return
	}
	out.Total = len(out.Connected)
	monitoring.WriteJSON(w, r, out)
}

// nodeMetadata is the proxy's metadata under Istio's keys, as istiod's adsz shows it.
func nodeMetadata(p *model.Proxy) map[string]any {
	md := map[string]any{"NAMESPACE": p.Namespace, "CLUSTER_ID": p.ClusterID}
	for k, v := range map[string]string{"ISTIO_VERSION": p.IstioVersion, "SERVICE_ACCOUNT": p.ServiceAccount,
		"GENERATOR": p.Generator, "NETWORK": p.Network, "INSTANCE_IPS": strings.Join(p.IPs, ",")} {
		if v != "" {
			md[k] = v
		}
	}
	if len(p.Labels) > 0 {
		md["LABELS"] = p.Labels
	}
	return md
}

// registryService is istiod's model.Service as /debug/registryz shows it.
type registryService struct {
	Attributes      serviceAttributes `json:"Attributes"`
	Ports           []servicePort     `json:"ports,omitempty"`
	ServiceAccounts []string          `json:"serviceAccounts,omitempty"`
	Hostname        string            `json:"hostname"`
	ClusterVIPs     *addressMap       `json:"clusterVIPs,omitempty"`
	DefaultAddress  string            `json:"defaultAddress,omitempty"`
	Resolution      int               `json:"Resolution"`
	MeshExternal    bool              `json:"MeshExternal"`
	ResourceVersion string            `json:"ResourceVersion"`
}

type serviceAttributes struct {
	ServiceRegistry string              `json:"ServiceRegistry"`
	Name            string              `json:"Name"`
	Namespace       string              `json:"Namespace"`
	Labels          map[string]string   `json:"Labels"`
	ExportTo        map[string]struct{} `json:"ExportTo"`
}

type servicePort struct {
	Name     string `json:"name,omitempty"`
	Port     int    `json:"port"`
	Protocol string `json:"protocol,omitempty"`
}

type addressMap struct {
	Addresses map[string][]string `json:"Addresses"`
}

// Istio's names of the registries endpoint-watcher reads, and its resolution numbers.
var (
	istioRegistry   = map[string]string{"kubernetes": "Kubernetes", "serviceentry": "External", "consul": "Consul"}
	istioResolution = map[discoveryv1.Resolution]int{
		discoveryv1.Resolution_STATIC: 0, discoveryv1.Resolution_DNS: 1, discoveryv1.Resolution_NONE: 2, discoveryv1.Resolution_DNS_ROUND_ROBIN: 3,
	}
)

// serveRegistryz lists the services this server serves from, as istiod's registry shows them.
func (s *Server) serveRegistryz(w http.ResponseWriter, r *http.Request) {
	out := []registryService{}
	snap := s.servedSnapshot()
	for _, h := range snap.Hostnames() {
		svc := snap.Services[h]
		spec := svc.Spec
		rs := registryService{
			Attributes: serviceAttributes{
				ServiceRegistry: cmp.Or(istioRegistry[spec.GetRegistry()], spec.GetRegistry()),
				Name:            h, Namespace: spec.GetNamespace(), Labels: spec.GetLabels(),
			},
			ServiceAccounts: spec.GetSubjectAltNames(),
			Hostname:        h,
			DefaultAddress:  "0.0.0.0",
			Resolution:      istioResolution[spec.GetResolution()],
			MeshExternal:    spec.GetMeshExternal(),
			ResourceVersion: fmt.Sprint(svc.EndpointsVersion),
		}
		if spec.GetRegistry() == "kubernetes" {
			rs.Attributes.Name, _, _ = strings.Cut(h, ".")
		}
		if len(spec.GetExportTo()) > 0 {
			rs.Attributes.ExportTo = map[string]struct{}{}
			for _, e := range spec.GetExportTo() {
				rs.Attributes.ExportTo[e] = struct{}{}
			}
		}
		if addrs := spec.GetAddresses(); len(addrs) > 0 {
			rs.DefaultAddress = addrs[0]
			rs.ClusterVIPs = &addressMap{Addresses: map[string][]string{cmp.Or(spec.GetClusterId(), model.DefaultClusterID): addrs}}
		}
		for _, p := range spec.GetPorts() {
			rs.Ports = append(rs.Ports, servicePort{Name: p.GetName(), Port: int(p.GetNumber()), Protocol: cmp.Or(p.GetProtocol(), "UnsupportedProtocol")})
		}
		out = append(out, rs)
	}
	monitoring.WriteJSON(w, r, out)
}

// servedSnapshot is the snapshot last pushed, else (before the first push) an empty one.
func (s *Server) servedSnapshot() *model.Snapshot {
	if snap := s.xds.Snapshot(); snap != nil {
		return snap
	}
	return &model.Snapshot{}
}

// kubeObject is a config resource as the Kubernetes API shows it, as istiod's configz does.
type kubeObject struct {
	Kind       string          `json:"kind"`
	APIVersion string          `json:"apiVersion"`
	Metadata   objectMeta      `json:"metadata"`
	Spec       json.RawMessage `json:"spec"`
}

type objectMeta struct {
	Name              string            `json:"name"`
	Namespace         string            `json:"namespace,omitempty"`
	ResourceVersion   string            `json:"resourceVersion,omitempty"`
	CreationTimestamp time.Time         `json:"creationTimestamp,omitzero"`
	Labels            map[string]string `json:"labels,omitempty"`
	Annotations       map[string]string `json:"annotations,omitempty"`
}

// serveConfigz lists the Istio and Gateway API config this server holds (what xDS is built from;
// ServiceEntries are held only by name, for Gateway API parentRefs, and with WorkloadEntries
// reach it as registry services, see registryz), in Kubernetes form.
func (s *Server) serveConfigz(w http.ResponseWriter, r *http.Request) {
	out := []kubeObject{}
	for _, kind := range model.ConfigKinds {
		if kind.TypeURL == schema.MeshConfig.TypeURL {
			continue // /debug/mesh
		}
		for _, res := range s.store.Resources(kind.TypeURL) {
			spec, err := protojson.Marshal(res.Body)
			if err != nil {
				http.Error(w, fmt.Sprintf("encoding %s %s: %v", kind.Kind, res.Name, err), http.StatusInternalServerError)
				return
			}
			ns, name := schema.SplitName(res.Name)
			out = append(out, kubeObject{Kind: kind.Kind, APIVersion: kind.APIVersion(), Spec: spec, Metadata: objectMeta{
				Name: name, Namespace: ns, ResourceVersion: res.Version, CreationTimestamp: res.CreateTime,
				Labels: res.Labels, Annotations: res.Annotations,
			}})
		}
	}
	monitoring.WriteJSON(w, r, out)
}

// serveMesh is the mesh config this server serves with, as istiod's /debug/mesh.
func (s *Server) serveMesh(w http.ResponseWriter, r *http.Request) {
	writeProto(w, r, s.servedSnapshot().Mesh)
}

// writeProto writes m as protobuf JSON, indented with ?pretty.
func writeProto(w http.ResponseWriter, r *http.Request, m proto.Message) {
	opts := protojson.MarshalOptions{}
	if r.URL.Query().Has("pretty") {
		opts.Indent = "  "
	}
	b, err := opts.Marshal(m)
	if err != nil {
		http.Error(w, fmt.Sprintf("encoding %s: %v", r.URL.Path, err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

// statusProxies are the connected proxies for the status page.
func (s *Server) statusProxies() []monitoring.ProxyStatus {
	var out []monitoring.ProxyStatus
	for _, ps := range s.xds.Proxies() {
		p := ps.Proxy
		st := monitoring.ProxyStatus{ID: p.ID, NodeID: p.NodeID, Type: string(p.Type), Cluster: p.ClusterID,
			Version: p.IstioVersion, ConnectedAt: ps.ConnectedAt}
		for _, ws := range ps.Watches {
			st.Watches = append(st.Watches, monitoring.WatchStatus{Type: xdstype.Short(ws.TypeURL), TypeURL: ws.TypeURL,
				State: watchState(ws.Status), Version: ws.SentVersion, Error: ws.NackError})
		}
		out = append(out, st)
	}
	return out
}

func watchState(s statusv3.ConfigStatus) string {
	switch s {
	case statusv3.ConfigStatus_SYNCED:
		return monitoring.Synced
	case statusv3.ConfigStatus_ERROR:
		return monitoring.Nacked
	case statusv3.ConfigStatus_NOT_SENT:
		return monitoring.NotSent
	default:
		return monitoring.Stale
	}
}
