package envoygen

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"
	typev1beta1 "istio.io/api/type/v1beta1"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
)

type problemLog struct {
	mu   sync.Mutex
	seen []model.Problem
}

func (l *problemLog) Report(_ *model.Snapshot, p model.Problem) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen = append(l.seen, p)
}

func (l *problemLog) refused(cluster string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.seen {
		if p.Metric == model.MetricClusterTLSRefused && p.Key == cluster {
			return true
		}
	}
	return false
}

// tlsField sets one ClientTLSSettings field, named for the test's subtest names.
type tlsField struct {
	name string
	set  func(*networking.ClientTLSSettings)
}

var tlsFields = []tlsField{
	{"credentialName", func(t *networking.ClientTLSSettings) { t.CredentialName = "client-secret" }},
	{"configmapCredential", func(t *networking.ClientTLSSettings) { t.CredentialName = "configmap://ca" }},
	{"clientCertificate", func(t *networking.ClientTLSSettings) { t.ClientCertificate = "/c.pem" }},
	{"privateKey", func(t *networking.ClientTLSSettings) { t.PrivateKey = "/k.pem" }},
	{"caCertificates", func(t *networking.ClientTLSSettings) { t.CaCertificates = "/ca.pem" }},
	{"sni", func(t *networking.ClientTLSSettings) { t.Sni = "api.example.com" }},
	{"subjectAltNames", func(t *networking.ClientTLSSettings) { t.SubjectAltNames = []string{"api.example.com"} }},
	{"insecureSkipVerify", func(t *networking.ClientTLSSettings) { t.InsecureSkipVerify = wrapperspb.Bool(true) }},
}

// TestClusterTLSNeverDowngraded enumerates DestinationRule TLS modes (and a mode this code
// does not know) × every combination of the TLS fields × where the rule sets it (traffic
// policy, port level, subset) × sidecar and gateway: a cluster whose rule asks for TLS either
// carries an UpstreamTlsContext or is left out and reported; it never comes out without TLS.
// DISABLE gives a cluster without TLS. Each is checked with and without credentialName secrets
// served (WithCredentials), and with and without a workloadSelector on the rule; a sidecar's
// credentialName cluster is built only when both hold.
func TestClusterTLSNeverDowngraded(t *testing.T) {
	const host = "api.example.com"
	svc := &model.Service{Spec: &discoveryv1.Service{Hostname: host, Namespace: "ns", Registry: "serviceentry",
		MeshExternal: true, Resolution: discoveryv1.Resolution_DNS,
		Ports: []*discoveryv1.Port{{Name: "tls", Number: 443, Protocol: "TLS"}}}}
	proxies := []*model.Proxy{
		{Type: model.SidecarProxy, ID: "client-1.ns", NodeID: "sidecar~10.0.0.1~client-1.ns~ns.svc.cluster.local",
			Namespace: "ns", IPs: []string{"10.0.0.1"}, Labels: map[string]string{"app": "client"}},
		{Type: model.Router, ID: "gw-1.ns", NodeID: "router~10.0.0.2~gw-1.ns~ns.svc.cluster.local",
			Namespace: "ns", IPs: []string{"10.0.0.2"}, Labels: map[string]string{"istio": "egressgateway"}},
	}
	modes := []networking.ClientTLSSettings_TLSmode{networking.ClientTLSSettings_DISABLE, networking.ClientTLSSettings_SIMPLE,
		networking.ClientTLSSettings_MUTUAL, networking.ClientTLSSettings_ISTIO_MUTUAL, networking.ClientTLSSettings_TLSmode(99)}
	// The rule's TLS, set at one level; the cluster that level governs.
	levels := []struct {
		name    string
		cluster string
		rule    func(*networking.ClientTLSSettings) *networking.DestinationRule
	}{
		{"trafficPolicy", ClusterName(443, "", host), func(t *networking.ClientTLSSettings) *networking.DestinationRule {
			return &networking.DestinationRule{Host: host, TrafficPolicy: &networking.TrafficPolicy{Tls: t}}
		}},
		{"portLevel", ClusterName(443, "", host), func(t *networking.ClientTLSSettings) *networking.DestinationRule {
			return &networking.DestinationRule{Host: host, TrafficPolicy: &networking.TrafficPolicy{
				PortLevelSettings: []*networking.TrafficPolicy_PortTrafficPolicy{{Port: &networking.PortSelector{Number: 443}, Tls: t}}}}
		}},
		{"subset", ClusterName(443, "v1", host), func(t *networking.ClientTLSSettings) *networking.DestinationRule {
			return &networking.DestinationRule{Host: host, Subsets: []*networking.Subset{{Name: "v1",
				Labels: map[string]string{"version": "v1"}, TrafficPolicy: &networking.TrafficPolicy{Tls: t}}}}
		}},
	}
	checked, refused, sidecarCredentials := 0, 0, 0
	for _, served := range []bool{false, true} {
		for _, selected := range []bool{false, true} {
			for _, mode := range modes {
				for combo := range 1 << len(tlsFields) {
					settings := &networking.ClientTLSSettings{Mode: mode}
					var set []string
					for i, f := range tlsFields {
						if combo&(1<<i) != 0 {
							f.set(settings)
							set = append(set, f.name)
						}
					}
					if strings.Contains(strings.Join(set, ","), "credentialName,configmapCredential") {
						continue // one field, set twice
					}
					for _, lv := range levels {
						for _, p := range proxies {
							rule := lv.rule(settings)
							if selected { // a selector of the proxy
								rule.WorkloadSelector = &typev1beta1.WorkloadSelector{MatchLabels: p.Labels}
							}
							snap := &model.Snapshot{Services: map[string]*model.Service{host: svc},
								DestinationRules: []model.Config[*networking.DestinationRule]{{Namespace: "ns", Name: "dr", Spec: rule}}}
							name := fmt.Sprintf("served=%v/selector=%v/%s/%s/%s/%s", served, selected, mode, lv.name, p.Type, strings.Join(set, "+"))
							problems := &problemLog{}
							res, err := New(nil, WithProblems(problems), WithCredentials(served)).GenerateAll(snap, p)
							if err != nil {
								t.Fatalf("%s: %v", name, err)
							}
							var c *clusterv3.Cluster
							for _, x := range res.Clusters {
								if x.GetName() == lv.cluster {
									c = x
								}
							}
							checked++
							switch {
							case c == nil && mode == networking.ClientTLSSettings_DISABLE:
								t.Errorf("%s: no cluster %s", name, lv.cluster)
							case c == nil:
								refused++
								if !problems.refused(lv.cluster) {
									t.Errorf("%s: cluster %s left out without a report", name, lv.cluster)
								}
							case mode == networking.ClientTLSSettings_DISABLE:
								if c.GetTransportSocket() != nil || len(c.GetTransportSocketMatches()) > 0 {
									t.Errorf("%s: DISABLE gave TLS", name)
								}
							default:
								ctx := &tlsv3.UpstreamTlsContext{}
								if ts := c.GetTransportSocket(); ts == nil || ts.GetTypedConfig().UnmarshalTo(ctx) != nil {
									t.Errorf("%s: cluster %s has no TLS though the rule asks for %s", name, lv.cluster, mode)
								}
								if mode == networking.ClientTLSSettings_MUTUAL && len(ctx.GetCommonTlsContext().GetTlsCertificateSdsSecretConfigs()) == 0 {
									t.Errorf("%s: MUTUAL cluster %s presents no client certificate", name, lv.cluster)
								}
								if p.IsSidecar() && settings.GetCredentialName() != "" && mode != networking.ClientTLSSettings_ISTIO_MUTUAL {
									if !served || !selected || strings.HasPrefix(settings.GetCredentialName(), "configmap://") {
										t.Errorf("%s: sidecar given a credentialName cluster that cannot be served to it", name)
									}
									sidecarCredentials++
								}
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d clusters checked, %d refused", checked, refused)
	// Not vacuous: both outcomes occur.
	if refused == 0 || refused == checked || sidecarCredentials == 0 {
		t.Fatalf("%d of %d clusters refused, %d sidecar credentialName clusters", refused, checked, sidecarCredentials)
	}
}
