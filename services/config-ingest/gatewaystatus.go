package configingest

import (
	"maps"
	"slices"
	"strings"

	"sailplane.dev/services/config-ingest/internal/gatewaystatus"
	"sailplane.dev/services/config-ingest/internal/tree"
	"sailplane.dev/shared/config"
	"sailplane.dev/shared/gatewayapi"
	"sailplane.dev/shared/schema"
)

// gatewayStatus is the Gateway API status as last computed: by the status writer in Kubernetes
// mode, from the files' Gateway API objects and ServiceEntries in files mode (computed on
// demand, once per change of them).
func (s *Service) gatewayStatus() []gatewaystatus.Computed {
	if s.gwStatus != nil {
		return s.gwStatus.Statuses()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.gwFiles.fresh {
		s.gwFiles.computed, _ = gatewaystatus.FromConfigs(s.gwFiles.configs, gatewayapi.Translate)
		s.gwFiles.fresh = true
	}
	return s.gwFiles.computed
}

// filesGateway is files mode's input of the Gateway API status and its last result.
type filesGateway struct {
	configs  []config.Config
	computed []gatewaystatus.Computed
	fresh    bool
}

// gatewayInputs are the kinds the Gateway API status depends on.
var gatewayInputs = func() map[string]bool {
	m := map[string]bool{schema.ServiceEntry.TypeURL: true}
	for _, k := range schema.GatewayAPI {
		m[k.TypeURL] = true
	}
	return m
}()

// noteGatewayInputs keeps, after a scan whose changes touch them (all: nil), the files'
// Gateway API objects and ServiceEntries for gatewayStatus.
func (s *Service) noteGatewayInputs(published map[tree.Key]config.Config, changes []tree.Change) {
	if changes != nil && !slices.ContainsFunc(changes, func(c tree.Change) bool { return gatewayInputs[c.TypeURL] }) {
		return
	}
	var configs []config.Config
	for _, k := range slices.SortedFunc(maps.Keys(published), func(a, b tree.Key) int {
		if a.TypeURL != b.TypeURL {
			return strings.Compare(a.TypeURL, b.TypeURL)
		}
		return strings.Compare(a.Name, b.Name)
	}) {
		if gatewayInputs[k.TypeURL] {
			configs = append(configs, published[k])
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gwFiles = filesGateway{configs: configs}
}
