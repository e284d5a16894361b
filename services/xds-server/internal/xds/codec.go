package xds

import (
	"bytes"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"unicode/utf8"
	"unsafe"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"sailplane.dev/shared/bufpool"
)

// Codec is the gRPC codec for the ADS server (grpc.ForceServerCodecV2). It encodes discovery
// responses without copying their resources: the encoded bytes each resource already holds
// (shared by every connection through the cache) are referenced by the outgoing message, not
// marshaled into a fresh buffer per connection. With thousands of proxies receiving the same
// megabytes, that copy was most of the server's memory and much of its CPU. Other messages
// use the standard proto codec.
func Codec() encoding.CodecV2 { return adsCodec{} }

type adsCodec struct{}

// requestBuffers holds the buffers requests received in pieces are joined into (a state-of-the-
// world EDS ACK repeats a thousand names: tens of KiB).
var requestBuffers = &bufpool.Dirty{}

var _ encoding.CodecV2 = adsCodec{}

func (adsCodec) Name() string { return protocodec.Name }

func (adsCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if req, ok := v.(*discoverygrpc.DiscoveryRequest); ok {
		if len(data) == 1 {
			// Borrowed until we return: unmarshalRequest copies what it keeps.
			return unmarshalRequest(data[0].ReadOnlyData(), false, req)
		}
		// A pooled copy, also borrowed: most requests repeat a known name list and keep nothing.
		// The pool does not clear its buffers: the copy overwrites what is read.
		buf := data.MaterializeToBuffer(requestBuffers)
		defer buf.Free()
		return unmarshalRequest(buf.ReadOnlyData(), false, req)
	}
	return encoding.GetCodecV2(protocodec.Name).Unmarshal(data, v)
}

// Fields of the messages the codec encodes or decodes by hand.
const (
	sotwResourcesField  = 2 // DiscoveryResponse.resources, repeated Any
	deltaResourcesField = 2 // DeltaDiscoveryResponse.resources, repeated Resource
	resourceAnyField    = 2 // Resource.resource, Any
	anyTypeURLField     = 1
	anyValueField       = 2
	requestNamesField   = 3 // DiscoveryRequest.resource_names
	// DiscoveryResponse.control_plane and DeltaDiscoveryResponse.control_plane.
	sotwControlPlaneField  = 6
	deltaControlPlaneField = 7
)

// nameLists remembers recently decoded name lists by their encoding. State-of-the-world
// clients repeat every subscribed name in every request (a thousand EDS clusters for each
// ACK), and the proxies of a scope repeat the same list: a list seen before is reused as is,
// neither copied nor validated again.
var nameLists = struct {
	seed maphash.Seed
	mu   sync.Mutex
	m    map[uint64]nameList
}{seed: maphash.MakeSeed(), m: map[uint64]nameList{}}

type nameList struct {
	raw   []byte
	names []string // shared by every request carrying raw: never modified
}

// maxNameLists bounds nameLists; past it the cache starts over.
const maxNameLists = 256

// unmarshalRequest decodes a state-of-the-world request; owned says whether b may be kept.
// Names are strings sharing the request's bytes (or a known list's), not one allocation each;
// the other fields decode normally.
func unmarshalRequest(b []byte, owned bool, req *discoverygrpc.DiscoveryRequest) error {
	// First pass: sizes, and where the names are (normally one contiguous run).
	count, restLen, first, last, contiguous := 0, 0, -1, -1, true
	for off := 0; off < len(b); {
		num, typ, n := protowire.ConsumeTag(b[off:])
		if n < 0 {
			return fmt.Errorf("decode discovery request: %w", protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, b[off+n:])
		if m < 0 {
			return fmt.Errorf("decode discovery request: %w", protowire.ParseError(m))
		}
		if num == requestNamesField && typ == protowire.BytesType {
			if first < 0 {
				first = off
			} else if last != off {
				contiguous = false
			}
			last = off + n + m
			count++
		} else {
			restLen += n + m
		}
		off += n + m
	}
	rest := make([]byte, 0, restLen)
	for off := 0; off < len(b); {
		num, typ, n := protowire.ConsumeTag(b[off:])
		m := protowire.ConsumeFieldValue(num, typ, b[off+n:])
		if num != requestNamesField || typ != protowire.BytesType {
			rest = append(rest, b[off:off+n+m]...)
		}
		off += n + m
	}
	if err := proto.Unmarshal(rest, req); err != nil {
		return err
	}
	if count == 0 {
		req.ResourceNames = nil
		return nil
	}
	cacheable := count >= 16 && contiguous
	var key uint64
	if cacheable {
		key = maphash.Bytes(nameLists.seed, b[first:last])
		nameLists.mu.Lock()
		l, ok := nameLists.m[key]
		nameLists.mu.Unlock()
		if ok && bytes.Equal(l.raw, b[first:last]) {
			req.ResourceNames = l.names
			return nil
		}
	}
	if !owned {
		// Keep only the names' bytes, in one allocation.
		b = bytes.Clone(b[first:last])
		first, last = 0, len(b)
	}
	names := make([]string, 0, count)
	for off := first; off < last; {
		num, typ, n := protowire.ConsumeTag(b[off:])
		m := protowire.ConsumeFieldValue(num, typ, b[off+n:])
		if num == requestNamesField && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b[off+n:])
			if !utf8.Valid(v) {
				return errors.New("decode discovery request: resource name is not valid UTF-8")
			}
			names = append(names, unsafe.String(unsafe.SliceData(v), len(v)))
		}
		off += n + m
	}
	req.ResourceNames = names
	if cacheable {
		nameLists.mu.Lock()
		if len(nameLists.m) >= maxNameLists {
			clear(nameLists.m)
		}
		nameLists.m[key] = nameList{raw: b[first:last], names: names}
		nameLists.mu.Unlock()
	}
	return nil
}

// preparedResponse is a discovery response whose resources are cache entries, encoded from
// their pre-encoded bytes: no per-connection copy and no per-send allocation per resource.
type preparedResponse struct {
	// head is the *DiscoveryResponse or *DeltaDiscoveryResponse without its resources.
	head    proto.Message
	delta   bool
	entries []*entry
	// controlPlane is the encoded control_plane field, sent after head.
	controlPlane mem.Buffer
	// size is the encoded size, set when the codec marshals it.
	size int
}

func (p *preparedResponse) marshal() (mem.BufferSlice, error) {
	rest, err := proto.Marshal(p.head)
	if err != nil {
		return nil, fmt.Errorf("marshal discovery response: %w", err)
	}
	out := make(mem.BufferSlice, 0, 2+2*len(p.entries))
	out = append(out, mem.SliceBuffer(rest))
	if p.controlPlane != nil {
		out = append(out, p.controlPlane)
	}
	for _, e := range p.entries {
		if p.delta {
			out = append(out, mem.SliceBuffer(e.deltaPrefix))
		} else {
			out = append(out, mem.SliceBuffer(e.sotwPrefix))
		}
		if len(e.anyEnc) > 0 {
			out = append(out, mem.SliceBuffer(e.anyEnc))
		}
	}
	p.size = out.Len()
	return out, nil
}

func (adsCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *preparedResponse:
		return m.marshal()
	case *discoverygrpc.DiscoveryResponse:
		return marshalSotW(m)
	case *discoverygrpc.DeltaDiscoveryResponse:
		return marshalDelta(m)
	}
	return encoding.GetCodecV2(protocodec.Name).Marshal(v)
}

// without returns a shallow copy of m without field skip, to marshal the rest normally.
func without(m proto.Message, skip protoreflect.FieldNumber) proto.Message {
	src := m.ProtoReflect()
	out := src.New()
	src.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Number() != skip {
			out.Set(fd, v)
		}
		return true
	})
	return out.Interface()
}

// anyHeader appends the encoding of a as a length-delimited field num, up to (not including)
// its value bytes, and returns the value bytes to send after it.
func anyHeader(b []byte, num protowire.Number, a *anypb.Any) ([]byte, []byte) {
	value := a.GetValue()
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(anySize(a)))
	if a.GetTypeUrl() != "" {
		b = protowire.AppendTag(b, anyTypeURLField, protowire.BytesType)
		b = protowire.AppendString(b, a.GetTypeUrl())
	}
	if len(value) > 0 {
		b = protowire.AppendTag(b, anyValueField, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(len(value)))
	}
	return b, value
}

func anySize(a *anypb.Any) int {
	n := 0
	if a.GetTypeUrl() != "" {
		n += protowire.SizeTag(anyTypeURLField) + protowire.SizeBytes(len(a.GetTypeUrl()))
	}
	if len(a.GetValue()) > 0 {
		n += protowire.SizeTag(anyValueField) + protowire.SizeBytes(len(a.GetValue()))
	}
	return n
}

func marshalSotW(m *discoverygrpc.DiscoveryResponse) (mem.BufferSlice, error) {
	rest, err := proto.Marshal(without(m, sotwResourcesField))
	if err != nil {
		return nil, fmt.Errorf("marshal discovery response: %w", err)
	}
	out := make(mem.BufferSlice, 0, 1+2*len(m.GetResources()))
	out = append(out, mem.SliceBuffer(rest))
	// One buffer holds every resource's header; the values are referenced where they are.
	headers := make([]byte, 0, len(m.GetResources())*(16+len(m.GetTypeUrl())))
	type piece struct {
		start, end int
		value      []byte
	}
	pieces := make([]piece, 0, len(m.GetResources()))
	for _, a := range m.GetResources() {
		start := len(headers)
		var value []byte
		headers, value = anyHeader(headers, sotwResourcesField, a)
		pieces = append(pieces, piece{start, len(headers), value})
	}
	for _, p := range pieces {
		out = append(out, mem.SliceBuffer(headers[p.start:p.end:p.end]))
		if len(p.value) > 0 {
			out = append(out, mem.SliceBuffer(p.value))
		}
	}
	return out, nil
}

func marshalDelta(m *discoverygrpc.DeltaDiscoveryResponse) (mem.BufferSlice, error) {
	rest, err := proto.Marshal(without(m, deltaResourcesField))
	if err != nil {
		return nil, fmt.Errorf("marshal delta discovery response: %w", err)
	}
	out := make(mem.BufferSlice, 0, 1+2*len(m.GetResources()))
	out = append(out, mem.SliceBuffer(rest))
	for _, r := range m.GetResources() {
		meta, err := proto.Marshal(without(r, resourceAnyField))
		if err != nil {
			return nil, fmt.Errorf("marshal delta resource %q: %w", r.GetName(), err)
		}
		a := r.GetResource()
		size := len(meta)
		if a != nil {
			n := anySize(a)
			size += protowire.SizeTag(resourceAnyField) + protowire.SizeBytes(n)
		}
		h := make([]byte, 0, 16+len(meta)+len(a.GetTypeUrl())+16)
		h = protowire.AppendTag(h, deltaResourcesField, protowire.BytesType)
		h = protowire.AppendVarint(h, uint64(size))
		h = append(h, meta...)
		var value []byte
		if a != nil {
			h, value = anyHeader(h, resourceAnyField, a)
		}
		out = append(out, mem.SliceBuffer(h))
		if len(value) > 0 {
			out = append(out, mem.SliceBuffer(value))
		}
	}
	return out, nil
}
