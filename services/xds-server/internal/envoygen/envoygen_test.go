package envoygen

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/services/xds-server/internal/testinput"
	"sailplane.dev/shared/golden"
	"sailplane.dev/shared/testlog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testLogger(t testing.TB) *slog.Logger {
	return testlog.New(t, slog.LevelDebug)
}

type namedProxy struct {
	name  string
	proxy *model.Proxy
}

type testCase struct {
	snap    *model.Snapshot
	proxies []namedProxy
	// credentials: the case's folder has a file "credentials-served": generate as for an
	// xds-server serving credentialName secrets (WithCredentials).
	credentials bool
}

// load reads a case: the Proxy documents are taken out, the rest goes through testinput.
func load(t *testing.T, dir string) testCase {
	t.Helper()
	proxies, rest, err := testinput.ReadCase(dir)
	if err != nil {
		t.Fatal(err)
	}
	var tc testCase
	for _, p := range proxies {
		tc.proxies = append(tc.proxies, namedProxy{name: p.Name, proxy: p.Proxy})
	}
	if len(tc.proxies) == 0 {
		t.Fatalf("%s: no Proxy document", dir)
	}
	tc.snap = snapshotOf(t, string(rest))
	if _, err := os.Stat(filepath.Join(dir, "credentials-served")); err == nil {
		tc.credentials = true
	}
	return tc
}

// snapshotOf builds a snapshot from testinput YAML documents.
func snapshotOf(t *testing.T, docs string) *model.Snapshot {
	t.Helper()
	items, err := testinput.Parse([]byte(docs))
	if err != nil {
		t.Fatal(err)
	}
	store := model.NewStore()
	h := store.Handler(nil)
	for _, c := range testinput.Changes(items) {
		if err := h.Apply(c); err != nil {
			t.Fatalf("apply %s: %v", c.TypeURL, err)
		}
	}
	return store.Snapshot()
}

func all(r *Resources) []proto.Message {
	var out []proto.Message
	for _, x := range r.Listeners {
		out = append(out, x)
	}
	for _, x := range r.Routes {
		out = append(out, x)
	}
	for _, x := range r.Clusters {
		out = append(out, x)
	}
	for _, x := range r.Endpoints {
		out = append(out, x)
	}
	return out
}

func generateAll(t *testing.T, tc testCase, p *model.Proxy) *Resources {
	t.Helper()
	res, err := New(testLogger(t), WithCredentials(tc.credentials), WithAutoAddresses(model.NewAllocator())).GenerateAll(tc.snap, p)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// render prints each proxy's resources as YAML, grouped by type; protojson's output is not
// stable byte for byte, so it goes through a generic value printed in key order.
func render(t *testing.T, tc testCase) []byte {
	t.Helper()
	group := func(msgs []proto.Message) []json.RawMessage {
		out := []json.RawMessage{}
		for _, m := range msgs {
			b, err := protojson.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, b)
		}
		return out
	}
	doc := map[string]map[string][]json.RawMessage{}
	for _, np := range tc.proxies {
		r := generateAll(t, tc, np.proxy)
		doc[np.name] = map[string][]json.RawMessage{
			"listeners": group(asMessages(r.Listeners)), "routes": group(asMessages(r.Routes)),
			"clusters": group(asMessages(r.Clusters)), "endpoints": group(asMessages(r.Endpoints)),
		}
	}
	j, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	y, err := yaml.JSONToYAML(j)
	if err != nil {
		t.Fatal(err)
	}
	return y
}

func asMessages[T proto.Message](in []T) []proto.Message {
	out := make([]proto.Message, len(in))
	for i, m := range in {
		out[i] = m
	}
	return out
}

func TestGolden(t *testing.T) {
	for _, dir := range golden.Cases(t, "testdata") {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			golden.Compare(t, filepath.Join(dir, "golden.yaml"), render(t, load(t, dir)))
		})
	}
}

// TestValidate checks every generated resource of every case against Envoy's constraints.
func TestValidate(t *testing.T) {
	for _, dir := range golden.Cases(t, "testdata") {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			tc := load(t, dir)
			for _, np := range tc.proxies {
				res := all(generateAll(t, tc, np.proxy))
				if len(res) == 0 {
					t.Fatalf("%s: no resources generated", np.name)
				}
				for _, m := range res {
					if err := validateDeep(m); err != nil {
						t.Errorf("%s: %T invalid: %v", np.name, m, err)
					}
				}
			}
		})
	}
}

// validateDeep runs ValidateAll on m and on every message packed in an Any inside it (filter,
// transport socket and extension configs), which ValidateAll does not open.
func validateDeep(m proto.Message) error {
	v, ok := m.(interface{ ValidateAll() error })
	if !ok {
		return fmt.Errorf("%T has no ValidateAll", m)
	}
	if err := v.ValidateAll(); err != nil {
		return err
	}
	var err error
	var walk func(protoreflect.Message) bool
	walk = func(msg protoreflect.Message) bool {
		if a, ok := msg.Interface().(*anypb.Any); ok {
			inner, uerr := a.UnmarshalNew()
			if uerr != nil {
				return true // a type this binary does not link: nothing to check
			}
			if strings.HasPrefix(string(inner.ProtoReflect().Descriptor().FullName()), "istio.") {
				return true // Istio's filter configs (istio.alpn) declare no constraints
			}
			if err = validateDeep(inner); err != nil {
				err = fmt.Errorf("%s: %w", a.GetTypeUrl(), err)
				return false
			}
			return true
		}
		msg.Range(func(fd protoreflect.FieldDescriptor, val protoreflect.Value) bool {
			switch {
			case fd.IsList() && fd.Message() != nil:
				for i := range val.List().Len() {
					if !walk(val.List().Get(i).Message()) {
						return false
					}
				}
			case fd.IsMap() && fd.MapValue().Message() != nil:
				val.Map().Range(func(_ protoreflect.MapKey, v protoreflect.Value) bool { return walk(v.Message()) })
			case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
				return walk(val.Message())
			}
			return err == nil
		})
		return err == nil
	}
	walk(m.ProtoReflect())
	return err
}

// TestDeterministic guards the golden files and snapshot versions, which rely on the same
// input producing byte-identical output.
func TestDeterministic(t *testing.T) {
	for _, dir := range golden.Cases(t, "testdata") {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			tc := load(t, dir)
			for _, np := range tc.proxies {
				a, b := all(generateAll(t, tc, np.proxy)), all(generateAll(t, tc, np.proxy))
				if len(a) != len(b) {
					t.Fatalf("%d vs %d resources", len(a), len(b))
				}
				for i := range a {
					ma, _ := proto.MarshalOptions{Deterministic: true}.Marshal(a[i])
					mb, _ := proto.MarshalOptions{Deterministic: true}.Marshal(b[i])
					if !bytes.Equal(ma, mb) {
						t.Errorf("%s: resource %d differs between runs", np.name, i)
					}
				}
			}
		})
	}
}
