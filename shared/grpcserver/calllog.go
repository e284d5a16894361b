package grpcserver

import (
	"context"
	"log/slog"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// call is what the log lines of one RPC say of its caller beyond its address: what only the
// handler or an auth check learns (the verified identity), or the stream's first request
// (the xDS node), filled while the call runs and read when it opens and closes.
type call struct {
	mu       sync.Mutex
	identity string
	node     string
}

type callKey struct{}

// SetPeerIdentity records the caller's verified identity (a SPIFFE ID) for the RPC's log lines.
// Only the code that verified it knows it is verified (a bus's handshake, the ca's review of a
// certificate or token, xds-server's check against the mesh's trust bundle), so it says so here;
// outside a server New built, it does nothing.
func SetPeerIdentity(ctx context.Context, id string) {
	if c, ok := ctx.Value(callKey{}).(*call); ok && id != "" {
		c.mu.Lock()
		c.identity = id
		c.mu.Unlock()
	}
}

// PeerIdentity is the caller's identity as SetPeerIdentity recorded it (an authenticator,
// WithAuth), "" when none was.
func PeerIdentity(ctx context.Context) string {
	c, ok := ctx.Value(callKey{}).(*call)
	if !ok {
		return ""
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.identity
}

func (c *call) fields() logging.Fields {
	c.mu.Lock()
	defer c.mu.Unlock()
	var f logging.Fields
	if c.identity != "" {
		f = append(f, "peer.identity", c.identity)
	}
	if c.node != "" {
		f = append(f, "node", c.node)
	}
	return f
}

// xdsRequest is any xDS request (state of the world or delta, of the bus or of xds-server): its
// first one names the client's node.
type xdsRequest interface{ GetNode() *corev3.Node }

// callStream notes the node of the stream's first xDS request, so that the stream's log lines
// name the proxy (or bus consumer) without the handler's help and without a line per request.
type callStream struct {
	grpc.ServerStream
	ctx      context.Context
	call     *call
	received bool
}

func (s *callStream) Context() context.Context { return s.ctx }

func (s *callStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil && !s.received {
		s.received = true
		if req, ok := m.(xdsRequest); ok {
			if id := req.GetNode().GetId(); id != "" {
				s.call.mu.Lock()
				s.call.node = ClientText(id)
				s.call.mu.Unlock()
			}
		}
	}
	return err
}

func unaryCall(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	return handler(context.WithValue(ctx, callKey{}, &call{}), req)
}

func streamCall(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	c := &call{}
	return handler(srv, &callStream{ServerStream: ss, ctx: context.WithValue(ss.Context(), callKey{}, c), call: c})
}

// callFields are the fields of the call (SetPeerIdentity, the xDS node) for the logging
// interceptor, which asks when it logs, so what was learned since the call opened is in.
func callFields(ctx context.Context) logging.Fields {
	if c, ok := ctx.Value(callKey{}).(*call); ok {
		return c.fields()
	}
	return nil
}

// callLevel is the level of a call's log lines: Debug when it ended normally (a client closing
// its stream is Canceled), Warn for what points at this server, Info for the rest (the client's
// mistakes or refusals, which the handler logs itself when they matter).
func callLevel(code codes.Code) logging.Level {
	switch code {
	case codes.OK, codes.Canceled:
		return logging.LevelDebug
	case codes.Unknown, codes.Internal, codes.DataLoss:
		return logging.LevelWarn
	default:
		return logging.LevelInfo
	}
}

// callLogger writes the logging interceptor's lines to log, without the call's start time
// (the line's own time says it) nor, on a stream's first line, the time to its first message.
func callLogger(log *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(ctx context.Context, level logging.Level, msg string, fields ...any) {
		if !log.Enabled(ctx, slog.Level(level)) {
			return
		}
		started := msg == "started call"
		attrs := make([]any, 0, len(fields))
		for i := 0; i+1 < len(fields); i += 2 {
			switch k, _ := fields[i].(string); {
			case k == "grpc.start_time", started && k == "grpc.duration":
			default:
				attrs = append(attrs, fields[i], fields[i+1])
			}
		}
		log.Log(ctx, slog.Level(level), "gRPC "+msg, attrs...)
	})
}

// callLogOptions log a call's end with its peer, identity, node, duration and code; and a
// stream's start too (at its first message), since streams last.
func callLogOptions(events ...logging.LoggableEvent) []logging.Option {
	return []logging.Option{
		logging.WithLogOnEvents(events...),
		logging.WithLevels(callLevel),
		logging.WithFieldsFromContext(callFields),
		logging.WithDurationField(logging.DurationToDurationField),
		logging.WithDisableLoggingFields(logging.SystemTag[0], logging.ComponentFieldKey),
	}
}
