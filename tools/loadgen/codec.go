package loadgen

import (
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
