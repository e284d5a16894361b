package loadgen

import (
	"context"
	"errors"
	"testing"
)

// Several xds-servers share the microservices topology's buses; hyper serves xDS itself, so
// asking it for more than one is refused before anything starts.
func TestXDSServersNeedMicroservices(t *testing.T) {
	for _, topology := range []string{TopologyHyper, TopologyExternal} {
		s := Scenario{Topology: topology, XDS: "127.0.0.1:1", Bin: t.TempDir(), XDSServers: 2}
		procs, addrs, err := s.start(context.Background(), t.TempDir())
		if !errors.Is(err, ErrScenario) || len(procs) != 0 || len(addrs) != 0 {
			t.Errorf("%s with 2 xds-servers: procs %v, addrs %v, err %v; want ErrScenario and nothing started", topology, procs, addrs, err)
		}
	}
}
