package gatewaydeploy

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"sailplane.dev/shared/golden"
)

// TestRender: each testdata/<case>/input.yaml holds a Gateway, the ListenerSets attached to it
// and the customization ConfigMaps (class defaults first, then the parametersRef); golden.yaml is what is applied,
// or the error, or that nothing is deployed (manual mode).
func TestRender(t *testing.T) {
	for _, dir := range golden.Cases(t, "testdata") {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join(dir, "input.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			var in Input
			for i, doc := range splitDocs(t, raw) {
				var tm struct{ Kind string }
				if err := yaml.Unmarshal(doc, &tm); err != nil {
					t.Fatalf("document %d: %v", i, err)
				}
				switch tm.Kind {
				case "Gateway":
					in.Gateway = &gwv1.Gateway{}
					if err := yaml.UnmarshalStrict(doc, in.Gateway); err != nil {
						t.Fatalf("document %d: %v", i, err)
					}
				case "ListenerSet":
					ls := &gwv1.ListenerSet{}
					if err := yaml.UnmarshalStrict(doc, ls); err != nil {
						t.Fatalf("document %d: %v", i, err)
					}
					in.ListenerSets = append(in.ListenerSets, ls)
				case "ConfigMap":
					var cm corev1.ConfigMap
					if err := yaml.UnmarshalStrict(doc, &cm); err != nil {
						t.Fatalf("document %d: %v", i, err)
					}
					in.Overlays = append(in.Overlays, Overlay{Source: cm.Namespace + "/" + cm.Name, Data: cm.Data})
				default:
					t.Fatalf("document %d: unexpected kind %q", i, tm.Kind)
				}
			}
			var out bytes.Buffer
			if Manual(in.Gateway) {
				out.WriteString("# manual mode: nothing deployed\n")
			} else if objs, err := Render(in); err != nil {
				fmt.Fprintf(&out, "# error (invalid parameters: %v)\n%s\n", errors.Is(err, ErrInvalidParameters), err)
			} else {
				for i, o := range objs {
					b, err := yaml.Marshal(o.Object)
					if err != nil {
						t.Fatal(err)
					}
					if i > 0 {
						out.WriteString("---\n")
					}
					out.Write(b)
				}
			}
			golden.Compare(t, filepath.Join(dir, "golden.yaml"), out.Bytes())
		})
	}
}

func splitDocs(t testing.TB, raw []byte) [][]byte {
	r := utilyaml.NewYAMLReader(bufioReader(raw))
	var out [][]byte
	for {
		doc, err := r.Read()
		if err != nil {
			break
		}
		if strings.TrimSpace(string(doc)) != "" && strings.TrimSpace(stripComments(doc)) != "" {
			out = append(out, doc)
		}
	}
	return out
}
