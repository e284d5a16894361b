package loadgen

import (
	"bytes"
	"fmt"
	"slices"
	"sync"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// requestCodec encodes the simulated proxies' requests. A state-of-the-world client repeats
// every subscribed name in every ACK (a thousand EDS names here), and the proxies of a run
// share their name lists, so each list is encoded once and referenced by every request: the
// load generator shares the machine with the server it measures, and real Envoys would not
// spend the server's CPU on this.
type requestCodec struct {
	mu    sync.Mutex
	lists map[*string]encodedNames
}

type encodedNames struct {
	names []string // kept so the list (the key's memory) stays alive and can be compared
	enc   []byte
}

var _ encoding.CodecV2 = (*requestCodec)(nil)

func newRequestCodec() *requestCodec { return &requestCodec{lists: map[*string]encodedNames{}} }

func (*requestCodec) Name() string { return protocodec.Name }

func (*requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*sotwResponse); ok {
		return r.unmarshal(data)
	}
	return encoding.GetCodecV2(protocodec.Name).Unmarshal(data, v)
}

// requestNamesField is DiscoveryRequest.resource_names.
const requestNamesField = 3

func (c *requestCodec) Marshal(v any) (mem.BufferSlice, error) {
	req, ok := v.(*discoverygrpc.DiscoveryRequest)
	if !ok || len(req.GetResourceNames()) < 16 {
		return encoding.GetCodecV2(protocodec.Name).Marshal(v)
	}
	names := req.GetResourceNames()
	key := &names[0]
	c.mu.Lock()
	cached, ok := c.lists[key]
	c.mu.Unlock()
	if !ok || len(cached.names) != len(names) {
		var enc []byte
		for _, n := range names {
			enc = protowire.AppendTag(enc, requestNamesField, protowire.BytesType)
			enc = protowire.AppendString(enc, n)
		}
		cached = encodedNames{names: names, enc: enc}
		c.mu.Lock()
		c.lists[key] = cached
		c.mu.Unlock()
	}
	rest, err := proto.Marshal(&discoverygrpc.DiscoveryRequest{VersionInfo: req.GetVersionInfo(), Node: req.GetNode(),
		TypeUrl: req.GetTypeUrl(), ResponseNonce: req.GetResponseNonce(), ErrorDetail: req.GetErrorDetail(),
		ResourceLocators: req.GetResourceLocators()})
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(rest), mem.SliceBuffer(cached.enc)}, nil
}

// sotwResponse is a state-of-the-world DiscoveryResponse as a simulated proxy reads it: in
// place, in the buffers gRPC received it in, neither joined nor copied into Any messages. At
// 10,000 sidecars one route change is gigabytes, and those copies and their garbage made the
// load generator use more CPU than the server it measures, on the same cores. Call free once
// done with the values.
type sotwResponse struct {
	held                    mem.BufferSlice
	size                    int // encoded size
	version, nonce, typeURL string
	values                  []segment // each resource's Any.value, in order
}

func (r *sotwResponse) free() {
	r.held.Free()
	r.held = nil
	clear(r.values)
	r.values = r.values[:0]
}

// DiscoveryResponse fields (envoy.service.discovery.v3) and Any's.
const (
	responseVersionField   = 1
	responseResourcesField = 2
	responseTypeURLField   = 4
	responseNonceField     = 5
	anyValueField          = 2
)

func (r *sotwResponse) unmarshal(data mem.BufferSlice) error {
	r.free()
	data.Ref()
	r.held, r.size = data, data.Len()
	pieces := make(segment, 0, len(data))
	for _, b := range data {
		pieces = append(pieces, b.ReadOnlyData())
	}
	return eachField(pieces, func(num protowire.Number, v segment) error {
		switch num {
		case responseVersionField:
			r.version = string(v.bytes())
		case responseTypeURLField:
			r.typeURL = string(v.bytes())
		case responseNonceField:
			r.nonce = string(v.bytes())
		case responseResourcesField:
			var value segment
			err := eachField(v, func(num protowire.Number, v segment) error {
				if num == anyValueField {
					value = v
				}
				return nil
			})
			if err != nil {
				return err
			}
			r.values = append(r.values, value)
		}
		return nil
	})
}

// segment is an encoded message, or part of one, in pieces.
type segment [][]byte

// bytes is the segment in one piece; joined (a copy) only when it is not.
func (s segment) bytes() []byte {
	switch len(s) {
	case 0:
		return nil
	case 1:
		return s[0]
	}
	return bytes.Join(s, nil)
}

// prefix is the segment's first n bytes at most, in one piece.
func (s segment) prefix(n int) []byte {
	if len(s) > 0 && len(s[0]) >= n {
		return s[0][:n]
	}
	var b []byte
	for _, p := range s {
		if len(b)+len(p) >= n {
			return append(b, p[:n-len(b)]...)
		}
		b = append(b, p...)
	}
	return b
}

// contains reports whether sub (non-empty) occurs in the segment, across pieces too.
func (s segment) contains(sub []byte) bool {
	for i, p := range s {
		if bytes.Contains(p, sub) {
			return true
		}
		if i+1 < len(s) {
			// An occurrence that straddles the boundary lies in the last len(sub)-1 bytes of
			// this piece and the first len(sub)-1 of the rest.
			tail := p[max(len(p)-len(sub)+1, 0):]
			if bytes.Contains(append(slices.Clone(tail), segment(s[i+1:]).prefix(len(sub)-1)...), sub) {
				return true
			}
		}
	}
	return false
}

// eachField calls fn with each length-delimited field of the message in s (other wire types are
// skipped), the field's value aliasing s.
func eachField(s segment, fn func(protowire.Number, segment) error) error {
	c := cursor{s: s}
	for !c.done() {
		tag, err := c.varint()
		if err != nil {
			return err
		}
		num, typ := protowire.DecodeTag(tag)
		var n uint64
		switch typ {
		case protowire.VarintType:
			_, err = c.varint()
		case protowire.Fixed32Type:
			_, err = c.take(4)
		case protowire.Fixed64Type:
			_, err = c.take(8)
		case protowire.BytesType:
			if n, err = c.varint(); err == nil {
				var v segment
				if v, err = c.take(n); err == nil {
					err = fn(num, v)
				}
			}
		default:
			err = fmt.Errorf("%w: field %d: wire type %d", ErrProtocol, num, typ)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// cursor reads a segment front to back.
type cursor struct {
	s   segment
	off int // into s[0]
}

func (c *cursor) done() bool {
	for len(c.s) > 0 && c.off == len(c.s[0]) {
		c.s, c.off = c.s[1:], 0
	}
	return len(c.s) == 0
}

func (c *cursor) varint() (uint64, error) {
	var v uint64
	for shift := 0; shift < 64; shift += 7 {
		if c.done() {
			return 0, fmt.Errorf("%w: truncated varint", ErrProtocol)
		}
		b := c.s[0][c.off]
		c.off++
		v |= uint64(b&0x7f) << shift
		if b < 0x80 {
			return v, nil
		}
	}
	return 0, fmt.Errorf("%w: varint overflow", ErrProtocol)
}

// take returns the next n bytes, aliasing the pieces they are in.
func (c *cursor) take(n uint64) (segment, error) {
	var out segment
	for n > 0 {
		if c.done() {
			return nil, fmt.Errorf("%w: truncated field", ErrProtocol)
		}
		p := c.s[0][c.off:]
		k := min(uint64(len(p)), n)
		out = append(out, p[:k])
		c.off += int(k)
		n -= k
	}
	return out, nil
}
