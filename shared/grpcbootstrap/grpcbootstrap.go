// Package grpcbootstrap writes the bootstrap file gRPC's xDS support reads from
// $GRPC_XDS_BOOTSTRAP, in the form Istio's agent writes for proxyless gRPC: xDS servers, the node
// as istiod knows it, and the certificate providers xDS credentials use for mTLS.
package grpcbootstrap

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// Bootstrap is the file's content.
type Bootstrap struct {
	XDSServers           []XDSServer                    `json:"xds_servers"`
	Node                 Node                           `json:"node"`
	CertificateProviders map[string]CertificateProvider `json:"certificate_providers,omitempty"`
	// ServerListenerResourceNameTemplate names the listener an xDS-enabled gRPC server asks for.
	ServerListenerResourceNameTemplate string `json:"server_listener_resource_name_template,omitempty"`
}

// XDSServer is one management server.
type XDSServer struct {
	ServerURI      string         `json:"server_uri"`
	ChannelCreds   []ChannelCreds `json:"channel_creds"`
	ServerFeatures []string       `json:"server_features"`
}

// ChannelCreds are the credentials of the channel to an xDS server: "insecure", or "tls" with
// a TLSCreds config (gRFC A65).
type ChannelCreds struct {
	Type   string `json:"type"`
	Config any    `json:"config,omitempty"`
}

// TLSCreds is the config of "tls" channel credentials: mTLS with files that gRPC re-reads.
type TLSCreds struct {
	CACertificateFile string `json:"ca_certificate_file"`
	CertificateFile   string `json:"certificate_file,omitempty"`
	PrivateKeyFile    string `json:"private_key_file,omitempty"`
	RefreshInterval   string `json:"refresh_interval,omitempty"`
}

// Node is the client as the control plane sees it.
type Node struct {
	ID       string         `json:"id"`
	Metadata map[string]any `json:"metadata"`
	// grpc-node refuses a node without a locality, so an empty one is always written.
	Locality map[string]string `json:"locality"`
}

// CertificateProvider is a certificate provider plugin instance.
type CertificateProvider struct {
	PluginName string `json:"plugin_name"`
	Config     any    `json:"config"`
}

// FileWatcher is the config of the file_watcher plugin: PEM files gRPC re-reads every
// RefreshInterval.
type FileWatcher struct {
	CertificateFile   string `json:"certificate_file"`
	PrivateKeyFile    string `json:"private_key_file"`
	CACertificateFile string `json:"ca_certificate_file"`
	RefreshInterval   string `json:"refresh_interval"`
}

// Files are a workload's credentials on disk, as the agent writes them.
type Files struct {
	CertChain, Key, Roots string
	// RefreshInterval is how often gRPC re-reads them, as a JSON duration ("900s", Istio's).
	RefreshInterval string
}

// Workload describes a workload as its bootstraps present it to the control plane.
type Workload struct {
	XDSAddress                    string
	IP, Pod, Namespace, DNSDomain string // DNSDomain: "cluster.local" when empty
	ServiceAccount, ClusterID     string // ClusterID: "Kubernetes" when empty
	Labels                        map[string]string
	// Credentials, when set, become the "default" file_watcher certificate provider.
	Credentials *Files
	// XDSOverTLS makes the channel to the xDS server mTLS with Credentials instead of insecure.
	XDSOverTLS bool
}

// DefaultProvider is the certificate provider instance istiod's xDS names for workload mTLS.
const DefaultProvider = "default"

// ServerListenerTemplate is Istio's name for the listener of an xDS-enabled gRPC server.
const ServerListenerTemplate = "xds.istio.io/grpc/lds/inbound/%s"

// SidecarNodeID is Istio's node ID: sidecar~<ip>~<pod>.<namespace>~<namespace>.svc.<domain>.
func SidecarNodeID(ip, pod, namespace, domain string) string {
	return NodeID(Sidecar, ip, pod, namespace, domain)
}

// Node types, the node ID's first part: a sidecar, or an Envoy gateway (pilot-agent's
// `proxy router`), which the control plane serves the Gateways selecting it.
const (
	Sidecar = "sidecar"
	Router  = "router"
)

// NodeID is Istio's node ID of a node of that type: <type>~<ip>~<pod>.<namespace>~<namespace>.svc.<domain>.
func NodeID(nodeType, ip, pod, namespace, domain string) string {
	if domain == "" {
		domain = "cluster.local"
	}
	return fmt.Sprintf("%s~%s~%s.%s~%s.svc.%s", nodeType, ip, pod, namespace, namespace, domain)
}

// NodeMetadata is the node metadata istiod reads (NAMESPACE, CLUSTER_ID, NAME, SERVICE_ACCOUNT,
// INSTANCE_IPS, LABELS), shared by the gRPC and the Envoy bootstraps.
func NodeMetadata(p Workload) map[string]any {
	cluster := p.ClusterID
	if cluster == "" {
		cluster = "Kubernetes"
	}
	md := map[string]any{"NAMESPACE": p.Namespace, "CLUSTER_ID": cluster}
	if p.Pod != "" {
		md["NAME"] = p.Pod
	}
	if p.ServiceAccount != "" {
		md["SERVICE_ACCOUNT"] = p.ServiceAccount
	}
	if p.IP != "" {
		md["INSTANCE_IPS"] = p.IP
	}
	if len(p.Labels) > 0 {
		labels := map[string]any{} // any, so the map converts to a protobuf Struct too
		for k, v := range p.Labels {
			labels[k] = v
		}
		md["LABELS"] = labels
	}
	return md
}

// New is the bootstrap Istio's agent writes for a proxyless gRPC workload.
func New(p Workload) (Bootstrap, error) {
	if p.XDSOverTLS && p.Credentials == nil {
		return Bootstrap{}, fmt.Errorf("gRPC bootstrap: xDS over TLS needs the credential files")
	}
	md := NodeMetadata(p)
	md["GENERATOR"] = "grpc"
	creds := ChannelCreds{Type: "insecure"}
	if p.XDSOverTLS {
		creds = ChannelCreds{Type: "tls", Config: TLSCreds{
			CACertificateFile: p.Credentials.Roots, CertificateFile: p.Credentials.CertChain,
			PrivateKeyFile: p.Credentials.Key, RefreshInterval: p.Credentials.RefreshInterval,
		}}
	}
	b := Bootstrap{
		XDSServers: []XDSServer{{ServerURI: p.XDSAddress, ChannelCreds: []ChannelCreds{creds}, ServerFeatures: []string{"xds_v3"}}},
		Node: Node{
			ID:       SidecarNodeID(p.IP, p.Pod, p.Namespace, p.DNSDomain),
			Metadata: md,
			Locality: map[string]string{},
		},
		ServerListenerResourceNameTemplate: ServerListenerTemplate,
	}
	if f := p.Credentials; f != nil {
		b.CertificateProviders = map[string]CertificateProvider{DefaultProvider: {
			PluginName: "file_watcher",
			Config:     FileWatcher{CertificateFile: f.CertChain, PrivateKeyFile: f.Key, CACertificateFile: f.Roots, RefreshInterval: f.RefreshInterval},
		}}
	}
	return b, nil
}

// JSON is the file's bytes, indented.
func (b Bootstrap) JSON() ([]byte, error) {
	out, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("gRPC bootstrap: %w", err)
	}
	return append(out, '\n'), nil
}

// WriteFile writes b to path atomically (a reader never sees half a file), creating its folder.
func (b Bootstrap) WriteFile(path string) error {
	data, err := b.JSON()
	if err != nil {
		return err
	}
	return WriteAtomic(path, data, 0o644)
}

// WriteAtomic replaces path with data: written to a temporary file in the same folder, synced,
// then renamed over path.
func WriteAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // a no-op after the rename
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
