package analyze

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"sailplane.dev/shared/golden"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestGolden: testdata/<case>/input.yaml (Istio config and Kubernetes Services) → the messages
// `sailplanectl analyze` prints, one per line, in messages.golden.
func TestGolden(t *testing.T) {
	for _, dir := range golden.Cases(t, "testdata") {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(dir, "input.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			var s Set
			msgs := s.AddFile("input.yaml", data, "default")
			msgs = Sort(append(msgs, Analyze(&s)...))
			var b strings.Builder
			for _, m := range msgs {
				b.WriteString(m.String())
				b.WriteByte('\n')
			}
			golden.Compare(t, filepath.Join(dir, "messages.golden"), []byte(b.String()))
		})
	}
}

// TestGatewayAPINoRegistry: without the registry (a microservices' config bus), a route's
// Service backends and parents are not reported missing, as VirtualService hosts are not; what
// the config itself shows (a missing Gateway, a refused reference) still is.
func TestGatewayAPINoRegistry(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "gatewayapi-backends", "input.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	s := Set{NoRegistry: true}
	s.AddFile("input.yaml", data, "default")
	s.Services = nil
	var got []string
	for _, m := range Analyze(&s) {
		got = append(got, m.Field+" "+m.Code)
	}
	for _, want := range []string{
		"spec.rules[0].backendRefs[3] " + CodeNegativeConditionStatus,
		"spec.listeners[1].tls.certificateRefs[0] " + CodeNegativeConditionStatus,
		"spec " + CodeUnusedReferenceGrant,
	} {
		if !slices.Contains(got, want) {
			t.Errorf("messages %q lack %q", got, want)
		}
	}
	for _, m := range got {
		if strings.HasSuffix(m, CodeReferencedResourceNotFound) {
			t.Errorf("without a registry, reported %q", m)
		}
	}
}
