package model

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
)

// ProxyType is the kind of client asking for configuration.
type ProxyType string

const (
	// SidecarProxy is an Envoy sidecar next to a workload ("sidecar~…").
	SidecarProxy ProxyType = "sidecar"
	// Router is an Envoy gateway ("router~…").
	Router ProxyType = "router"
	// Proxyless is a gRPC client using xDS directly (node metadata GENERATOR=grpc).
	Proxyless ProxyType = "proxyless"
)

// DefaultClusterID is the cluster a proxy belongs to when its metadata names none (Istio's).
const DefaultClusterID = "Kubernetes"

// ErrMalformedNodeID is wrapped by the errors ParseProxy returns for node IDs it cannot read.
var ErrMalformedNodeID = errors.New("malformed node ID")

// NodeIDError describes why a node ID was refused; it matches ErrMalformedNodeID with errors.Is.
type NodeIDError struct {
	NodeID string
	Reason string
}

func (e *NodeIDError) Error() string {
	return fmt.Sprintf("%v %q: %s", ErrMalformedNodeID, e.NodeID, e.Reason)
}

func (e *NodeIDError) Unwrap() error { return ErrMalformedNodeID }

// Proxy is a connected xDS client, as read from its node. It is immutable once parsed.
type Proxy struct {
	Type ProxyType
	// ID is the node ID's third part, "<pod>.<namespace>" for Kubernetes workloads.
	ID string
	// NodeID is the whole node ID as sent.
	NodeID string
	// IPs are the workload's addresses: metadata INSTANCE_IPS, else the node ID's IP.
	IPs []string
	// DNSDomain is the node ID's last part, "<namespace>.svc.cluster.local".
	DNSDomain      string
	Namespace      string
	Labels         map[string]string
	ServiceAccount string
	ClusterID      string
	IstioVersion   string
	// Generator is the GENERATOR metadata: "grpc" for proxyless clients, "api" for MCP.
	Generator string
	// NodeLocality is the locality the node says it is in (the xDS node's locality): the last
	// resort of Locality, after the registry and the proxy's labels.
	NodeLocality *discoveryv1.Locality
	// Network is the NETWORK metadata.
	Network string
	// DNSCapture is the DNS_CAPTURE metadata (pilot-agent's ISTIO_META_DNS_CAPTURE): the
	// agent answers the workload's DNS from the name table. DNSAutoAllocate is
	// DNS_AUTO_ALLOCATE, the proxy asking for addresses for ServiceEntries without any.
	DNSCapture, DNSAutoAllocate bool
}

// ParseProxy reads a proxy from its xDS node: the ID "<type>~<ip>~<id>~<domain>" and Istio's
// node metadata.
func ParseProxy(node *corev3.Node) (*Proxy, error) {
	id := node.GetId()
	parts := strings.Split(id, "~")
	if len(parts) != 4 {
		return nil, &NodeIDError{NodeID: id, Reason: "want 4 parts separated by ~"}
	}
	md := node.GetMetadata().GetFields()
	p := &Proxy{
		NodeID:          id,
		ID:              parts[2],
		DNSDomain:       parts[3],
		Namespace:       str(md["NAMESPACE"]),
		ServiceAccount:  str(md["SERVICE_ACCOUNT"]),
		ClusterID:       cmp.Or(str(md["CLUSTER_ID"]), DefaultClusterID),
		IstioVersion:    str(md["ISTIO_VERSION"]),
		Generator:       str(md["GENERATOR"]),
		Network:         str(md["NETWORK"]),
		Labels:          map[string]string{},
		DNSCapture:      boolOf(md["DNS_CAPTURE"]),
		DNSAutoAllocate: boolOf(md["DNS_AUTO_ALLOCATE"]),
	}
	if l := node.GetLocality(); l.GetRegion() != "" || l.GetZone() != "" || l.GetSubZone() != "" {
		p.NodeLocality = &discoveryv1.Locality{Region: l.GetRegion(), Zone: l.GetZone(), SubZone: l.GetSubZone()}
	}
	switch {
	case p.Generator == "grpc":
		p.Type = Proxyless
	case parts[0] == string(SidecarProxy):
		p.Type = SidecarProxy
	case parts[0] == string(Router):
		p.Type = Router
	default:
		return nil, &NodeIDError{NodeID: id, Reason: fmt.Sprintf("unknown proxy type %q", parts[0])}
	}
	if ips := str(md["INSTANCE_IPS"]); ips != "" {
		for ip := range strings.SplitSeq(ips, ",") {
			if ip = strings.TrimSpace(ip); ip != "" {
				p.IPs = append(p.IPs, ip)
			}
		}
	}
	if len(p.IPs) == 0 && parts[1] != "" {
		p.IPs = []string{parts[1]}
	}
	for _, ip := range p.IPs {
		if _, err := netip.ParseAddr(ip); err != nil {
			return nil, &NodeIDError{NodeID: id, Reason: fmt.Sprintf("invalid IP %q", ip)}
		}
	}
	if p.Namespace == "" {
		// "<ns>.svc.cluster.local", else the "<pod>.<ns>" ID.
		if ns, _, ok := strings.Cut(p.DNSDomain, "."); ok && ns != "" {
			p.Namespace = ns
		} else if _, ns, ok := strings.Cut(p.ID, "."); ok {
			p.Namespace = ns
		}
	}
	if p.Namespace == "" {
		return nil, &NodeIDError{NodeID: id, Reason: "no namespace in metadata, DNS domain or ID"}
	}
	for k, v := range md["LABELS"].GetStructValue().GetFields() {
		if s, ok := v.GetKind().(*structpb.Value_StringValue); ok {
			p.Labels[k] = s.StringValue
		}
	}
	return p, nil
}

// HasIP reports whether ip is one of the proxy's addresses.
func (p *Proxy) HasIP(ip string) bool { return slices.Contains(p.IPs, ip) }

// TLSModeLabel is the label Istio's injector puts on workloads that hold mesh certificates
// (value "istio"); clients use mutual TLS to endpoints that carry it.
const TLSModeLabel = "security.istio.io/tlsMode"

// InMesh reports whether the proxy's workload is labelled as holding mesh certificates.
func (p *Proxy) InMesh() bool { return p.Labels[TLSModeLabel] == "istio" }

// IsSidecar, IsRouter and IsProxyless test the proxy's type.
func (p *Proxy) IsSidecar() bool   { return p.Type == SidecarProxy }
func (p *Proxy) IsRouter() bool    { return p.Type == Router }
func (p *Proxy) IsProxyless() bool { return p.Type == Proxyless }

// boolOf reads Istio's StringBool metadata: "true"/"1" (any strconv.ParseBool truth) or a bool.
func boolOf(v *structpb.Value) bool {
	switch k := v.GetKind().(type) {
	case *structpb.Value_BoolValue:
		return k.BoolValue
	case *structpb.Value_StringValue:
		b, _ := strconv.ParseBool(k.StringValue)
		return b
	}
	return false
}

func str(v *structpb.Value) string {
	if s, ok := v.GetKind().(*structpb.Value_StringValue); ok {
		return s.StringValue
	}
	return ""
}

// Topology labels: Kubernetes' for region and zone, Istio's for the rest.
const (
	LabelRegion   = "topology.kubernetes.io/region"
	LabelZone     = "topology.kubernetes.io/zone"
	LabelSubZone  = "topology.istio.io/subzone"
	LabelCluster  = "topology.istio.io/cluster"
	LabelNetwork  = "topology.istio.io/network"
	LabelLocality = "topology.istio.io/locality"
	// legacyLocalityLabel is the older spelling of LabelLocality.
	legacyLocalityLabel = "istio-locality"
)

// Locality finds where the proxy runs as istiod does: the locality the registry gives its own
// workload (self, from the Kubernetes Node's topology labels), else the proxy's topology labels,
// else its locality label ("region/zone/subzone", dots allowed since labels cannot hold "/"),
// else what the node said. Empty when none says anything.
func (p *Proxy) Locality(self *discoveryv1.Endpoint) *discoveryv1.Locality {
	if l := self.GetLocality(); l.GetRegion() != "" || l.GetZone() != "" || l.GetSubZone() != "" {
		return l
	}
	region, r := p.Labels[LabelRegion]
	zone, z := p.Labels[LabelZone]
	subZone, s := p.Labels[LabelSubZone]
	if r || z || s {
		return &discoveryv1.Locality{Region: region, Zone: zone, SubZone: subZone}
	}
	if l := cmp.Or(p.Labels[LabelLocality], p.Labels[legacyLocalityLabel]); l != "" {
		return ParseLocality(l)
	}
	if p.NodeLocality != nil {
		return p.NodeLocality
	}
	return &discoveryv1.Locality{}
}

// ParseLocality reads "region/zone/subzone" (or with dots), any part optional from the right.
func ParseLocality(s string) *discoveryv1.Locality {
	sep := "/"
	if !strings.Contains(s, "/") {
		sep = "."
	}
	parts := strings.SplitN(s, sep, 3)
	parts = append(parts, "", "")
	return &discoveryv1.Locality{Region: parts[0], Zone: parts[1], SubZone: parts[2]}
}

// IPFamilies reports which IP families the proxy has addresses of; a proxy with no address
// is taken to reach both.
func (p *Proxy) IPFamilies() (v4, v6 bool) {
	for _, ip := range p.IPs {
		if a, err := netip.ParseAddr(ip); err == nil {
			if a.Unmap().Is4() {
				v4 = true
			} else {
				v6 = true
			}
		}
	}
	if !v4 && !v6 {
		return true, true
	}
	return v4, v6
}
