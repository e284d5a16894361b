package bus

import (
	"fmt"
	"sync"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"
	mcp "istio.io/api/mcp/v1alpha1"
)

// mcpResourceTypeURL is the Any type URL of every resource on the wire.
const mcpResourceTypeURL = "type.googleapis.com/istio.mcp.v1alpha1.Resource"

// encoding is the wire form of one stored resource version, built on first use and then shared,
// read-only, by every stream that sends it.
type encoding struct {
	once  sync.Once
	any   *anypb.Any            // Any(istio.mcp.v1alpha1.Resource): a state-of-the-world element
	delta *discoveryv3.Resource // the same, wrapped for delta responses
	// deltaSize is the size of delta within a delta response.
	deltaSize int
	err       error
}

// wire returns the entry's encoding, computing it once.
func (e *entry) wire() (*encoding, error) {
	e.enc.once.Do(func() {
		m, err := toMCP(e.res)
		var b []byte
		if err == nil {
			b, err = proto.Marshal(m)
		}
		if err != nil {
			e.enc.err = fmt.Errorf("bus: encoding %q: %w", e.res.Name, err)
			return
		}
		e.enc.any = &anypb.Any{TypeUrl: mcpResourceTypeURL, Value: b}
		e.enc.delta = &discoveryv3.Resource{Name: e.res.Name, Version: e.res.Version, Resource: e.enc.any,
			Metadata: traceMetadata(e.res.Trace)}
		e.enc.deltaSize = lengthDelimited(proto.Size(e.enc.delta))
	})
	return &e.enc, e.enc.err
}

// toMCP converts a Resource to its MCP form.
func toMCP(r *Resource) (*mcp.Resource, error) {
	m := &mcp.Resource{Metadata: mcpMetadata(r, r.Version)}
	if r.Body != nil {
		body, err := anypb.New(r.Body)
		if err != nil {
			return nil, err
		}
		m.Body = body
	}
	return m, nil
}

func mcpMetadata(r *Resource, version string) *mcp.Metadata {
	md := &mcp.Metadata{
		Name:        r.Name,
		Version:     version,
		Labels:      r.Labels,
		Annotations: r.Annotations,
	}
	if !r.CreateTime.IsZero() {
		md.CreateTime = timestamppb.New(r.CreateTime)
	}
	return md
}

// wireSize is the size of r's MCP encoding with the given version, computed without encoding it
// (nor allocating); bodySize is the size of the body's encoding, or -1 to measure it.
func wireSize(r *Resource, version string, bodySize int) int {
	meta := stringField(r.Name) + stringField(version) + mapField(r.Labels) + mapField(r.Annotations)
	if !r.CreateTime.IsZero() {
		ts := 0
		if s := r.CreateTime.Unix(); s != 0 {
			ts += 1 + protowire.SizeVarint(uint64(s))
		}
		if n := r.CreateTime.Nanosecond(); n != 0 {
			ts += 1 + protowire.SizeVarint(uint64(n))
		}
		meta += lengthDelimited(ts)
	}
	n := lengthDelimited(meta)
	if r.Body != nil {
		if bodySize < 0 {
			bodySize = proto.Size(r.Body)
		}
		body := lengthDelimited(len("type.googleapis.com/") + len(r.Body.ProtoReflect().Descriptor().FullName()))
		if bodySize > 0 { // an empty value (a message with every field unset) is not encoded
			body += lengthDelimited(bodySize)
		}
		n += lengthDelimited(body)
	}
	return n
}

// stringField is the size of a proto3 string field (absent when empty).
func stringField(s string) int {
	if s == "" {
		return 0
	}
	return lengthDelimited(len(s))
}

// mapField is the size of a map<string, string> field: one entry message per key, holding the
// key and the value (always both).
func mapField(m map[string]string) int {
	n := 0
	for k, v := range m {
		n += lengthDelimited(lengthDelimited(len(k)) + lengthDelimited(len(v)))
	}
	return n
}

// lengthDelimited is the size of a length-delimited field of n bytes (one-byte tag).
func lengthDelimited(n int) int { return 1 + protowire.SizeVarint(uint64(n)) + n }

// decodeMCP decodes an Any(istio.mcp.v1alpha1.Resource). The body's message type must be linked
// into the binary (the global registry resolves it).
func decodeMCP(a *anypb.Any) (*Resource, error) {
	m, err := unmarshalMCP(a)
	if err != nil {
		return nil, err
	}
	return decodeBody(m)
}

// unmarshalMCP decodes the MCP envelope only, leaving the body encoded, so a consumer can skip
// the body of a version it already holds.
func unmarshalMCP(a *anypb.Any) (*mcp.Resource, error) {
	if a == nil {
		return nil, fmt.Errorf("bus: empty resource")
	}
	if a.GetTypeUrl() != mcpResourceTypeURL {
		return nil, fmt.Errorf("bus: resource of type %q, want %q", a.GetTypeUrl(), mcpResourceTypeURL)
	}
	m := &mcp.Resource{}
	if err := proto.Unmarshal(a.GetValue(), m); err != nil {
		return nil, fmt.Errorf("bus: decoding MCP resource: %w", err)
	}
	if m.GetMetadata().GetName() == "" {
		return nil, fmt.Errorf("bus: resource without a name")
	}
	return m, nil
}

// decodeBody converts an MCP resource to a Resource, decoding its body. A resource without a
// version (a producer that does not set one) gets its content version.
func decodeBody(m *mcp.Resource) (*Resource, error) {
	md := m.GetMetadata()
	r := &Resource{
		Name:        md.GetName(),
		Version:     md.GetVersion(),
		Labels:      md.GetLabels(),
		Annotations: md.GetAnnotations(),
	}
	if md.GetCreateTime() != nil {
		r.CreateTime = md.GetCreateTime().AsTime()
	}
	if m.GetBody() != nil {
		body, err := anypb.UnmarshalNew(m.GetBody(), proto.UnmarshalOptions{})
		if err != nil {
			return nil, fmt.Errorf("bus: decoding body of %q: %w", r.Name, err)
		}
		r.Body = body
	}
	if r.Version == "" {
		r.Version = ContentVersion(r)
	}
	return r, nil
}
