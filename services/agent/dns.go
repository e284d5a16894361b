package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	ndsv1 "sailplane.dev/proto/istio/networking/nds/v1"
	"sailplane.dev/services/agent/internal/dnsproxy"
	"sailplane.dev/shared/grpcbootstrap"
	"sailplane.dev/shared/grpcserver"
	"sailplane.dev/shared/xdstype"
)

// dnsMetadata is the node metadata that tells the xDS server the workload's DNS is captured
// (Istio's DNS_CAPTURE and DNS_AUTO_ALLOCATE), for the name table and for Envoy's listeners.
func (a *Agent) dnsMetadata(md map[string]any) {
	if !a.cfg.DNSCapture {
		return
	}
	md["DNS_CAPTURE"] = "true"
	if a.cfg.DNSAutoAllocate {
		md["DNS_AUTO_ALLOCATE"] = "true"
	}
}

// NameTable is the last name table the DNS proxy received; nil before the first, or without
// DNS capture.
func (a *Agent) NameTable() *ndsv1.NameTable {
	if a.dns == nil {
		return nil
	}
	return a.nameTable.Load()
}

// DNSAddr is the DNS proxy's address (UDP, and TCP on the same port) once it listens; nil
// before, or without DNS capture.
func (a *Agent) DNSAddr() net.Addr {
	if a.dns == nil {
		return nil
	}
	if addrs := a.dns.Addrs(); len(addrs) > 0 {
		return addrs[0]
	}
	return nil
}

// watchNameTable keeps a state-of-the-world ADS stream of its own to the xDS server asking
// for the name table, and hands each table to the DNS proxy. When the stream breaks it
// reconnects with backoff; the DNS proxy meanwhile answers from the table it has. Its own
// stream, rather than Envoy's through the xDS proxy, keeps DNS independent of Envoy's
// lifecycle (and working for workloads without Envoy).
func (a *Agent) watchNameTable(ctx context.Context) error {
	// The node names the workload by its identity's namespace, and over TLS the certificate
	// authenticates the stream: wait for it.
	var c *Credential
	select {
	case <-a.Ready():
		c = a.Current()
	case <-ctx.Done():
		return nil
	}
	creds := insecure.NewCredentials()
	if a.cfg.XDSOverTLS {
		creds = credentials.NewTLS(a.xdsTLS())
	}
	conn, err := grpc.NewClient(a.cfg.XDSAddress, append([]grpc.DialOption{grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(grpcserver.ClientKeepalive)}, a.deps.DialOptions...)...)
	if err != nil {
		return fmt.Errorf("xDS address %q: %w", a.cfg.XDSAddress, err)
	}
	defer conn.Close()
	w := a.workload(c)
	md := grpcbootstrap.NodeMetadata(w)
	a.dnsMetadata(md)
	mds, err := structpb.NewStruct(md)
	if err != nil {
		return fmt.Errorf("name table: node metadata: %w", err)
	}
	node := &corev3.Node{Id: grpcbootstrap.NodeID(a.nodeType(), w.IP, w.Pod, w.Namespace, w.DNSDomain), Metadata: mds}
	client := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
	b := grpcserver.Backoff{Initial: 200 * time.Millisecond, Max: 30 * time.Second}
	for {
		got, err := a.streamNameTable(ctx, client, node, w.Namespace)
		if ctx.Err() != nil {
			return nil
		}
		if got {
			b.Reset()
		}
		d := b.Next(err)
		a.log.Warn("name table stream ended; DNS answers from the last table", "err", err, "retry_in", d)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// streamNameTable runs one stream until it fails; got reports whether a table arrived.
func (a *Agent) streamNameTable(ctx context.Context, client discoveryv3.AggregatedDiscoveryServiceClient, node *corev3.Node,
	ns string) (got bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.StreamAggregatedResources(ctx)
	if err != nil {
		return false, err
	}
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: xdstype.NameTable}); err != nil {
		return false, err
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return got, errors.New("the xDS server ended the stream")
		}
		if err != nil {
			return got, err
		}
		ack := &discoveryv3.DiscoveryRequest{TypeUrl: xdstype.NameTable, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
		nt, err := nameTableOf(resp)
		if err != nil {
			// Keep the table we have and tell the server why this one is refused.
			a.log.Error("refusing a name table", "version", resp.GetVersionInfo(), "err", err)
			ack.VersionInfo = ""
			ack.ErrorDetail = status.New(codes.InvalidArgument, err.Error()).Proto()
		} else {
			a.nameTable.Store(nt)
			a.dns.Update(nt, ns)
			got = true
		}
		if err := stream.Send(ack); err != nil {
			return got, err
		}
	}
}

// nameTableOf reads the one name table of a response; a response without resources is an
// empty table.
func nameTableOf(resp *discoveryv3.DiscoveryResponse) (*ndsv1.NameTable, error) {
	if resp.GetTypeUrl() != xdstype.NameTable {
		return nil, fmt.Errorf("response of type %q, want %s", resp.GetTypeUrl(), xdstype.NameTable)
	}
	nt := &ndsv1.NameTable{}
	switch n := len(resp.GetResources()); n {
	case 0:
		return nt, nil
	case 1:
		if err := resp.GetResources()[0].UnmarshalTo(nt); err != nil {
			return nil, fmt.Errorf("name table: %w", err)
		}
		return nt, nil
	default:
		return nil, fmt.Errorf("%d name tables in one response, want one", n)
	}
}

// newDNSProxy is the DNS proxy of cfg, nil without DNS capture; obs counts its queries.
func newDNSProxy(cfg Config, deps Deps, obs dnsproxy.Observer) (*dnsproxy.Server, error) {
	if !cfg.DNSCapture {
		return nil, nil
	}
	if cfg.XDSAddress == "" {
		return nil, errors.New("agent: DNS capture gets its name table from the xDS server: set its address")
	}
	return dnsproxy.New(dnsproxy.Config{Addr: cfg.DNSAddr, ResolvConf: cfg.ResolvConf,
		UpstreamPort: cfg.DNSUpstreamPort, Logger: deps.Logger.With("component", "dns-proxy"), Observer: obs})
}
