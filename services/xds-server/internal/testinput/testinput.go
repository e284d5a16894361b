// Package testinput reads the YAML test inputs of the xds-server: Istio config documents and the
// registry's Service/Endpoints written the same way (apiVersion sailplane.dev/v1, spec = the
// discoveryv1 message as protojson), and turns them into bus resources.
package testinput

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"sigs.k8s.io/yaml"

	discoveryv1 "sailplane.dev/proto/discovery/v1"
	"sailplane.dev/services/xds-server/internal/model"
	"sailplane.dev/shared/bus"
	"sailplane.dev/shared/schema"
)

// baseTime is the creation time of the first document without one; later documents are one
// second younger each, so document order is precedence order.
var baseTime = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

type document struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name              string            `json:"name"`
		Namespace         string            `json:"namespace"`
		Labels            map[string]string `json:"labels"`
		Annotations       map[string]string `json:"annotations"`
		CreationTimestamp *time.Time        `json:"creationTimestamp"`
	} `json:"metadata"`
	Spec json.RawMessage `json:"spec"`
}

// Item is one decoded document.
type Item struct {
	Kind     schema.Kind
	Resource *bus.Resource
}

// ReadFile parses a multi-document YAML file.
func ReadFile(path string) ([]Item, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	items, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return items, nil
}

// Parse parses YAML documents separated by "---" lines.
func Parse(data []byte) ([]Item, error) {
	var items []Item
	for i, doc := range splitDocuments(data) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		item, err := parseDocument(doc, baseTime.Add(time.Duration(len(items))*time.Second))
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		items = append(items, item)
	}
	return items, nil
}

func parseDocument(doc []byte, created time.Time) (Item, error) {
	var d document
	if err := yaml.Unmarshal(doc, &d); err != nil {
		return Item{}, err
	}
	kind, ok := schema.ByAPIVersionKind(d.APIVersion, d.Kind)
	if !ok {
		return Item{}, fmt.Errorf("unknown kind %s %s", d.APIVersion, d.Kind)
	}
	// sigs.k8s.io/yaml converts to JSON first, so the spec arrives as JSON protojson can read.
	body := kind.New()
	if len(d.Spec) > 0 && string(d.Spec) != "null" {
		if err := protojson.Unmarshal(d.Spec, body); err != nil {
			return Item{}, fmt.Errorf("%s spec: %w", kind.Kind, err)
		}
	}
	name := d.Metadata.Name
	ns := d.Metadata.Namespace
	switch b := body.(type) {
	case *discoveryv1.Service:
		// The registry names its resources "<namespace>/<hostname>".
		name, ns = cmp.Or(name, b.GetHostname()), cmp.Or(ns, b.GetNamespace())
	case *discoveryv1.Endpoints:
		name, ns = cmp.Or(name, b.GetHostname()), cmp.Or(ns, b.GetNamespace())
	}
	if name == "" {
		return Item{}, fmt.Errorf("%s without a name", kind.Kind)
	}
	if kind.ClusterScoped {
		ns = ""
	}
	if t := d.Metadata.CreationTimestamp; t != nil {
		created = *t
	}
	return Item{Kind: kind, Resource: &bus.Resource{
		Name: schema.Name(ns, name), Body: body, Labels: d.Metadata.Labels,
		Annotations: d.Metadata.Annotations, CreateTime: created,
	}}, nil
}

// Changes groups items into one change per type, in first-appearance order.
func Changes(items []Item) []bus.Change {
	var out []bus.Change
	index := map[string]int{}
	for _, it := range items {
		i, ok := index[it.Kind.TypeURL]
		if !ok {
			i = len(out)
			index[it.Kind.TypeURL] = i
			out = append(out, bus.Change{TypeURL: it.Kind.TypeURL})
		}
		out[i].Updated = append(out[i].Updated, it.Resource)
	}
	return out
}

func splitDocuments(data []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimRight(line, " \t") == "---" {
			docs = append(docs, bytes.Clone(cur.Bytes()))
			cur.Reset()
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
	}
	return append(docs, cur.Bytes())
}

// proxyDoc is the test-only document describing an xDS node:
//
//	kind: Proxy
//	metadata: {name: <golden key>}
//	spec: {id: sidecar~IP~pod.ns~ns.svc.cluster.local, metadata: {NAMESPACE: ns, LABELS: {...}},
//	       locality: {region: r, zone: z, subZone: s}}
type proxyDoc struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		ID       string         `json:"id"`
		Metadata map[string]any `json:"metadata"`
		Locality *struct {
			Region, Zone, SubZone string
		} `json:"locality"`
	} `json:"spec"`
}

// Proxy is a Proxy document: a proxy as its node describes it, under the document's name.
type Proxy struct {
	Name  string
	Proxy *model.Proxy
}

// ReadCase reads dir/input.yaml, a golden case's input: its proxies, and the other documents.
func ReadCase(dir string) ([]Proxy, []byte, error) {
	path := filepath.Join(dir, "input.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	proxies, rest, err := SplitProxies(data)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return proxies, rest, nil
}

// SplitProxies takes the Proxy documents out of data: it returns the proxies, in order, and
// the other documents, for Parse.
func SplitProxies(data []byte) ([]Proxy, []byte, error) {
	var proxies []Proxy
	var rest [][]byte
	for i, doc := range splitDocuments(data) {
		var pd proxyDoc
		if err := yaml.Unmarshal(doc, &pd); err != nil {
			return nil, nil, fmt.Errorf("document %d: %w", i, err)
		}
		if pd.Kind != "Proxy" {
			rest = append(rest, doc)
			continue
		}
		md, err := structpb.NewStruct(pd.Spec.Metadata)
		if err != nil {
			return nil, nil, fmt.Errorf("document %d: proxy %s metadata: %w", i, pd.Metadata.Name, err)
		}
		node := &corev3.Node{Id: pd.Spec.ID, Metadata: md}
		if l := pd.Spec.Locality; l != nil {
			node.Locality = &corev3.Locality{Region: l.Region, Zone: l.Zone, SubZone: l.SubZone}
		}
		p, err := model.ParseProxy(node)
		if err != nil {
			return nil, nil, fmt.Errorf("document %d: proxy %s: %w", i, pd.Metadata.Name, err)
		}
		proxies = append(proxies, Proxy{Name: pd.Metadata.Name, Proxy: p})
	}
	return proxies, bytes.Join(rest, []byte("---\n")), nil
}
