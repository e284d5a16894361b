package mesh

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"sailplane.dev/shared/config"
	"sailplane.dev/shared/fswatch"
)

// ErrMeshNetworks marks meshNetworks that cannot be used.
var ErrMeshNetworks = errors.New("invalid meshNetworks")

// ParseNetworks reads Istio's meshNetworks (the "meshNetworks" key of the istio ConfigMap, or
// istiod's --meshNetworks file): nil for empty data. It refuses what istiod's validation
// refuses, naming the field: a bad fromCidr, a fromRegistry that is not a DNS label, a gateway
// address that is not an IP (host names need istiod's RESOLVE_HOSTNAME_GATEWAYS, which we do
// not implement), a registryServiceName that is not a host name, a port outside 1-65535.
func ParseNetworks(data []byte) (*meshv1alpha1.MeshNetworks, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, &config.Error{Err: fmt.Errorf("%w: %v", config.ErrMalformed, err)}
	}
	if t := bytes.TrimSpace(js); len(t) == 0 || string(t) == "null" {
		return nil, nil
	}
	out := &meshv1alpha1.MeshNetworks{}
	if err := config.UnmarshalJSON(js, out, ""); err != nil {
		return nil, err
	}
	if err := ValidateNetworks(out); err != nil {
		return nil, err
	}
	return out, nil
}

// ValidateNetworks checks meshNetworks as ParseNetworks does.
func ValidateNetworks(m *meshv1alpha1.MeshNetworks) error {
	var errs []error
	bad := func(field string, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrMeshNetworks, field, fmt.Sprintf(format, args...)))
	}
	for _, name := range slices.Sorted(maps.Keys(m.GetNetworks())) {
		nw := m.GetNetworks()[name]
		for i, ep := range nw.GetEndpoints() {
			f := fmt.Sprintf("networks.%s.endpoints[%d]", name, i)
			switch e := ep.GetNe().(type) {
			case *meshv1alpha1.Network_NetworkEndpoints_FromCidr:
				if _, err := netip.ParsePrefix(e.FromCidr); err != nil {
					bad(f+".fromCidr", "%q is not a CIDR (10.1.0.0/16)", e.FromCidr)
				}
			case *meshv1alpha1.Network_NetworkEndpoints_FromRegistry:
				// Istio's DNS labels allow upper case: the default cluster ID is "Kubernetes".
				if msgs := validation.IsDNS1123Label(strings.ToLower(e.FromRegistry)); len(msgs) > 0 {
					bad(f+".fromRegistry", "%q is not a cluster ID (a DNS label)", e.FromRegistry)
				}
			}
		}
		for i, gw := range nw.GetGateways() {
			f := fmt.Sprintf("networks.%s.gateways[%d]", name, i)
			switch g := gw.GetGw().(type) {
			case *meshv1alpha1.Network_IstioNetworkGateway_Address:
				if _, err := netip.ParseAddr(g.Address); err != nil {
					bad(f+".address", "%q is not an IP address (host names are not resolved)", g.Address)
				}
			case *meshv1alpha1.Network_IstioNetworkGateway_RegistryServiceName:
				if msgs := validation.IsDNS1123Subdomain(strings.ToLower(g.RegistryServiceName)); len(msgs) > 0 {
					bad(f+".registryServiceName", "%q is not a host name", g.RegistryServiceName)
				}
			}
			if p := gw.GetPort(); p == 0 || p > 65535 {
				bad(f+".port", "%d is not a port (1-65535)", p)
			}
		}
	}
	return errors.Join(errs...)
}

// NetworksFile is the meshNetworks file beside a mesh file: "meshNetworks" in its folder, as
// the istio ConfigMap mounts its keys (istiod's --meshConfig and --networksConfig defaults,
// /etc/istio/config/mesh and /etc/istio/config/meshNetworks).
func NetworksFile(meshFile string) string {
	return filepath.Join(filepath.Dir(meshFile), "meshNetworks")
}

// LoadNetworks reads a meshNetworks file; a missing or empty file means none (nil).
func LoadNetworks(path string) (*meshv1alpha1.MeshNetworks, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("meshNetworks: %w", err)
	}
	m, err := ParseNetworks(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// WatchNetworks loads the meshNetworks file, calls onChange with it, then again with every
// change until ctx is done. onError gets each load's error (nil when it succeeds); after a
// failed load the last good meshNetworks stay.
func WatchNetworks(ctx context.Context, path string, debounce time.Duration, log *slog.Logger,
	onChange func(*meshv1alpha1.MeshNetworks), onError func(error)) error {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("meshNetworks watcher: %w", err)
	}
	defer fw.Close()
	// The folder, as for the mesh file: renames and ConfigMap symlink swaps end a file watch.
	if err := fw.Add(filepath.Dir(path)); err != nil {
		return fmt.Errorf("meshNetworks %s: cannot watch its folder: %w", path, err)
	}
	cur, err := LoadNetworks(path)
	onError(err)
	if err != nil {
		log.Error("meshNetworks cannot be loaded; using none", "file", path, "error", err)
	}
	onChange(cur)
	fswatch.Settle(ctx, fw, debounce, func(fsnotify.Event) bool { return true }, func() {
		m, err := LoadNetworks(path)
		onError(err)
		if err != nil {
			log.Error("meshNetworks not reloaded, keeping the previous ones", "file", path, "error", err)
			return
		}
		if !proto.Equal(m, cur) {
			log.Info("meshNetworks reloaded", "file", path)
			cur = m
			onChange(m)
		}
	}, func(err error) { log.Warn("meshNetworks watch error", "error", err) })
	return nil
}
