package xds

import (
	"log/slog"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// redacted replaces key material in config dumps, as istiod writes it.
var redacted = &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: []byte("[redacted]")}}

// buildConfigDump lays out held resources (by type URL) as Envoy's admin /config_dump does,
// with its sections in its order; endpoints are included, as with Envoy's ?include_eds.
func buildConfigDump(held map[string][]heldResource, log *slog.Logger) *adminv3.ConfigDump {
	clusters := &adminv3.ClustersConfigDump{}
	for _, r := range held[resourcev3.ClusterType] {
		clusters.DynamicActiveClusters = append(clusters.DynamicActiveClusters,
			&adminv3.ClustersConfigDump_DynamicCluster{VersionInfo: r.version, Cluster: r.res})
	}
	endpoints := &adminv3.EndpointsConfigDump{}
	for _, r := range held[resourcev3.EndpointType] {
		endpoints.DynamicEndpointConfigs = append(endpoints.DynamicEndpointConfigs,
			&adminv3.EndpointsConfigDump_DynamicEndpointConfig{VersionInfo: r.version, EndpointConfig: r.res})
	}
	listeners := &adminv3.ListenersConfigDump{}
	for _, r := range held[resourcev3.ListenerType] {
		listeners.DynamicListeners = append(listeners.DynamicListeners, &adminv3.ListenersConfigDump_DynamicListener{
			Name:        r.name,
			ActiveState: &adminv3.ListenersConfigDump_DynamicListenerState{VersionInfo: r.version, Listener: r.res},
		})
	}
	routes := &adminv3.RoutesConfigDump{}
	for _, r := range held[resourcev3.RouteType] {
		routes.DynamicRouteConfigs = append(routes.DynamicRouteConfigs,
			&adminv3.RoutesConfigDump_DynamicRouteConfig{VersionInfo: r.version, RouteConfig: r.res})
	}
	secrets := &adminv3.SecretsConfigDump{}
	for _, r := range held[resourcev3.SecretType] {
		s, err := redactSecret(r.res)
		if err != nil {
			log.Warn("config dump: secret left out", "name", r.name, "err", err)
			continue
		}
		secrets.DynamicActiveSecrets = append(secrets.DynamicActiveSecrets,
			&adminv3.SecretsConfigDump_DynamicSecret{Name: r.name, VersionInfo: r.version, Secret: s})
	}
	ecds := &adminv3.EcdsConfigDump{}
	for _, r := range held[resourcev3.ExtensionConfigType] {
		ecds.EcdsFilters = append(ecds.EcdsFilters, &adminv3.EcdsConfigDump_EcdsFilterConfig{VersionInfo: r.version, EcdsFilter: r.res})
	}
	dump := &adminv3.ConfigDump{}
	for _, m := range []proto.Message{&adminv3.BootstrapConfigDump{}, clusters, endpoints, listeners,
		&adminv3.ScopedRoutesConfigDump{}, routes, secrets, ecds} {
		a, err := anypb.New(m)
		if err != nil {
			log.Error("config dump: encoding a section", "err", err)
			continue
		}
		dump.Configs = append(dump.Configs, a)
	}
	return dump
}

// redactSecret is an SDS secret without its private keys and generic secret values: a config
// dump never carries key material, whoever asks.
func redactSecret(a *anypb.Any) (*anypb.Any, error) {
	s := &tlsv3.Secret{}
	if err := a.UnmarshalTo(s); err != nil {
		return nil, err
	}
	if c := s.GetTlsCertificate(); c != nil {
		if c.PrivateKey != nil {
			c.PrivateKey = redacted
		}
		if c.Password != nil {
			c.Password = redacted
		}
		c.PrivateKeyProvider = nil
		if c.Pkcs12 != nil {
			c.Pkcs12 = redacted
		}
	}
	if g := s.GetGenericSecret(); g != nil {
		g.Secret = redacted
		g.Secrets = nil
	}
	return anypb.New(s)
}
