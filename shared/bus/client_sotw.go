package bus

import (
	"context"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
)

// DialSotW returns a gRPC consumer of the bus at target using state-of-the-world ADS (one
// stream carrying every type), for producers that do not speak delta, such as an Istio control
// plane. Each response is diffed against the consumer's mirror, so the Handler sees changes only.
func DialSotW(target string, opts ...DialOption) Source {
	return &sotwClient{target: target, cfg: newDialConfig(opts)}
}

type sotwClient struct {
	target string
	cfg    *dialConfig
}

var _ Source = (*sotwClient)(nil)

func (sc *sotwClient) Subscribe(ctx context.Context, typeURLs []string, h Handler) error {
	cs := newConsumerState(sc.target, typeURLs, h, sc.cfg)
	defer cs.release()
	if len(cs.order) == 0 {
		h.Synced()
		<-ctx.Done()
		return nil
	}
	acked := map[string]string{} // version_info last accepted, per type; kept across sessions
	return sc.cfg.run(ctx, sc.target, func(ctx context.Context, conn *grpc.ClientConn) (bool, error) {
		return sc.session(ctx, conn, cs, acked)
	})
}

func (sc *sotwClient) session(ctx context.Context, conn *grpc.ClientConn, cs *consumerState, acked map[string]string) (bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return false, err
	}
	for i, typ := range cs.order {
		req := &discoveryv3.DiscoveryRequest{TypeUrl: cs.views[typ].wireURL, VersionInfo: acked[typ]}
		if i == 0 {
			req.Node = sc.cfg.node()
		}
		if err := stream.Send(req); err != nil {
			return false, err
		}
	}
	progress := false
	for {
		resp, err := stream.Recv()
		if err != nil {
			return progress, err
		}
		progress = true
		typ := canonicalType(resp.GetTypeUrl())
		req := &discoveryv3.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}
		if v := cs.views[typ]; v != nil {
			c, all, decodeErr := decodeSotW(v, resp)
			if err := cs.process(typ, c, decodeErr, all, true); err != nil {
				req.ErrorDetail = nackStatus(err)
			} else {
				acked[typ] = resp.GetVersionInfo()
			}
			req.VersionInfo = acked[typ]
		}
		if err := stream.Send(req); err != nil {
			return progress, err
		}
	}
}

// decodeSotW diffs a full state against the consumer's mirror.
func decodeSotW(v *consumerView, resp *discoveryv3.DiscoveryResponse) (Change, map[string]string, error) {
	c := Change{TypeURL: v.wireURL}
	present := make(map[string]struct{}, len(resp.GetResources()))
	all := make(map[string]string, len(resp.GetResources()))
	var firstErr error
	for _, a := range resp.GetResources() {
		m, err := unmarshalMCP(a)
		var r *Resource
		if err == nil {
			name, version := m.GetMetadata().GetName(), m.GetMetadata().GetVersion()
			present[name] = struct{}{}
			all[name] = version
			if version != "" && !v.wants(name, version) {
				continue // already held or rejected: skip decoding the body
			}
			if r, err = decodeBody(m); err == nil && v.wants(r.Name, r.Version) {
				c.Updated = append(c.Updated, r)
			}
		}
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if firstErr != nil {
		// Names of undecodable resources are unknown: keep everything, reject what decoded.
		return c, all, firstErr
	}
	for n := range v.have {
		if _, ok := present[n]; !ok {
			c.Removed = append(c.Removed, n)
		}
	}
	return c, nil, nil
}
