package analyze

import (
	"os"
	"path/filepath"
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
