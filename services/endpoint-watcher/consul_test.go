package endpointwatcher

import (
	"testing"
	"time"

	"sailplane.dev/services/endpoint-watcher/internal/bustest"
	"sailplane.dev/tools/testenv"
)

// TestConsulSource checks the Consul registry is plugged in: the Watcher is Ready only once
// Consul's first full state is out too, and it stops cleanly.
func TestConsulSource(t *testing.T) {
	c := testenv.ConsulForTest(t)
	src := newFakeSource()
	close(src.release)
	w := startWith(t, Config{ClusterID: "c1", Consul: &ConsulConfig{Address: c.Addr()}}, src, bustest.NewRecorder())
	select {
	case <-w.Ready():
	case <-time.After(kubeTimeout):
		t.Fatal("Ready not closed")
	}
	if len(w.sources) != 1 || w.sources[0].name != "consul" {
		t.Fatalf("sources = %+v, want consul only", w.sources)
	}
}
