package xdsserver

import (
	"context"
	"log/slog"
	"math"
	"net"
	"slices"
	"sync"
	"time"

	orcadata "github.com/cncf/xds/go/xds/data/orca/v3"
	orcaservice "github.com/cncf/xds/go/xds/service/orca/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// Rebalancing by load. Proxies keep their ADS connection for hours, so replicas added by the
// autoscaler, or restarted, stay nearly empty while the others keep theirs (MaxConnectionAge
// only moves connections slowly, and blindly). Each replica therefore publishes its number of
// ADS streams as an ORCA load report (xds.service.orca.v3.OpenRcaService, the load-report
// service gRPC and Envoy know, as the named metric connectionsMetric) on its xDS ports, reads
// its peers' (--xds-peers: addresses, or a headless Service's name whose addresses are every
// replica), and, when it holds more than the average by RebalanceMargin, closes some of its
// newest connections each round, so that their proxies reconnect through the Service and
// spread. Each round moves at most half the excess: the replicas converge without
// overshooting, whatever the others do at the same time.

// connectionsMetric is the ORCA named metric holding a replica's ADS stream count.
const connectionsMetric = "xds_connections"

// instanceHeader names the server answering a load report (Server.instance), so a replica
// finds itself among the addresses of its peers.
const instanceHeader = "sailplane-instance"

// Rebalancing defaults; see Config.
const (
	defaultRebalanceInterval = 10 * time.Second
	defaultRebalanceMargin   = 0.1
	// minReportInterval bounds how often a load report may be asked for.
	minReportInterval = 50 * time.Millisecond
)

// loadReporter serves this replica's load as ORCA reports.
type loadReporter struct {
	orcaservice.UnimplementedOpenRcaServiceServer
	instance string
	load     func() int
}

func (r *loadReporter) StreamCoreMetrics(req *orcaservice.OrcaLoadReportRequest, stream grpc.ServerStreamingServer[orcadata.OrcaLoadReport]) error {
	if err := stream.SendHeader(metadata.Pairs(instanceHeader, r.instance)); err != nil {
		return err
	}
	interval := max(req.GetReportInterval().AsDuration(), minReportInterval)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		report := &orcadata.OrcaLoadReport{NamedMetrics: map[string]float64{connectionsMetric: float64(r.load())}}
		if err := stream.Send(report); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-t.C:
		}
	}
}

// rebalancer sheds connections while this replica holds more than its share.
type rebalancer struct {
	log      *slog.Logger
	instance string   // this server's, as its load reports name it
	peers    []string // host:port; a host name stands for each of its addresses
	interval time.Duration
	margin   float64
	load     func() int
	// shed closes the connections of up to n streams and returns how many it closed.
	shed func(n int) int

	conns map[string]*grpc.ClientConn
}

// Run rebalances every interval until ctx ends.
func (r *rebalancer) Run(ctx context.Context) error {
	r.conns = map[string]*grpc.ClientConn{}
	defer func() {
		for _, c := range r.conns {
			_ = c.Close()
		}
	}()
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		r.round(ctx)
	}
}

// round reads the peers' loads and sheds this replica's excess, at most half of it.
func (r *rebalancer) round(ctx context.Context) {
	loads := r.peerLoads(ctx)
	own := r.load()
	total, replicas := float64(own), 1.0
	for _, l := range loads {
		total += l
		replicas++
	}
	if replicas < 2 {
		return
	}
	avg := total / replicas
	if float64(own) <= avg*(1+r.margin) || float64(own)-avg < 1 {
		return
	}
	n := int(math.Ceil((float64(own) - avg) / 2))
	shed := r.shed(n)
	r.log.Info("rebalancing: closed connections above this replica's share, their proxies reconnect through the Service",
		"connections", own, "average", math.Round(avg*10)/10, "replicas", int(replicas), "closed", shed)
}

// peerLoads asks every peer address for one load report, in parallel; this replica's own
// address and peers that do not answer within the round are left out.
func (r *rebalancer) peerLoads(ctx context.Context) map[string]float64 {
	addrs := r.resolve(ctx)
	ctx, cancel := context.WithTimeout(ctx, r.interval/2)
	defer cancel()
	var mu sync.Mutex
	loads := map[string]float64{}
	var wg sync.WaitGroup
	for _, addr := range addrs {
		cc := r.conn(addr)
		if cc == nil {
			continue
		}
		wg.Go(func() {
			l, ok := r.report(ctx, cc)
			if ok {
				mu.Lock()
				loads[addr] = l
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	// Forget connections to addresses gone from the peers.
	for addr, cc := range r.conns {
		if _, ok := loads[addr]; !ok && !slices.Contains(addrs, addr) {
			_ = cc.Close()
			delete(r.conns, addr)
		}
	}
	return loads
}

func (r *rebalancer) report(ctx context.Context, cc *grpc.ClientConn) (float64, bool) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := orcaservice.NewOpenRcaServiceClient(cc).StreamCoreMetrics(ctx, &orcaservice.OrcaLoadReportRequest{})
	if err != nil {
		return 0, false
	}
	h, err := stream.Header()
	if err != nil || slices.Contains(h.Get(instanceHeader), r.instance) {
		return 0, false
	}
	rep, err := stream.Recv()
	if err != nil {
		return 0, false
	}
	l, ok := rep.GetNamedMetrics()[connectionsMetric]
	return l, ok
}

// resolve expands each peer into its addresses (a headless Service has one per replica).
func (r *rebalancer) resolve(ctx context.Context) []string {
	var out []string
	for _, p := range r.peers {
		host, port, err := net.SplitHostPort(p)
		if err != nil {
			r.log.Warn("ignoring peer", "peer", p, "err", err)
			continue
		}
		if net.ParseIP(host) != nil {
			out = append(out, p)
			continue
		}
		ips, err := net.DefaultResolver.LookupHost(ctx, host)
		if err != nil {
			r.log.Debug("resolving peer", "peer", p, "err", err)
			continue
		}
		for _, ip := range ips {
			out = append(out, net.JoinHostPort(ip, port))
		}
	}
	return out
}

func (r *rebalancer) conn(addr string) *grpc.ClientConn {
	if cc := r.conns[addr]; cc != nil {
		return cc
	}
	// The report says only how many streams a replica holds; the plaintext port serves it.
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		r.log.Warn("peer", "addr", addr, "err", err)
		return nil
	}
	r.conns[addr] = cc
	return cc
}
