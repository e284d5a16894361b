package bus

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/types/known/structpb"

	"sailplane.dev/shared/grpcserver"

	// Link every bus kind's Go package so anypb.UnmarshalNew can resolve their bodies.
	_ "sailplane.dev/shared/schema"
)

// maxRecvMsgSize is what a consumer accepts in one message, as istiod's xDS and MCP clients do
// (math.MaxInt32): a state-of-the-world response carries a type's whole state and cannot be
// split, and producers other than ours may not split delta responses. Sailplane's producers
// bound each resource (MaxResourceBytes) and each delta response (in parts).
const maxRecvMsgSize = math.MaxInt32

// Reconnection backoff defaults: a consumer whose peer restarts is back within a few seconds
// however long the peer was gone.
const (
	DefaultBackoffInitial = 100 * time.Millisecond
	DefaultBackoffMax     = 2 * time.Second
)

// maxInitialVersionsBytes bounds the initial_resource_versions of one delta request, well under
// the servers' receive limit (grpcserver.MaxRecvMsgSize). A consumer holding more of a type
// resubscribes without them and reconciles deletions from the full state it receives.
const maxInitialVersionsBytes = grpcserver.MaxRecvMsgSize / 2

// DialOption configures a gRPC consumer.
type DialOption func(*dialConfig)

type dialConfig struct {
	log                        *slog.Logger
	nodeID                     string
	nodeMeta                   map[string]string
	creds                      credentials.TransportCredentials
	backoffInitial, backoffMax time.Duration
	grpcOpts                   []grpc.DialOption
	plaintextDialOut           bool
	meterProvider              metric.MeterProvider
	// maxInitialVersions is maxInitialVersionsBytes; tests lower it.
	maxInitialVersions int
	// keepalive is grpcserver.ClientKeepalive; tests shorten it.
	keepalive keepalive.ClientParameters
}

// WithDialLogger sets the consumer's logger.
func WithDialLogger(l *slog.Logger) DialOption {
	return func(c *dialConfig) {
		if l != nil {
			c.log = l
		}
	}
}

// WithNodeID sets the node.id the consumer presents; producers name it in their Rejections.
func WithNodeID(id string) DialOption { return func(c *dialConfig) { c.nodeID = id } }

// WithNodeMetadata adds string fields to the node metadata the consumer presents (GENERATOR
// is always "api"): an Istio producer reads NAMESPACE, CLUSTER_ID and ISTIO_VERSION.
func WithNodeMetadata(meta map[string]string) DialOption {
	return func(c *dialConfig) { c.nodeMeta = maps.Clone(meta) }
}

// WithTransportCredentials sets the connection's credentials (default: insecure).
func WithTransportCredentials(tc credentials.TransportCredentials) DialOption {
	return func(c *dialConfig) { c.creds = tc }
}

// WithBackoff sets the reconnection backoff bounds (default DefaultBackoffInitial to
// DefaultBackoffMax).
func WithBackoff(initial, maxDelay time.Duration) DialOption {
	return func(c *dialConfig) { c.backoffInitial, c.backoffMax = initial, maxDelay }
}

// WithConsumerMeterProvider sets where the consumer reports what it holds (default: the
// global provider).
func WithConsumerMeterProvider(p metric.MeterProvider) DialOption {
	return func(c *dialConfig) { c.meterProvider = p }
}

// WithGRPCDialOptions adds options to the gRPC client connection (interceptors, per-RPC
// credentials, ...).
func WithGRPCDialOptions(opts ...grpc.DialOption) DialOption {
	return func(c *dialConfig) { c.grpcOpts = append(c.grpcOpts, opts...) }
}

func newDialConfig(opts []DialOption) *dialConfig {
	c := &dialConfig{
		log:                slog.New(slog.DiscardHandler),
		creds:              insecure.NewCredentials(),
		backoffInitial:     DefaultBackoffInitial,
		backoffMax:         DefaultBackoffMax,
		maxInitialVersions: maxInitialVersionsBytes,
		keepalive:          grpcserver.ClientKeepalive,
	}
	if h, err := os.Hostname(); err == nil {
		c.nodeID = h
	}
	for _, o := range opts {
		o(c)
	}
	if c.backoffInitial <= 0 {
		c.backoffInitial = DefaultBackoffInitial
	}
	c.backoffMax = max(c.backoffMax, c.backoffInitial)
	return c
}

func (c *dialConfig) node() *corev3.Node {
	fields := map[string]*structpb.Value{}
	for k, v := range c.nodeMeta {
		fields[k] = structpb.NewStringValue(v)
	}
	// istiod answers config (MCP) requests only from its "api" generator.
	fields["GENERATOR"] = structpb.NewStringValue("api")
	return &corev3.Node{Id: c.nodeID, Metadata: &structpb.Struct{Fields: fields}}
}

// run keeps sessions going until ctx is done: each session is one stream; when it fails the
// consumer waits (retry: exponential, capped, jittered, reset once a session received
// something) and starts another on the same connection.
func (c *dialConfig) run(ctx context.Context, target string, session func(context.Context, *grpc.ClientConn) (progress bool, err error)) error {
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(c.creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecvMsgSize)),
		// Keep gRPC's own reconnection as eager as ours, so a restarted peer is found quickly.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: c.backoffInitial, Multiplier: 1.6, Jitter: 0.2, MaxDelay: c.backoffMax},
			MinConnectTimeout: 5 * time.Second,
		}),
		grpc.WithKeepaliveParams(c.keepalive),
	}, c.grpcOpts...)
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return fmt.Errorf("bus: dialing %q: %w", target, err)
	}
	defer conn.Close()

	r := retry{initial: c.backoffInitial, max: c.backoffMax}
	r.reset()
	for {
		progress, err := session(ctx, conn)
		if ctx.Err() != nil {
			return nil
		}
		if progress {
			r.reset()
		}
		wait := r.wait()
		c.log.Warn(fmt.Sprintf("bus: peer unreachable or stream failed, retrying in %s", wait.Round(time.Millisecond)),
			"target", target, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// retry is a consumer's reconnection schedule: delays double from initial up to max, and each
// wait is drawn from [delay/2, delay] so the consumers of a restarted peer do not all return at
// once.
type retry struct {
	initial, max, next time.Duration
}

func (r *retry) reset() { r.next = r.initial }

// wait returns how long to wait before the next attempt.
func (r *retry) wait() time.Duration {
	d := r.next
	r.next = min(2*d, r.max)
	return d/2 + rand.N(d/2+1)
}

// consumerState is a gRPC consumer's side of a subscription, kept across sessions: its mirror
// of each type and whether Synced was called.
type consumerState struct {
	h Handler
	// consumer names the subscription in delivery spans: the producer's address.
	consumer string
	log      *slog.Logger
	order    []string                 // canonical type URLs, as subscribed
	views    map[string]*consumerView // by canonical type URL
	seen     map[string]bool          // types whose first response was processed
	synced   bool
}

func newConsumerState(target string, typeURLs []string, h Handler, cfg *dialConfig) *consumerState {
	cs := &consumerState{h: h, log: cfg.log, consumer: target, views: map[string]*consumerView{}, seen: map[string]bool{}}
	held := newConsumerResources(cfg.meterProvider)
	for _, t := range typeURLs {
		typ := canonicalType(t)
		if _, dup := cs.views[typ]; !dup {
			cs.views[typ] = newConsumerView(t, held, cfg.nodeID)
			cs.order = append(cs.order, typ)
		}
	}
	return cs
}

// release uncounts what the consumer held, when its subscription ends.
func (cs *consumerState) release() {
	for _, v := range cs.views {
		v.release()
	}
}

// process applies one response's change (or its decoding error) and returns the error to NACK
// with, if any. rejectAll lists every (name, version) of the response, to remember as rejected
// when the response could not be decoded. last is false for a part of a split response other
// than its last: the type counts as received only with its last part.
func (cs *consumerState) process(typ string, c Change, decodeErr error, rejectAll map[string]string, last bool) error {
	v := cs.views[typ]
	first := !cs.seen[typ]
	if last {
		cs.seen[typ] = true
	}
	var err error
	switch {
	case decodeErr != nil:
		err = decodeErr
		maps.Copy(v.rejected, rejectAll)
	case first || len(c.Updated) > 0 || len(c.Removed) > 0:
		slices.SortFunc(c.Updated, func(a, b *Resource) int { return strings.Compare(a.Name, b.Name) })
		slices.Sort(c.Removed)
		span := startDelivery(&c, cs.consumer)
		err = cs.h.Apply(c)
		endDelivery(span, err)
		if err == nil {
			v.accepted(c)
		} else {
			v.rejectedChange("", c, err)
		}
	}
	if err != nil {
		cs.log.Warn("bus: rejecting update", "type", v.wireURL, "err", err)
	}
	if !cs.synced && len(cs.seen) == len(cs.order) {
		cs.synced = true
		cs.h.Synced()
	}
	return err
}

func nackStatus(err error) *status.Status {
	if err == nil {
		return nil
	}
	return &status.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
}

// Dial returns a gRPC consumer of the bus at target using delta ADS: one stream carries every
// subscribed type, and a reconnecting consumer receives only what changed.
func Dial(target string, opts ...DialOption) Source {
	return &deltaClient{target: target, cfg: newDialConfig(opts)}
}

type deltaClient struct {
	target string
	cfg    *dialConfig
}

var _ Source = (*deltaClient)(nil)

func (dc *deltaClient) Subscribe(ctx context.Context, typeURLs []string, h Handler) error {
	cs := newConsumerState(dc.target, typeURLs, h, dc.cfg)
	defer cs.release()
	if len(cs.order) == 0 {
		h.Synced()
		<-ctx.Done()
		return nil
	}
	return dc.cfg.run(ctx, dc.target, func(ctx context.Context, conn *grpc.ClientConn) (bool, error) {
		return dc.session(ctx, conn, cs)
	})
}

func (dc *deltaClient) session(ctx context.Context, conn *grpc.ClientConn, cs *consumerState) (bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		return false, err
	}
	return deltaSession(stream, cs, dc.cfg)
}

// deltaSession is one delta ADS session of a consumer on stream: it subscribes to cs's types and
// applies every response until the stream fails. The stream is one the consumer dialed, or one a
// producer dialed in (DialOut) with the roles swapped.
func deltaSession(stream grpc.BidiStreamingClient[discoveryv3.DeltaDiscoveryRequest, discoveryv3.DeltaDiscoveryResponse], cs *consumerState, cfg *dialConfig) (bool, error) {
	// Types subscribed without their initial versions (too many to send): the names their
	// initial state brought, to find what was deleted while the consumer was away.
	reconcile := map[string]map[string]struct{}{}
	for i, typ := range cs.order {
		v := cs.views[typ]
		req := &discoveryv3.DeltaDiscoveryRequest{
			TypeUrl:                 v.wireURL,
			ResourceNamesSubscribe:  []string{"*"},
			InitialResourceVersions: maps.Clone(v.have),
		}
		if size := mapField(v.have); size > cfg.maxInitialVersions {
			cfg.log.Info("bus: resubscribing without initial versions, too many to send; receiving the whole state",
				"type", v.wireURL, "resources", len(v.have), "bytes", size)
			req.InitialResourceVersions = nil
			reconcile[typ] = map[string]struct{}{}
		}
		if i == 0 {
			req.Node = cfg.node()
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
		ack := &discoveryv3.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()}
		if v := cs.views[typ]; v != nil {
			last := !moreParts(resp.GetSystemVersionInfo())
			c, all, decodeErr := decodeDelta(v, resp)
			if received, ok := reconcile[typ]; ok {
				for _, r := range resp.GetResources() {
					received[r.GetName()] = struct{}{}
				}
				if last {
					for n := range v.have {
						if _, ok := received[n]; !ok {
							c.Removed = append(c.Removed, n)
						}
					}
					delete(reconcile, typ)
				}
			}
			ack.ErrorDetail = nackStatus(cs.process(typ, c, decodeErr, all, last))
		}
		if err := stream.Send(ack); err != nil {
			return progress, err
		}
	}
}

// decodeDelta turns a delta response into the change that is news to the consumer.
func decodeDelta(v *consumerView, resp *discoveryv3.DeltaDiscoveryResponse) (Change, map[string]string, error) {
	c := Change{TypeURL: v.wireURL}
	var firstErr error
	for _, dr := range resp.GetResources() {
		if !v.wants(dr.GetName(), dr.GetVersion()) {
			continue
		}
		r, err := decodeMCP(dr.GetResource())
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if r.Version == "" {
			r.Version = dr.GetVersion()
		}
		r.Trace = traceOf(dr)
		c.Updated = append(c.Updated, r)
	}
	for _, n := range resp.GetRemovedResources() {
		if _, ok := v.have[n]; ok {
			c.Removed = append(c.Removed, n)
		}
	}
	if firstErr == nil {
		return c, nil, nil
	}
	all := map[string]string{}
	for _, dr := range resp.GetResources() {
		all[dr.GetName()] = dr.GetVersion()
	}
	return c, all, firstErr
}
