// Package mesh reads the mesh-wide configuration (Istio's MeshConfig) from a YAML file in the
// format of the "mesh" key of Istio's "istio" ConfigMap, on top of Istio's defaults, and watches
// it for changes.
package mesh

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"
	"sigs.k8s.io/yaml"

	"sailplane.dev/shared/config"
)

// Default returns the mesh config Istio uses when the mesh file sets nothing.
func Default() *meshv1alpha1.MeshConfig {
	return &meshv1alpha1.MeshConfig{
		RootNamespace:          "istio-system",
		TrustDomain:            "cluster.local",
		EnableAutoMtls:         wrapperspb.Bool(true),
		EnableTracing:          true,
		EnablePrometheusMerge:  wrapperspb.Bool(true),
		AccessLogFile:          "",
		AccessLogEncoding:      meshv1alpha1.MeshConfig_TEXT,
		ConnectTimeout:         durationpb.New(10e9),
		DnsRefreshRate:         durationpb.New(60e9),
		ProxyListenPort:        15001,
		ProxyInboundListenPort: 15006,
		IngressClass:           "istio",
		IngressService:         "istio-ingressgateway",
		IngressControllerMode:  meshv1alpha1.MeshConfig_STRICT,
		OutboundTrafficPolicy: &meshv1alpha1.MeshConfig_OutboundTrafficPolicy{
			Mode: meshv1alpha1.MeshConfig_OutboundTrafficPolicy_ALLOW_ANY,
		},
		InboundTrafficPolicy: &meshv1alpha1.MeshConfig_InboundTrafficPolicy{
			Mode: meshv1alpha1.MeshConfig_InboundTrafficPolicy_PASSTHROUGH,
		},
		LocalityLbSetting:              &networking.LocalityLoadBalancerSetting{Enabled: wrapperspb.Bool(true)},
		DefaultServiceExportTo:         []string{"*"},
		DefaultVirtualServiceExportTo:  []string{"*"},
		DefaultDestinationRuleExportTo: []string{"*"},
		DefaultConfig: &meshv1alpha1.ProxyConfig{
			ConfigPath:               "./etc/istio/proxy",
			BinaryPath:               "/usr/local/bin/envoy",
			DiscoveryAddress:         "istiod.istio-system.svc:15012",
			DrainDuration:            durationpb.New(45e9),
			TerminationDrainDuration: durationpb.New(5e9),
			ProxyAdminPort:           15000,
			StatusPort:               15020,
			StatNameLength:           189,
			ControlPlaneAuthPolicy:   meshv1alpha1.AuthenticationPolicy_MUTUAL_TLS,
		},
	}
}

// Load reads the mesh file at path over Default(). Fields the file sets replace the defaults;
// nested objects (defaultConfig, outboundTrafficPolicy, ...) are merged field by field, lists
// are replaced. Unknown fields are errors. Errors are *config.Error naming the file and field.
func Load(path string) (*meshv1alpha1.MeshConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("mesh config: %w", err)
	}
	m, err := Parse(data)
	if err != nil {
		var ce *config.Error
		if errors.As(err, &ce) {
			ce.File = path
			return nil, ce
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// Parse is Load for the file's content.
func Parse(data []byte) (*meshv1alpha1.MeshConfig, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, &config.Error{Err: fmt.Errorf("%w: %v", config.ErrMalformed, err)}
	}
	out := Default()
	if t := bytes.TrimSpace(js); len(t) == 0 || string(t) == "null" {
		return out, nil
	}
	user, err := config.NormalizeJSON(js, out, "")
	if err != nil {
		return nil, err
	}
	var overlay map[string]any
	if err := json.Unmarshal(user, &overlay); err != nil {
		return nil, &config.Error{Err: fmt.Errorf("%w: the mesh config must be a mapping", config.ErrMalformed)}
	}
	defJS, err := protojson.Marshal(out)
	if err != nil {
		return nil, err
	}
	var base map[string]any
	if err := json.Unmarshal(defJS, &base); err != nil {
		return nil, err
	}
	merged, err := json.Marshal(merge(base, overlay))
	if err != nil {
		return nil, err
	}
	if err := config.UnmarshalJSON(merged, out, ""); err != nil {
		return nil, err
	}
	return out, nil
}

// merge lays overlay over base: objects merge key by key, anything else replaces. Both use
// protojson's field names (NormalizeJSON made sure of it).
func merge(base, overlay map[string]any) map[string]any {
	for k, ov := range overlay {
		if om, ok := ov.(map[string]any); ok {
			if bm, ok := base[k].(map[string]any); ok {
				base[k] = merge(bm, om)
				continue
			}
		}
		base[k] = ov
	}
	return base
}

// UnsupportedSourcesError lists config sources that config-ingest cannot read: schemes other
// than fs:// and xds:// (k8s:// is Kubernetes mode's, chosen by --config-source), and xds://
// addresses that are not HOST:PORT.
type UnsupportedSourcesError struct {
	Addresses []string
}

func (e *UnsupportedSourcesError) Error() string {
	return fmt.Sprintf("config sources %s: not supported (fs://FOLDER and xds://HOST:PORT are; k8s:// is read with --config-source=kubernetes)", strings.Join(e.Addresses, ", "))
}

// XDSScheme is the scheme of an upstream config source: another control plane's MCP-over-xDS
// server (istiod, or another Sailplane's config-ingest).
const XDSScheme = "xds://"

// XDSSource is an xds:// entry of configSources.
type XDSSource struct {
	// Address is the entry as written ("xds://istiod.istio-system:15012"): the source's name in
	// logs, problems and the saved state.
	Address string
	// Target is HOST:PORT, what is dialled.
	Target string
	// TLS is the entry's tlsSettings (nil when it has none).
	TLS *networking.ClientTLSSettings
}

// XDSSources returns m's xds:// config sources in their order; entries that are not
// xds://HOST:PORT are listed in an *UnsupportedSourcesError, returned with the good ones.
func XDSSources(m *meshv1alpha1.MeshConfig) ([]XDSSource, error) {
	var out []XDSSource
	var bad []string
	for _, s := range m.GetConfigSources() {
		target, ok := strings.CutPrefix(s.GetAddress(), XDSScheme)
		if !ok {
			continue
		}
		if host, port, err := net.SplitHostPort(target); err != nil || host == "" || port == "" || strings.Contains(target, "/") {
			bad = append(bad, s.GetAddress())
			continue
		}
		out = append(out, XDSSource{Address: s.GetAddress(), Target: target, TLS: s.GetTlsSettings()})
	}
	if len(bad) > 0 {
		return out, &UnsupportedSourcesError{Addresses: bad}
	}
	return out, nil
}

// ConfigDir is the folder, under a root, holding the mesh file (etc/sailplane/mesh.yaml); the
// control plane keeps its other files beside it under the same root (etc/certs,
// var/lib/sailplane).
const ConfigDir = "etc/sailplane"

// Root returns the folder the mesh file's layout hangs from: <root> for a mesh file at
// <root>/etc/sailplane/<file>, else the mesh file's own folder; "." for no mesh file. The
// defaults of the files the control plane keeps (the ca's root, the saved config state) are
// under it, so that each mesh file has its own and a second configuration run from the same
// working folder does not pick up the first one's.
func Root(meshFile string) string {
	if meshFile == "" {
		return "."
	}
	dir := filepath.Dir(filepath.Clean(meshFile))
	if root, ok := strings.CutSuffix(dir, string(filepath.Separator)+filepath.FromSlash(ConfigDir)); ok {
		if root == "" {
			return string(filepath.Separator)
		}
		return root
	}
	if dir == filepath.FromSlash(ConfigDir) {
		return "."
	}
	return dir
}

// DefaultConfigDir is the folder, beside the mesh file, read when the mesh config names no
// configSources: etc/sailplane/conf/ for etc/sailplane/mesh.yaml.
const DefaultConfigDir = "conf"

// ConfigSourceDirs returns the local folders named by m.configSources with the fs:// scheme:
// "fs:///abs/dir" is absolute, "fs://rel/dir" is relative to baseDir (the mesh file's folder).
// With no configSources at all, it is baseDir's DefaultConfigDir. xds:// sources are left to
// XDSSources; other schemes (k8s://) are listed in an *UnsupportedSourcesError, returned
// together with the folders, which are still usable.
func ConfigSourceDirs(m *meshv1alpha1.MeshConfig, baseDir string) ([]string, error) {
	if len(m.GetConfigSources()) == 0 {
		return []string{filepath.Join(baseDir, DefaultConfigDir)}, nil
	}
	var dirs, unsupported []string
	for _, s := range m.GetConfigSources() {
		rest, ok := strings.CutPrefix(s.GetAddress(), "fs://")
		if strings.HasPrefix(s.GetAddress(), XDSScheme) {
			continue
		}
		if !ok {
			unsupported = append(unsupported, s.GetAddress())
			continue
		}
		if rest == "" {
			rest = "."
		}
		if !filepath.IsAbs(rest) {
			rest = filepath.Join(baseDir, rest)
		}
		dirs = append(dirs, filepath.Clean(rest))
	}
	if len(unsupported) > 0 {
		return dirs, &UnsupportedSourcesError{Addresses: unsupported}
	}
	return dirs, nil
}
