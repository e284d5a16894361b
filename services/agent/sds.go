package agent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"go.opentelemetry.io/otel/metric"

	"sailplane.dev/shared/grpcserver"
)

// The SDS resource names Istio's agent serves and istiod's xDS refers to.
const (
	WorkloadSecret = "default"
	RootSecret     = "ROOTCA"
)

// sdsServer is Envoy's SDS (state of the world and delta, from go-control-plane) for the one
// workload this agent serves, whatever node asks.
type sdsServer struct {
	log     *slog.Logger
	meters  metric.MeterProvider
	cache   cache.SnapshotCache
	version atomic.Int64
}

// oneNode maps every node to the same snapshot: all clients of the socket are this workload.
type oneNode struct{}

func (oneNode) ID(*corev3.Node) string { return "workload" }

func newSDSServer(log *slog.Logger, meters metric.MeterProvider) *sdsServer {
	return &sdsServer{log: log, meters: meters, cache: cache.NewSnapshotCache(false, oneNode{}, xdsLogger{log})}
}

// update pushes c to every open stream.
func (s *sdsServer) update(ctx context.Context, c *Credential) error {
	workload := &tlsv3.Secret{Name: WorkloadSecret, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: inline(c.ChainPEM), PrivateKey: inline(c.KeyPEM),
	}}}
	roots := &tlsv3.Secret{Name: RootSecret, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
		TrustedCa: inline(c.RootsPEM),
	}}}
	snap, err := cache.NewSnapshot(strconv.FormatInt(s.version.Add(1), 10), map[resource.Type][]types.Resource{
		resource.SecretType: {workload, roots},
	})
	if err != nil {
		return fmt.Errorf("SDS snapshot: %w", err)
	}
	return s.cache.SetSnapshot(ctx, oneNode{}.ID(nil), snap)
}

func inline(b []byte) *corev3.DataSource {
	return &corev3.DataSource{Specifier: &corev3.DataSource_InlineBytes{InlineBytes: b}}
}

// run serves SDS on the Unix socket at path until ctx ends.
func (s *sdsServer) run(ctx context.Context, path string) error {
	if err := removeStaleSocket(path); err != nil {
		return fmt.Errorf("SDS socket: %w", err)
	}
	g := grpcserver.New(s.log, grpcserver.WithMeterProvider(s.meters))
	secretv3.RegisterSecretDiscoveryServiceServer(g, server.NewServer(ctx, s.cache, nil))
	err := (&grpcserver.Server{Network: "unix", Addr: path, GRPC: g, Logger: s.log}).Run(ctx)
	_ = os.Remove(path)
	return err
}

// xdsLogger routes go-control-plane's logs to slog at debug level.
type xdsLogger struct{ log *slog.Logger }

func (l xdsLogger) Debugf(format string, args ...any) { l.log.Debug(fmt.Sprintf(format, args...)) }
func (l xdsLogger) Infof(format string, args ...any)  { l.log.Debug(fmt.Sprintf(format, args...)) }
func (l xdsLogger) Warnf(format string, args ...any)  { l.log.Warn(fmt.Sprintf(format, args...)) }
func (l xdsLogger) Errorf(format string, args ...any) { l.log.Error(fmt.Sprintf(format, args...)) }
